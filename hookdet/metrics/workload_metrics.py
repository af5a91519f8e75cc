"""A workload's metrics reduced with Determined's semantics: ``evaluate_batch`` outputs by
``evaluation_reducer()`` (``Reducer.AVG`` weighted by batches across ranks), ``train_batch`` outputs
averaged across ranks per batch and over the workload.

The loop hands this module what the trial produced during one workload and gets back the numbers it
reports; each reduction calls ``allgather`` once on every rank (see :mod:`hookdet.metrics.reducers`).
Metric tensors stay on their device through the workload and move to the host here, once per
metric (:mod:`hookdet.metrics.metric_values`).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from hookdet.metrics.metric_values import (
    check_same_names_across_ranks,
    describe_value,
    metric_names,
    workload_metric_to_host,
)
from hookdet.metrics.reducers import Allgather, MetricError, Reducer, gather_from_all_ranks, single_process_allgather

# ---------------------------------------------------------------------------------------------
# Validation: evaluate_batch outputs, reduced by evaluation_reducer()
# ---------------------------------------------------------------------------------------------


class _ValidationStats(NamedTuple):
    """One rank's summary of one validation metric over its batches (all elements of all values)."""

    mean: float
    total: float
    maximum: float
    minimum: float


def _check_reducer_choice(reducer: Any) -> None:
    """Validate ``evaluation_reducer()``'s return value: a Reducer or a dict of them."""
    if isinstance(reducer, Reducer):
        return
    if isinstance(reducer, Mapping):
        for metric, choice in reducer.items():
            if not isinstance(choice, Reducer):
                raise MetricError(
                    f"evaluation_reducer() maps metric {metric!r} to {choice!r}; each value must "
                    "be a hookdet.pytorch.Reducer (AVG, SUM, MAX or MIN)"
                )
        return
    raise MetricError(
        f"evaluation_reducer() must return a Reducer or a dict of metric name to Reducer, not "
        f"{describe_value(reducer)}"
    )


def reducer_for_each_metric(
    reducer: Reducer | Mapping[str, Reducer], names: list[str]
) -> dict[str, Reducer]:
    """Resolve ``evaluation_reducer()`` into one Reducer per metric, as Determined requires.

    A dict must name exactly the metrics ``evaluate_batch`` returned: no more, no fewer.
    """
    if isinstance(reducer, Reducer):
        return {name: reducer for name in names}
    missing = [name for name in names if name not in reducer]
    if missing:
        raise MetricError(
            f"evaluation_reducer() returned a dict with no reducer for validation metric(s) "
            f"{missing}; provide a reducer for every metric evaluate_batch returns "
            f"({names}) or return a single Reducer"
        )
    unknown = [name for name in reducer if name not in names]
    if unknown:
        raise MetricError(
            f"evaluation_reducer() names metric(s) {unknown} that evaluate_batch did not return "
            f"(it returned {names})"
        )
    return {name: reducer[name] for name in names}


def reduce_validation_metrics(
    batch_metrics: Sequence[Mapping[str, Any]],
    num_batches_per_rank: int | None = None,
    reducer: Reducer | Mapping[str, Reducer] = Reducer.AVG,
    allgather: Allgather = single_process_allgather,
) -> dict[str, float]:
    """Reduce this rank's ``evaluate_batch`` outputs, across all ranks, to one float per metric.

    ``batch_metrics`` holds this rank's dicts, one per validation batch, and
    ``num_batches_per_rank`` the number of batches this rank evaluated (``None``: their count; a
    different number is an error, since it means some batches' metrics went missing). ``reducer``
    is ``evaluation_reducer()``'s answer: one :class:`Reducer` for all metrics or a dict naming
    every metric. Values may be Python or numpy numbers, tensors on any device, or arrays; as in
    Determined, an array-valued metric is reduced over all its elements to one number (each
    batch's value must have the same shape). ``AVG`` equals the mean over every batch of every
    rank; ``SUM``, ``MAX`` and ``MIN`` act over all values of all ranks. A rank with no batches
    contributes nothing. Returns ``{}`` when no rank evaluated a batch.
    """
    _check_reducer_choice(reducer)
    gathered = gather_from_all_ranks(
        lambda: _validation_summary(batch_metrics, num_batches_per_rank), allgather, what="validation metrics"
    )
    names = check_same_names_across_ranks([names for _, names, _ in gathered], "evaluate_batch")
    if not names:
        return {}
    reducer_by_metric = reducer_for_each_metric(reducer, names)
    contributing = [(count, summaries) for count, _, summaries in gathered if count > 0]
    counts = np.array([count for count, _ in contributing], dtype=np.float64)
    reduced = {}
    for name in names:
        stats = [summaries[name] for _, summaries in contributing]
        choice = reducer_by_metric[name]
        if choice is Reducer.AVG:
            value = np.average([s.mean for s in stats], weights=counts)
        elif choice is Reducer.SUM:
            value = np.sum([s.total for s in stats])
        elif choice is Reducer.MAX:
            value = np.max([s.maximum for s in stats])
        else:
            value = np.min([s.minimum for s in stats])
        reduced[name] = float(value)
    return reduced


