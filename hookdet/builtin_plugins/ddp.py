"""Distributed data parallel training over ``torch.distributed``: the ``ddp`` plugin.

Switched on by ``plugins: [..., ddp]`` or automatically when ``hookdet run`` starts more than one
process (``resources.slots_per_trial > 1``). Each rank is a process started by torchrun, which
sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and friends; the plugin joins the
process group from them (gloo on CPU, nccl on CUDA) and then:

- answers ``hookdet_make_distributed`` with :class:`TorchDistributedContext`, whose object
  collectives carry the loop's metric reductions, the chief's epoch length and run directory, and
  every rank's RNG state into checkpoints;
- wraps each model in ``DistributedDataParallel``, with options from ``plugin_config.ddp``
  overridden by ``context.wrap_model(model, **options)`` (``find_unused_parameters``,
  ``static_graph``, ``broadcast_buffers``, ``bucket_cap_mb``, ... any DDP keyword). Checkpoints
  hold the unwrapped model, so no ``module.`` prefix ever appears;
- with ``optimizations.aggregation_frequency > 1``, runs the batches that only accumulate
  gradients under ``no_sync()``. DDP decides whether to all-reduce during the *forward* pass, so
  the whole ``train_batch`` is wrapped (a ``hookdet_train_batch`` wrapper), not just the backward;
- makes every rank stop at the same batch without a blocking collective per batch: after every
  batch the loop calls :meth:`TorchDistributedContext.any_rank_soon`, which *starts* an
  asynchronous all-reduce (max) of one integer, the stop flag, and returns the result of the one
  started after the previous batch, which has had a whole batch to complete. So a stop request
  or a signal on any rank stops every rank at the same batch, one batch after the batch during
  which it arrived (the latency: one batch; a request during the last batch before a reporting,
  validation, checkpoint or epoch boundary is honoured at that boundary, which agrees with a
  blocking all-reduce that also collects the flag still in flight). It runs on a CPU (gloo)
  group: a host-side message exchange that never waits for the GPU; its cost is measured by
  ``benchmarks/ddp_step_time.py``;
- keeps validation free of collectives inside the model: before validation the chief's buffers
  are broadcast once (what DDP's next forward would have done), then the DDP wrappers stop
  syncing buffers until training resumes. Ranks may therefore evaluate different numbers of
  batches, and ``evaluate_full_dataset`` may run the wrapped model on the chief alone.

Run with one process (no ``WORLD_SIZE`` above 1) the plugin steps aside: the model is not
wrapped and ``wrap_model`` options are accepted and ignored, so one trial runs both ways.
"""
from __future__ import annotations

import contextlib
import datetime
import inspect
import logging
import os
import sys
from typing import Any, Dict, Generator, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hookdet.distributed import DistributedContext
from hookdet.markers import hookimpl

logger = logging.getLogger("hookdet")

#: DDP keywords the plugin sets itself; a trial or experiment file may not.
_RESERVED_DDP_OPTIONS = ("module", "device_ids", "output_device", "process_group", "device_mesh")

#: Options of the plugin itself (``plugin_config.ddp``), beside DDP's keywords: the process
#: group's backend (default nccl with CUDA, else gloo) and its collective timeout in seconds.
PLUGIN_OPTIONS = ("backend", "timeout_seconds")

BACKENDS = ("gloo", "nccl", "mpi", "ucc")


def ddp_keyword_options() -> List[str]:
    """The keyword arguments of ``DistributedDataParallel`` that ``wrap_model`` may pass on."""
    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    return sorted(
        name
        for name, parameter in parameters.items()
        if name != "self"
        and name not in _RESERVED_DDP_OPTIONS
        and parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)
    )


def check_ddp_options(options: Dict[str, Any], where: str, also_allowed: Sequence[str] = ()) -> None:
    """Raise one ``TypeError`` naming every option in ``options`` DDP does not take.

    ``also_allowed`` names options the caller takes besides DDP's (listed in the message).
    """
    allowed = sorted([*ddp_keyword_options(), *also_allowed])
    reserved = sorted(name for name in options if name in _RESERVED_DDP_OPTIONS)
    if reserved:
        raise TypeError(
            f"{where}: {reserved} are set by the ddp plugin (from LOCAL_RANK and the process "
            "group) and cannot be given"
        )
    unknown = sorted(name for name in options if name not in allowed)
    if unknown:
        raise TypeError(
            f"{where}: no option(s) {unknown}; the options are {', '.join(allowed)} "
            "(DistributedDataParallel's keywords)"
        )


