"""hookdet's own answers to the provider and step hooks, tried after every plugin's.

Registered by the plugin manager itself (not an entry point, cannot be removed): this is what
happens when no plugin has a better idea — one process, the model
on the run's device, the optimizer stepped by the run's precision.
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from hookdet.distributed.context import DistributedContext, DummyDistributedContext
from hookdet.markers import hookimpl


@hookimpl(trylast=True)
def hookdet_make_distributed(run: Any) -> DistributedContext:
    """A single process."""
    return DummyDistributedContext()


@hookimpl(trylast=True)
def hookdet_wrap_model(model: torch.nn.Module, context: Any, options: Dict[str, Any]) -> torch.nn.Module:
    """The model moved to the run's device."""
    if options:
        raise TypeError(
            f"wrap_model got options {sorted(options)} but no plugin takes them "
            "(they are for a distributed plugin such as ddp)"
        )
    return model.to(context.device)


@hookimpl(trylast=True)
def hookdet_wrap_optimizer(
    optimizer: torch.optim.Optimizer, context: Any, backward_passes_per_step: int, options: Dict[str, Any]
) -> torch.optim.Optimizer:
    """The optimizer itself."""
    return optimizer


@hookimpl(trylast=True)
def hookdet_train_batch(trial: Any, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
    """The trial's own ``train_batch``."""
    return trial.train_batch(batch, epoch_idx, batch_idx)


@hookimpl(trylast=True)
def hookdet_step_optimizer(optimizer: torch.optim.Optimizer, context: Any, scaler: Any) -> bool:
    """The run's precision steps (through the trial's scaler when it passed one, else
    ``optimizer.step()`` in float32)."""
    context.precision.step(optimizer, context, scaler)
    return True