def _validation_summary(
    batch_metrics: Sequence[Mapping[str, Any]], num_batches_per_rank: int | None
) -> tuple[int, list[str] | None, dict]:
    """This rank's part of a validation: its batch count, metric names and per-metric stats."""
    if num_batches_per_rank is not None and num_batches_per_rank != len(batch_metrics):
        raise MetricError(
            f"reduce_validation_metrics() was told this rank evaluated {num_batches_per_rank} "
            f"batches but was given metrics for {len(batch_metrics)}"
        )
    if not batch_metrics:
        return 0, None, {}
    names = metric_names(batch_metrics, "evaluate_batch", first_batch_idx=0)
    summaries = {}
    for name in names:
        values, _ = workload_metric_to_host(
            [metrics[name] for metrics in batch_metrics], name, "evaluate_batch", first_batch_idx=0, allow_none=False,
        )
        summaries[name] = _ValidationStats(float(values.mean()), float(values.sum()), float(values.max()), float(values.min()))
    return len(batch_metrics), names, summaries


# ---------------------------------------------------------------------------------------------
# Training: train_batch outputs, averaged
# ---------------------------------------------------------------------------------------------


def average_training_metrics(
    batch_metrics: Sequence[Mapping[str, Any]],
    allgather: Allgather = single_process_allgather,
    *,
    first_batch_idx: int = 0,
) -> dict[str, float | None]:
    """The workload's training metrics: each batch's values averaged across the ranks that ran
    it, then the unweighted mean over the workload's batches; ``None`` for a metric no rank
    reported a value for.

    Each value must be a number (a Python or numpy number, or a one-element tensor or array, on
    any device), an array of numbers of the same shape in every batch (averaged over all its
    elements, and across ranks per batch to one number, as Determined does), or ``None`` for
    "not measured in this batch" (left out of the averages, as Determined does).
    ``first_batch_idx`` is the trial's index of the workload's first batch, used to name the
    culprit batch in errors. When ranks ran different numbers of batches, batch ``i`` averages
    the ranks that ran it.
    """

    def local_values() -> tuple[int, list[str] | None, dict]:
        if not batch_metrics:
            return 0, None, {}
        names = metric_names(batch_metrics, "train_batch", first_batch_idx)
        per_metric: dict[str, Any] = {}
        for name in names:
            host_values, positions = workload_metric_to_host(
                list(map(operator.itemgetter(name), batch_metrics)),
                name,
                "train_batch",
                first_batch_idx,
                allow_none=True,
            )
            if len(positions) == len(batch_metrics):  # every batch reported: a float64 array
                per_metric[name] = host_values
            else:
                column: list[float | None] = [None] * len(batch_metrics)
                for position, value in zip(positions, host_values.tolist()):
                    column[position] = value
                per_metric[name] = column
        return len(batch_metrics), names, per_metric

    gathered = gather_from_all_ranks(local_values, allgather, what="training metrics")
    names = check_same_names_across_ranks([names for _, names, _ in gathered], "train_batch")
    num_batches = max(count for count, _, _ in gathered)
    ranks_values = [per_metric for count, _, per_metric in gathered if count > 0]

    # Per metric, each batch's value averaged across the ranks that reported one: a float64
    # array when every batch has a value, else a list holding None where none was reported.
    columns: dict[str, Any]
    if len(ranks_values) == 1:
        columns = ranks_values[0]  # one rank: its own values, no averaging
    else:
        columns = {
            name: [
                _average_across_ranks(ranks_values, name, batch_position)
                for batch_position in range(num_batches)
            ]
            for name in names
        }
    return {name: _workload_average(columns[name]) for name in names}


def _workload_average(column: Any) -> float | None:
    """One metric's mean over the workload's batches (``None`` values left out)."""
    if isinstance(column, np.ndarray) and column.ndim > 1:  # an array-valued metric
        return float(column.mean())
    if isinstance(column, np.ndarray):
        # column.mean()'s value (numpy divides this same pairwise sum by the count), at a
        # third of its cost: mean() runs a Python wrapper around this reduction.
        return float(np.add.reduce(column)) / len(column)
    reported = [value for value in column if value is not None]
    return float(np.mean(reported)) if reported else None


def _average_across_ranks(
    ranks_values: Sequence[dict[str, Sequence[float | None]]], name: str, batch_position: int
) -> float | None:
    """Metric ``name`` of one batch, averaged over the ranks that ran that batch and reported it."""
    reported = [
        per_metric[name][batch_position]
        for per_metric in ranks_values
        if batch_position < len(per_metric[name]) and per_metric[name][batch_position] is not None
    ]
    if len(reported) == 1 and not isinstance(reported[0], list):  # one rank's number: itself
        return float(reported[0])
    # Several ranks, or an array-valued metric: the mean of every element, as Determined does.
    return float(np.mean(reported)) if reported else None