def launched_world_size() -> int:
    """The ``WORLD_SIZE`` a launcher (torchrun) gave this process; 1 when none did."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"WORLD_SIZE must be an integer, got {value!r}") from None


class TorchDistributedContext(DistributedContext):
    """Rank, size and object collectives over a ``torch.distributed`` process group.

    Object collectives (``allgather``, ``gather``, ``broadcast``) pickle Python objects. They and
    :meth:`any_rank` run on a gloo group, so they never touch the GPU: with nccl as the training
    backend a second, gloo, group is created for them.
    """

    def __init__(self, backend: str, owns_group: bool) -> None:
        size = dist.get_world_size()
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        rank = dist.get_rank()
        super().__init__(
            rank=rank,
            size=size,
            local_rank=int(os.environ.get("LOCAL_RANK", rank % local_size)),
            local_size=local_size,
            cross_rank=int(os.environ.get("GROUP_RANK", rank // local_size)),
            cross_size=max(1, size // local_size),
        )
        self.backend = backend
        self._owns_group = owns_group
        self._cpu_group = None if backend == "gloo" else dist.new_group(backend="gloo")
        self._flag = torch.zeros(1, dtype=torch.int32)
        # any_rank_soon's two flags, used in turn: one may be in flight while the other is set.
        self._soon_flags = (torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
        self._soon_calls = 0
        self._in_flight: Optional[Any] = None

    def allgather(self, obj: Any) -> List[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        gathered: List[Any] = [None] * self.size
        dist.all_gather_object(gathered, obj, group=self._cpu_group)
        return gathered

    def gather(self, obj: Any) -> Optional[List[Any]]:
        """Every rank's ``obj`` on the chief; None elsewhere."""
        gathered: Optional[List[Any]] = [None] * self.size if self.is_chief else None
        dist.gather_object(obj, gathered, dst=0, group=self._cpu_group)
        return gathered

    def broadcast(self, obj: Any) -> Any:
        """The chief's ``obj`` on every rank."""
        holder = [obj]
        dist.broadcast_object_list(holder, src=0, group=self._cpu_group)
        return holder[0]

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        dist.barrier(group=self._cpu_group)

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (an all-reduce of one CPU integer), or was at
        the last :meth:`any_rank_soon` call, whose agreement this collects."""
        earlier = self._collect_in_flight()
        self._flag.fill_(int(flag))
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._cpu_group)
        return earlier or bool(self._flag.item())

    def any_rank_soon(self, flag: bool) -> bool:
        """Start agreeing on ``flag`` (an asynchronous all-reduce, max) and return whether any
        rank's flag was true at the previous call (False at the first): no wait on the peers
        unless the previous agreement has not arrived after a whole batch."""
        tensor = self._soon_flags[self._soon_calls % 2]
        self._soon_calls += 1
        earlier = self._collect_in_flight()
        tensor.fill_(int(flag))
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._cpu_group, async_op=True)
        self._in_flight = (work, tensor)
        return earlier

    def _collect_in_flight(self) -> bool:
        if self._in_flight is None:
            return False
        work, tensor = self._in_flight
        self._in_flight = None
        work.wait()
        return bool(tensor.item())

    def close(self) -> None:
        """Leave the process group (destroying it when this plugin created it).

        Not collective: a rank that failed must be able to leave without waiting for the others.
        """
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()


class DDPPlugin:
    """``torch.distributed`` + ``DistributedDataParallel``; see the module docstring."""

    conflicts_with = ("horovod",)

    def __init__(self, options: Optional[Dict[str, Any]] = None) -> None:
        options = dict(options or {})
        self.backend: Optional[str] = options.pop("backend", None)
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        timeout = options.pop("timeout_seconds", None)
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout_seconds must be a positive number, got {timeout!r}")
        self.timeout_seconds: Optional[float] = timeout
        check_ddp_options(options, "plugin_config.ddp", also_allowed=PLUGIN_OPTIONS)
        self.ddp_options = options
        self.distributed: Optional[TorchDistributedContext] = None
        self.ddp_models: List[DistributedDataParallel] = []
        self._forward_sync_before_validation: List[bool] = []

    # ------------------------------------------------------------------ process group

    @hookimpl
    def hookdet_make_distributed(self, run: Any) -> Optional[DistributedContext]:
        """Join the process group torchrun described; None (one process) when not launched."""
        if launched_world_size() <= 1:
            logger.info("ddp: one process (no WORLD_SIZE above 1); models are not wrapped")
            return None
        owns_group = not dist.is_initialized()
        if owns_group:
            backend = self.backend or ("nccl" if torch.cuda.is_available() else "gloo")
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            kwargs: Dict[str, Any] = {"backend": backend}
            if self.timeout_seconds is not None:
                kwargs["timeout"] = datetime.timedelta(seconds=self.timeout_seconds)
            dist.init_process_group(**kwargs)
        backend = str(dist.get_backend())
        self.distributed = TorchDistributedContext(backend, owns_group)
        aggregation = int(run.config.optimizations.aggregation_frequency)
        if aggregation > 1:
            run.plugins.register("ddp.no_sync", _AccumulateWithoutSync(self, aggregation))
        logger.info(
            "ddp: rank %d of %d (local rank %d), backend %s",
            self.distributed.rank, self.distributed.size, self.distributed.local_rank, backend,
        )
        return self.distributed

    @hookimpl(trylast=True)
    def hookdet_unconfigure(self, run: Any) -> None:
        """On a clean exit, wait for every rank before the process group is torn down.

        Ranks that tear down gloo while a peer still talks to it can abort at exit. The wait is
        skipped while an exception is on its way out (``hookdet_unconfigure`` fires in
        ``init()``'s ``finally``, where ``sys.exc_info()`` shows it): a failed rank must leave at
        once, not wait for peers that may be stuck in a collective with it.
        """
        if self.distributed is not None and sys.exc_info()[0] is None:
            self.distributed.barrier()

    # ------------------------------------------------------------------ wrapping

    @hookimpl
    def hookdet_wrap_model(
        self, model: torch.nn.Module, context: Any, options: Dict[str, Any]
    ) -> torch.nn.Module:
        """``DistributedDataParallel(model)`` with the experiment's and the trial's options."""
        check_ddp_options(options, "wrap_model")
        model = model.to(context.device)
        if self.distributed is None or self.distributed.size <= 1:
            return model
        if not any(parameter.requires_grad for parameter in model.parameters()):
            return model  # nothing to synchronise; DDP refuses such a module
        merged = {**self.ddp_options, **options}
        if context.device.type == "cuda":
            merged.update(device_ids=[context.device.index], output_device=context.device.index)
        wrapped = DistributedDataParallel(model, **merged)
        self.ddp_models.append(wrapped)
        return wrapped

    # ------------------------------------------------------------------ validation

    @hookimpl
    def on_validation_start(self) -> None:
        """Bring the chief's buffers to every rank once, then keep the forward pass local."""
        self._forward_sync_before_validation = []
        for model in self.ddp_models:
            self._forward_sync_before_validation.append(model.require_forward_param_sync)
            if model.will_sync_module_buffers():
                works = [
                    dist.broadcast(buffer, src=0, group=model.process_group, async_op=True)
                    for buffer in model.modules_buffers
                ]
                for work in works:
                    work.wait()
            model.require_forward_param_sync = False

    @hookimpl
    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        """Let the next training forward pass sync buffers as it would have."""
        for model, previous in zip(self.ddp_models, self._forward_sync_before_validation):
            model.require_forward_param_sync = previous
        self._forward_sync_before_validation = []


class _AccumulateWithoutSync:
    """Runs batches that only accumulate gradients under every DDP model's ``no_sync()``.

    Registered (as ``ddp.no_sync``) only when ``aggregation_frequency > 1`` under distribution,
    so ordinary runs pay nothing per batch for it.
    """

    def __init__(self, plugin: DDPPlugin, aggregation_frequency: int) -> None:
        self._plugin = plugin
        self._aggregation_frequency = aggregation_frequency

    @hookimpl(wrapper=True)
    def hookdet_train_batch(
        self, trial: Any, batch: Any, epoch_idx: int, batch_idx: int
    ) -> Generator[None, Any, Any]:
        """Skip the gradient all-reduce unless this batch ends an aggregation window."""
        step_batch = (batch_idx + 1) % self._aggregation_frequency == 0
        if step_batch or not self._plugin.ddp_models:
            return (yield)
        with contextlib.ExitStack() as stack:
            for model in self._plugin.ddp_models:
                stack.enter_context(model.no_sync())
            return (yield)
