"""Data parallel training through Horovod: the ``horovod`` plugin.

Switched on by ``plugins: [..., horovod]``; the ranks are started by ``horovodrun -np N`` (or by
``hookdet run`` with ``slots_per_trial: N``, which then calls horovodrun). The trial is written
exactly as for ``ddp``; the plugin:

- answers ``hookdet_make_distributed`` with :class:`HorovodDistributedContext` (``hvd.init()``;
  object collectives through ``hvd.allgather_object``/``hvd.broadcast_object``). The experiment
  file's ``optimizations.tensor_fusion_threshold`` (MB) and ``tensor_fusion_cycle_time`` (ms)
  become ``HOROVOD_FUSION_THRESHOLD``/``HOROVOD_CYCLE_TIME`` unless those are already set;
- wraps each optimizer in ``hvd.DistributedOptimizer`` with the models' parameter names,
  ``backward_passes_per_step = wrap_optimizer's backward_passes_per_step x
  aggregation_frequency`` (Horovod then all-reduces only on the batch that ends an aggregation
  window) and fp16 compression when ``optimizations.gradient_compression`` is true;
- broadcasts the chief's parameters (and optimizer state, when there is any: a resumed run)
  before the first batch, so every rank starts from the same point;
- makes the gradients final in ``hookdet_prepare_gradients`` (``optimizer.synchronize()``, before
  any loss-scaler unscaling, averaging or clipping) and wraps the optimizer step in
  ``optimizer.skip_synchronize()`` so the step never all-reduces a second time;
- stops every rank at the same batch: the loop reads stop requests through
  :meth:`HorovodDistributedContext.any_rank`, a one-integer ``hvd.allreduce`` (max) on the CPU.

Horovod is an optional dependency (``scripts/build_horovod.sh`` builds it against the installed
torch); it is imported when the plugin configures a run, so the plugin can be listed, and refused
beside ``ddp``, without it.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, Generator, List, Optional

import torch

from hookdet.plugin import DistributedContext, HorovodDistributedContext, hookimpl

logger = logging.getLogger("hookdet")


def import_horovod() -> Any:
    """``horovod.torch``, or one clear error saying how to get it."""
    try:
        import horovod.torch as hvd
    except ImportError as error:
        raise ImportError(
            "the horovod plugin needs Horovod with PyTorch support (horovod.torch); build it "
            f"against the installed torch with scripts/build_horovod.sh ({error})"
        ) from error
    return hvd


class HorovodPlugin:
    """Horovod's DistributedOptimizer behind the trial API; see the module docstring."""

    conflicts_with = ("ddp",)

    def __init__(self) -> None:
        self.hvd: Any = None
        self.distributed: Optional[HorovodDistributedContext] = None
        self._run: Any = None

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Import Horovod (refusing the run without it) and pass on the fusion settings."""
        self.hvd = import_horovod()
        self._run = run
        optimizations = run.config.optimizations
        os.environ.setdefault(
            "HOROVOD_FUSION_THRESHOLD", str(int(optimizations.tensor_fusion_threshold) * 1024 * 1024)
        )
        os.environ.setdefault("HOROVOD_CYCLE_TIME", str(optimizations.tensor_fusion_cycle_time))

    @hookimpl
    def hookdet_make_distributed(self, run: Any) -> DistributedContext:
        """``hvd.init()`` and the context over it (a world of one outside horovodrun)."""
        self.hvd.init()
        self.distributed = HorovodDistributedContext(self.hvd)
        logger.info(
            "horovod: rank %d of %d (local rank %d)",
            self.distributed.rank, self.distributed.size, self.distributed.local_rank,
        )
        return self.distributed

    @hookimpl
    def hookdet_wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        context: Any,
        backward_passes_per_step: int,
        options: Dict[str, Any],
    ) -> torch.optim.Optimizer:
        """``hvd.DistributedOptimizer`` around ``optimizer``; fp16 compression when
        ``wrap_optimizer(fp16_compression=True)`` or, by default, ``gradient_compression``."""
        options = dict(options)
        fp16_compression = options.pop("fp16_compression", None)
        if options:
            raise TypeError(f"wrap_optimizer: the horovod plugin takes no options, got {sorted(options)}")
        optimizations = self._run.config.optimizations
        if fp16_compression is None:
            fp16_compression = optimizations.gradient_compression
        compression = self.hvd.Compression.fp16 if fp16_compression else self.hvd.Compression.none
        return self.hvd.DistributedOptimizer(
            optimizer,
            named_parameters=_named_parameters(optimizer, context.unwrapped_models),
            backward_passes_per_step=backward_passes_per_step * int(optimizations.aggregation_frequency),
            compression=compression,
        )

    @hookimpl
    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
        """Start every rank from the chief's parameters and optimizer state."""
        context = self._run.context
        for model in context.unwrapped_models:
            self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for optimizer in context.optimizers:
            # Horovod "initialises" an empty optimizer state with a zero-gradient step, which
            # changes weight-decayed weights and Adam's step count; an empty state is identical
            # on every rank anyway (each built the same optimizer), so only a resumed one is sent.
            if self.distributed.broadcast(bool(optimizer.state_dict()["state"])):
                self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    @hookimpl(tryfirst=True)
    def hookdet_prepare_gradients(self, optimizer: torch.optim.Optimizer, context: Any) -> None:
        """Wait for the gradient all-reduces (before a scaler unscales or clipping reads them)."""
        if hasattr(optimizer, "synchronize"):
            optimizer.synchronize()

    @hookimpl(wrapper=True)
    def hookdet_step_optimizer(
        self, optimizer: torch.optim.Optimizer, context: Any, scaler: Any
    ) -> Generator[None, Any, Any]:
        """Step without a second all-reduce (the gradients were synchronized already)."""
        if not hasattr(optimizer, "skip_synchronize"):
            return (yield)
        with optimizer.skip_synchronize():
            return (yield)


def _named_parameters(optimizer: torch.optim.Optimizer, models: List[torch.nn.Module]) -> List[Any]:
    """A unique name for every parameter ``optimizer`` steps: ``model<i>.<name>`` for those of a
    wrapped model, ``group<g>.<j>`` for any other (Horovod needs all of them named)."""
    names: Dict[int, str] = {}
    for index, model in enumerate(models):
        for name, parameter in model.named_parameters():
            names.setdefault(id(parameter), f"model{index}.{name}")
    named = []
    for group_index, group in enumerate(optimizer.param_groups):
        for position, parameter in enumerate(group["params"]):
            named.append((names.get(id(parameter), f"group{group_index}.{position}"), parameter))
    return named
