"""The arithmetic of the training loop's schedule and batches: where the next boundary of a
period falls, whether a period ends at a batch count, how many batches the chief validates, and a
``train_batch`` result as the loop keeps it (its tensors cut from the graph, once per batch).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from hookdet.data.loader import DataLoader
from hookdet.trial_api.trial import Batch, Epoch, TrainUnit, TrialError

def chief_validation_length(loader: Any, ranks: int) -> Optional[int]:
    """Batches the chief validates per pass (a hookdet DataLoader's batches are dealt round-robin
    to the ranks, the chief's share the largest), or None for a loader without a length."""
    try:
        length = len(loader)
    except TypeError:
        return None
    return -(-length // ranks) if isinstance(loader, DataLoader) else length


def batches_at_next_boundary(periods: Tuple[Optional[TrainUnit], ...], batches: int, max_batches: int) -> int:
    """The smallest batch count above ``batches`` at which a ``Batch`` period in ``periods`` can
    fire, or ``max_batches`` if sooner. ``Epoch`` periods fire only at epoch ends, which the loop
    checks on its own; an unknown kind of period gives ``batches + 1`` (check every batch)."""
    boundary = max_batches
    for period in periods:
        if period is None or isinstance(period, Epoch):
            continue
        if not isinstance(period, Batch):
            return batches + 1
        if isinstance(period.value, int):
            boundary = min(boundary, (batches // period.value + 1) * period.value)
        else:
            later = [value for value in period.value if value > batches]
            if later:
                boundary = min(boundary, min(later))
    return boundary


def reached(period: Optional[TrainUnit], batches: int, epoch_ended: bool, epoch_length: int) -> bool:
    """Whether ``batches`` trained batches end a ``period`` (epochs count only at epoch ends)."""
    if period is None:
        return False
    if isinstance(period, Epoch):
        return epoch_ended and period.should_stop(batches // epoch_length)
    return period.should_stop(batches)


def as_metrics_dict(metrics: Any) -> Dict[str, Any]:
    """``train_batch``'s result as a new dict whose tensors hold no graph (a bare tensor is the loss).

    Cutting the graph keeps a metric that was never backpropagated from holding its activations
    alive until the report. ``Tensor.data`` cuts it as ``detach()`` does (same storage, no
    ``grad_fn``, no copy) without a trip through the dispatcher: inside a real step that trip
    costs about 1 % of a tiny model's step, ``.data`` next to nothing. What ``.data`` leaves
    out, a version counter shared with the original, matters only to autograd, and these
    tensors are only ever read. A plain loop, not a comprehension: this runs every batch, and
    a comprehension costs a function object and a frame per call.
    """
    if isinstance(metrics, dict):
        plain = {}
        for key, value in metrics.items():
            plain[key] = value.data if isinstance(value, torch.Tensor) else value
        return plain
    if isinstance(metrics, torch.Tensor):
        return {"loss": metrics.data}
    raise TrialError(
        "train_batch must return a dict of metrics or a loss tensor, "
        f"got {type(metrics).__name__}"
    )
