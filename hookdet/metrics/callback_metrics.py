"""The metrics the hooks named after ``PyTorchCallback`` methods receive: Determined's types and
shapes, so a callback written for Determined (``metrics["loss"].item()``, ``outputs[0]["x"].shape``)
runs unchanged.

Determined turns every tensor a trial returns into a numpy array (``tensor.cpu().numpy()``: the
tensor's dtype, a 0-d array for a scalar) and computes with numpy in that dtype:

- ``on_training_workload_end(avg_metrics, batch_metrics)``: ``batch_metrics`` as ``train_batch``
  returned them, tensors as arrays (across ranks, each batch's mean over the ranks: a 0-d array
  for array values, a numpy scalar for plain numbers); ``avg_metrics`` the mean over the
  workload's batches as a Python float (``None`` where values cannot be averaged), the training
  ``MetricReducer`` results, and ``batches`` and ``epochs`` unless a metric has these names.
- ``on_validation_epoch_end(outputs)``: ``evaluate_batch``'s dicts, tensors as arrays.
- ``on_validation_end(metrics)``: numpy scalars reduced by ``evaluation_reducer()`` (in the values'
  dtype on one process; across ranks a weighted average of the ranks' values, so ``float64``),
  plus the validation ``MetricReducer`` results, tensors as arrays.

The numbers written to the run's history, TensorBoard and every other sink come from
:mod:`hookdet.metrics.workload_metrics` instead: plain Python, averaged in float64.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np
import torch

from hookdet.metrics.reducers import Allgather, Reducer

#: Tensor dtypes numpy has no type for; their values reach callbacks as float32 arrays.
_WIDENED = {torch.bfloat16: torch.float32}


def as_numpy(value: Any) -> Any:
    """``value`` with a tensor turned into the numpy array Determined makes of it."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        return value.to(_WIDENED.get(value.dtype, value.dtype)).cpu().numpy()
    return value


def batches_as_numpy(batch_metrics: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each batch's metrics with tensors as numpy arrays, in new dicts.

    One device-to-host copy per metric where its tensors share device, dtype and shape (the
    usual case), else one per value.
    """
    converted = [dict(metrics) for metrics in batch_metrics]
    if not converted:
        return converted
    for name in converted[0]:
        values = [metrics.get(name) for metrics in converted]
        stacked = _stacked_on_host(values)
        if stacked is not None:
            for position, metrics in enumerate(converted):
                metrics[name] = stacked[position, ...]
            continue
        for metrics in converted:
            if name in metrics:
                metrics[name] = as_numpy(metrics[name])
    return converted


def _stacked_on_host(values: Sequence[Any]) -> np.ndarray | None:
    """``values`` stacked into one host array when all are tensors alike; else None."""
    first = values[0]
    if not isinstance(first, torch.Tensor):
        return None
    alike = all(
        isinstance(value, torch.Tensor)
        and value.dtype == first.dtype
        and value.device == first.device
        and value.shape == first.shape
        for value in values
    )
    return as_numpy(torch.stack(list(values))) if alike else None


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def training_workload(
    batch_metrics: Sequence[Mapping[str, Any]],
    reducer_results: Mapping[str, Any],
    batches_trained: int,
    epochs_trained: int,
    allgather: Allgather,
    world_size: int,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(avg_metrics, batch_metrics)`` for ``on_training_workload_end``, the same on every rank.

    ``batch_metrics`` are this rank's ``train_batch`` dicts (names already checked alike across
    batches and ranks); with several ranks they are gathered, one allgather.
    """
    numpy_batches = batches_as_numpy(batch_metrics)
    if world_size > 1:
        numpy_batches = _averaged_across_ranks(allgather(numpy_batches))
    averages: dict[str, Any] = {
        name: _workload_mean([metrics[name] for metrics in numpy_batches])
        for name in (numpy_batches[0] if numpy_batches else {})
    }
    averages.update({name: as_numpy(value) for name, value in reducer_results.items()})
    averages.setdefault("batches", batches_trained)
    averages.setdefault("epochs", epochs_trained)
    return averages, numpy_batches


def _averaged_across_ranks(ranks_batches: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each batch's metrics averaged over the ranks that ran it (``None`` values left out)."""
    contributing = [batches for batches in ranks_batches if batches]
    if not contributing:
        return []
    averaged = []
    for position in range(max(len(batches) for batches in contributing)):
        ranks = [batches[position] for batches in contributing if position < len(batches)]
        averaged.append({name: _mean_of_ranks([metrics[name] for metrics in ranks]) for name in ranks[0]})
    return averaged


def _mean_of_ranks(values: list[Any]) -> Any:
    """One batch's value across ranks, as Determined averages it: an array stays a (0-d) array."""
    stacked = np.array(values)
    mean = _quiet(lambda: np.mean(stacked[stacked != None]))  # noqa: E711
    return np.array(mean) if isinstance(values[0], np.ndarray) else mean


def _workload_mean(values: list[Any]) -> float | None:
    """A metric's mean over the workload's batches as a Python float; None if not averageable."""
    try:
        stacked = np.array(values)
        return _quiet(lambda: np.mean(stacked[stacked != None]).item())  # noqa: E711
    except (TypeError, ValueError):
        return None


def _quiet(compute: Callable[[], Any]) -> Any:
    """``compute()`` without numpy's warnings (the mean of nothing is NaN, as in Determined)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return compute()


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def validation_metrics(
    numpy_outputs: Sequence[Mapping[str, Any]],
    reducer_by_metric: Mapping[str, Reducer],
    reducer_results: Mapping[str, Any],
    allgather: Allgather,
    world_size: int,
) -> dict[str, Any]:
    """``metrics`` for ``on_validation_end``: ``numpy_outputs`` (this rank's, from
    :func:`batches_as_numpy`) reduced across ranks by ``reducer_by_metric``, one allgather when
    there are several ranks; the same on every rank."""
    local = {
        name: _reduce(choice, np.stack([metrics[name] for metrics in numpy_outputs], axis=0))
        for name, choice in reducer_by_metric.items()
    } if numpy_outputs else {}
    if world_size == 1:
        metrics = local
    else:
        ranks = [(values, count) for values, count in allgather((local, len(numpy_outputs))) if count]
        counts = [count for _, count in ranks]
        metrics = {
            name: _reduce(choice, [values[name] for values, _ in ranks], counts)
            for name, choice in reducer_by_metric.items()
        } if ranks else {}
    metrics.update({name: as_numpy(value) for name, value in reducer_results.items()})
    return metrics


def _reduce(choice: Reducer, values: Any, weights: list[int] | None = None) -> Any:
    """One metric reduced as Determined's ``_simple_reduce_metrics`` does, in numpy."""
    if choice is Reducer.AVG:
        return np.average(values, weights=weights)
    if choice is Reducer.SUM:
        return np.sum(values)
    if choice is Reducer.MAX:
        return np.max(values)
    return np.min(values)
