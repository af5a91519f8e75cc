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
  ``static_graph``, ``broadcast_buffers``, ``bucket_cap_mb``, ... any DDP keyword). As with
  Determined's wrapper, reading an attribute the wrapper lacks reads the wrapped module's
  (``self.model.fc``, ``self.model.weight``). Checkpoints hold the unwrapped model, so no
  ``module.`` prefix ever appears;
- with ``optimizations.aggregation_frequency > 1``, runs the batches that only accumulate
  gradients under ``no_sync()``. DDP decides whether to all-reduce during the *forward* pass, so
  the whole ``train_batch`` is wrapped (a ``hookdet_train_batch`` wrapper), not just the backward;
- makes every rank stop at the same batch without a blocking collective per batch: the loop's
  per-batch stop check is :meth:`TorchDistributedContext.any_rank_soon`, an asynchronous
  all-reduce on a gloo group of its own, started about every 0.2 s of training and collected
  when the next starts (:mod:`hookdet.distributed.stop_agreement`). A stop request or a signal
  on any rank stops every rank after the same batch, within half a second of training (one batch
  for batches of 0.2 s or more), or at once at a reporting, validation, checkpoint or epoch
  boundary. Its cost is measured by ``benchmarks/ddp_step_time.py``;
- keeps validation free of collectives inside the model: before validation the chief's buffers
  are broadcast once (what DDP's next forward would have done), then the DDP wrappers stop
  syncing buffers until training resumes. Ranks may therefore evaluate different numbers of
  batches, and ``evaluate_full_dataset`` may run the wrapped model on the chief alone.

A script that joined the process group itself and passes
``det.core.DistributedContext.from_torch_distributed()`` to ``pytorch.init(distributed=...)``
(Determined's local-distributed recipe) keeps its context; the plugin adopts it and wraps models
the same way.

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
from typing import Any, Dict, Generator, List, Literal, Optional, Sequence

import pydantic
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hookdet.plugin import DistributedContext, TorchDistributedContext, hookimpl, options_for, rank_device

logger = logging.getLogger("hookdet")

#: DDP keywords the plugin sets itself; a trial or experiment file may not.
_RESERVED_DDP_OPTIONS = ("module", "device_ids", "output_device", "process_group", "device_mesh")

#: Options of the plugin itself (``plugin_config.ddp``), beside DDP's keywords: the process
#: group's backend (default nccl with CUDA, else gloo), its collective timeout in seconds, and
#: after how many seconds ``hookdet run``'s launcher names a rank that stopped answering (it
#: reads the option itself: :mod:`hookdet.distributed.rank_watch`).
PLUGIN_OPTIONS = ("backend", "timeout_seconds", "silent_rank_seconds")


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


class PassThroughDistributedDataParallel(DistributedDataParallel):
    """``DistributedDataParallel`` whose missing attributes are read from the wrapped module.

    Determined's ``wrap_model`` returns such a wrapper, and trials rely on it
    (``self.model.fc``, ``self.generator.latent_dim``). Only reads pass through; DDP's own
    attributes (``module``, ``no_sync``, ...) win over the module's.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":  # not set yet (inside DDP's constructor): nothing to pass to
                raise
            return getattr(self.module, name)


def _declared_options() -> type:
    """``plugin_config.ddp``: the plugin's own options, then every keyword of this torch's
    ``DistributedDataParallel`` (read from its signature, with its defaults)."""
    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    fields: Dict[str, Any] = {
        "backend": (Optional[Literal["gloo", "nccl", "mpi", "ucc"]], pydantic.Field(
            None, description="the process group's backend (default nccl with CUDA, else gloo)")),
        "timeout_seconds": (Optional[float], pydantic.Field(
            None, gt=0, description="the process group's collective timeout")),
        "silent_rank_seconds": (float, pydantic.Field(
            60.0, gt=0, description="seconds before hookdet run names a rank that stopped answering")),
    }
    for name in ddp_keyword_options():
        default = parameters[name].default
        fields[name] = (Any, pydantic.Field(
            None if default is inspect.Parameter.empty else default, description="DistributedDataParallel's"))
    config = pydantic.ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    return pydantic.create_model("DDPOptions", __config__=config, **fields)


class DDPPlugin:
    """``torch.distributed`` + ``DistributedDataParallel``; see the module docstring."""

    conflicts_with = ("horovod",)
    Options = _declared_options()

    def __init__(self, options: Any = None) -> None:
        declared = options_for(DDPPlugin, options, "ddp")
        self.backend: Optional[str] = declared.backend
        self.timeout_seconds: Optional[float] = declared.timeout_seconds
        #: The DDP keywords the experiment file set (the rest keep DDP's own defaults).
        self.ddp_options = {
            name: value for name, value in declared.model_dump(exclude_unset=True).items() if name not in PLUGIN_OPTIONS
        }
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
        if run.distributed is not None:  # the script's own, given to pytorch.init(distributed=)
            if not isinstance(run.distributed, TorchDistributedContext):
                return None
            self.distributed = run.distributed
        else:
            self.distributed = self._join_process_group()
        backend = self.distributed.backend
        aggregation = int(run.config.optimizations.aggregation_frequency)
        if aggregation > 1:
            run.plugins.register("ddp.no_sync", _AccumulateWithoutSync(self, aggregation))
        logger.info(
            "ddp: rank %d of %d (local rank %d), backend %s",
            self.distributed.rank, self.distributed.size, self.distributed.local_rank, backend,
        )
        return self.distributed

    def _join_process_group(self) -> TorchDistributedContext:
        owns_group = not dist.is_initialized()
        if owns_group:
            backend = self.backend or ("nccl" if torch.cuda.is_available() else "gloo")
            if backend == "nccl":
                torch.cuda.set_device(rank_device(int(os.environ.get("LOCAL_RANK", "0"))))
            kwargs: Dict[str, Any] = {"backend": backend}
            if self.timeout_seconds is not None:
                kwargs["timeout"] = datetime.timedelta(seconds=self.timeout_seconds)
            dist.init_process_group(**kwargs)
        return TorchDistributedContext(str(dist.get_backend()), owns_group)

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
        wrapped = PassThroughDistributedDataParallel(model, **merged)
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
