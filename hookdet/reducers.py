"""Metric reduction for training and validation workloads, with Determined's semantics.

The loop hands this module what the trial produced during one workload and gets back the numbers it
reports. Distribution is represented by an ``allgather(obj) -> list`` callable: every rank calls it
with its own object and receives all ranks' objects in rank order (single process:
:func:`single_process_allgather`). Each public reduction calls ``allgather`` exactly once on every
rank, even when this rank's metrics are bad, so one rank's mistake raises on all ranks instead of
leaving the others waiting in a collective forever.

What lives here:

- :class:`Reducer` and :class:`MetricReducer`: Determined's public names and contract.
- :class:`ReducerRegistry`: the state behind ``context.wrap_reducer`` (custom reducers, reset each
  workload, reduced with one allgather).
- :func:`reduce_validation_metrics`: ``evaluate_batch`` outputs → one value per metric, by
  ``evaluation_reducer()`` (``Reducer.AVG`` is batch-weighted across ranks).
- :func:`reduce_training_metrics` / :func:`average_training_metrics`: ``train_batch`` outputs →
  per-batch values averaged across ranks, and their unweighted mean over the workload.
- :func:`check_metrics_serialisable`: turns tensors and numpy values into plain Python and refuses
  anything that cannot be written as JSON, naming where it came from.

Metric tensors stay on their device through the workload; conversion happens here, once per metric
(the workload's values are stacked on the device and moved to the host in one transfer), never once
per batch.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import functools
import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

Allgather = Callable[[Any], list[Any]]
"""Collective gather: each rank passes its object and gets every rank's object, in rank order."""


class MetricError(ValueError):
    """A metric value, a reducer's result or a reducer registration breaks a rule.

    The message names the culprit (metric, batch, reducer, rank) and the rule it broke.
    """


def single_process_allgather(obj: Any) -> list[Any]:
    """The allgather of a world with one rank: this rank's object is everybody's object."""
    return [obj]


# ---------------------------------------------------------------------------------------------
# Determined's public reducer API
# ---------------------------------------------------------------------------------------------


class Reducer(enum.Enum):
    """How :meth:`PyTorchTrial.evaluation_reducer` aggregates a validation metric.

    Same members and values as ``determined.pytorch.Reducer``. ``AVG`` averages over every
    validation batch of every rank (each rank's mean is weighted by its number of batches).
    """

    AVG = 1
    SUM = 2
    MAX = 3
    MIN = 4


class MetricReducer(abc.ABC):
    """A custom metric computed correctly under distribution, in Determined's three steps.

    1. The user gathers values during the workload by whatever method they define (typically
       ``update(...)`` called from ``train_batch``/``evaluate_batch``); it is not part of this API.
    2. :meth:`per_slot_reduce` condenses one rank's values into something small and picklable.
    3. :meth:`cross_slot_reduce` combines every rank's condensed value into the final metric.

    :meth:`reset` is called before each workload, so one instance serves many workloads. Register
    an instance with ``context.wrap_reducer(reducer, name=...)``.
    """

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget the values of the previous workload; called before each workload begins."""

    @abc.abstractmethod
    def per_slot_reduce(self) -> Any:
        """Return this rank's picklable partial result; called once when a workload ends."""

    @abc.abstractmethod
    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
        """Combine every rank's :meth:`per_slot_reduce` output (in rank order) into the metric.

        Return a dict of metric name to value when the reducer was wrapped with ``name=None``,
        and a single non-dict value when it was wrapped with a name.
        """


_NO_VALUE = object()


class FunctionReducer(MetricReducer):
    """What ``wrap_reducer`` returns for a plain function ``fn(values: list) -> metric``.

    Call :meth:`update` with one value at a time during the workload. At the end, ``fn`` receives
    the values of all ranks as one flat list, interleaved round-robin across ranks (rank 0's first
    value, rank 1's first value, ..., rank 0's second value, ...). That is Determined's order: it
    restores the dataset's order when each rank calls ``update`` once per batch of a sharded loader.
    """

    def __init__(self, fn: Callable[[list[Any]], Any]) -> None:
        self.fn = fn
        self.reset()

    def reset(self) -> None:
        """Drop the values collected during the previous workload."""
        self.values: list[Any] = []

    def update(self, value: Any) -> None:
        """Record one value for this workload; it is passed to ``fn`` unchanged."""
        self.values.append(value)

    def per_slot_reduce(self) -> list[Any]:
        """This rank's values, in the order they were recorded."""
        return list(self.values)

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
        """Apply ``fn`` to all ranks' values, interleaved round-robin across ranks."""
        interleaved = [
            value
            for one_round in itertools.zip_longest(*per_slot_metrics, fillvalue=_NO_VALUE)
            for value in one_round
            if value is not _NO_VALUE
        ]
        return self.fn(interleaved)


# ---------------------------------------------------------------------------------------------
# Collective helper: one allgather per reduction, errors raised on every rank
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _RankFailure:
    """Sent through allgather in place of a rank's payload when that rank's metrics were bad."""

    message: str


def _gather_from_all_ranks(
    compute_local_payload: Callable[[], Any], allgather: Allgather, what: str
) -> list[Any]:
    """Compute this rank's payload and allgather it; raise on every rank if any rank failed.

    An exception raised while computing the payload is sent to the other ranks in its place, so
    all ranks leave the collective: the failing rank re-raises its own exception, the others raise
    a :class:`MetricError` naming the failing rank and its message.
    """
    local_error: Exception | None = None
    try:
        payload = compute_local_payload()
    except Exception as error:
        local_error = error
        payload = _RankFailure(str(error) if isinstance(error, MetricError) else repr(error))
    gathered = allgather(payload)
    if not isinstance(gathered, (list, tuple)):
        raise TypeError(
            f"allgather must return a list with one object per rank; it returned a "
            f"{type(gathered).__name__} while reducing {what}"
        )
    gathered = list(gathered)
    if local_error is not None:
        raise local_error
    for rank, rank_payload in enumerate(gathered):
        if isinstance(rank_payload, _RankFailure):
            raise MetricError(
                f"{what} could not be reduced: rank {rank} failed: {rank_payload.message}"
            )
    return gathered


# ---------------------------------------------------------------------------------------------
# context.wrap_reducer
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Registration:
    """One wrapped reducer and the workloads it reports in."""

    reducer: MetricReducer
    name: str | None
    for_training: bool
    for_validation: bool

    def describe(self) -> str:
        """Human-readable identity used in every error about this reducer."""
        if isinstance(self.reducer, FunctionReducer):
            fn = self.reducer.fn
            what = f"reducer function {getattr(fn, '__qualname__', repr(fn))}()"
        else:
            what = f"MetricReducer {type(self.reducer).__qualname__}"
        return f"{what} (name={self.name!r})"

    def reports_in(self, for_training: bool) -> bool:
        """Whether this reducer contributes to a training (True) or validation (False) workload."""
        return self.for_training if for_training else self.for_validation

    def overlaps(self, other: _Registration) -> bool:
        """Whether both reducers report in at least one common kind of workload."""
        return (self.for_training and other.for_training) or (
            self.for_validation and other.for_validation
        )

    def call(self, method: str, *args: Any) -> Any:
        """Call a reducer method; a failure is re-raised naming the reducer and the method."""
        try:
            return getattr(self.reducer, method)(*args)
        except Exception as error:
            raise MetricError(f"{self.describe()} failed in {method}(): {error!r}") from error


class ReducerRegistry:
    """The custom reducers registered through ``context.wrap_reducer``.

    The loop calls :meth:`reset_all` before each workload and :meth:`reduce` after it, on every
    rank. All ranks must register the same reducers in the same order (as constructing the same
    trial on each rank does).
    """

    def __init__(self) -> None:
        self._registrations: list[_Registration] = []

    def __len__(self) -> int:
        return len(self._registrations)

    def wrap(
        self,
        reducer: MetricReducer | Callable[[list[Any]], Any],
        name: str | None = None,
        for_training: bool = True,
        for_validation: bool = True,
    ) -> MetricReducer:
        """Register a reducer; Determined's ``wrap_reducer`` semantics.

        ``reducer`` is a :class:`MetricReducer` instance (returned as is) or a function
        ``fn(values: list) -> metric`` (returned wrapped in a :class:`FunctionReducer`, whose
        ``update(value)`` the trial calls). With ``name=None`` the reduced result must be a dict
        whose keys become metric names; with a name it must be a single non-dict value reported
        under that name. Two reducers may share a name only if they never report in the same kind
        of workload.
        """
        if isinstance(reducer, type) and issubclass(reducer, MetricReducer):
            raise TypeError(
                f"wrap_reducer() was given the class {reducer.__qualname__}, not an instance; "
                f"pass {reducer.__qualname__}(...) instead"
            )
        if isinstance(reducer, MetricReducer):
            metric_reducer: MetricReducer = reducer
        elif callable(reducer):
            metric_reducer = FunctionReducer(reducer)
        else:
            raise TypeError(
                f"wrap_reducer() needs a function or a MetricReducer instance; it was given a "
                f"{type(reducer).__name__}"
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"wrap_reducer() name must be a non-empty string or None, not {name!r}")
        if not isinstance(for_training, bool) or not isinstance(for_validation, bool):
            raise TypeError("wrap_reducer() for_training and for_validation must be True or False")
        registration = _Registration(metric_reducer, name, for_training, for_validation)
        if not (for_training or for_validation):
            raise ValueError(
                f"wrap_reducer() for {registration.describe()} has for_training=False and "
                "for_validation=False, so it would never report; enable at least one"
            )
        for existing in self._registrations:
            if existing.reducer is reducer:
                raise ValueError(
                    f"{existing.describe()} was passed to wrap_reducer() twice; wrap each reducer "
                    "object once"
                )
            if name is not None and existing.name == name and existing.overlaps(registration):
                raise ValueError(
                    f"wrap_reducer() name {name!r} is already used by {existing.describe()}; "
                    f"{registration.describe()} needs a different name"
                )
        self._registrations.append(registration)
        return metric_reducer

    def reset_all(self, for_training: bool | None = None) -> None:
        """Reset the reducers of a training (True) or validation (False) workload, or all (None)."""
        for registration in self._registrations:
            if for_training is None or registration.reports_in(for_training):
                registration.call("reset")

    def reduce(
        self, for_training: bool, allgather: Allgather = single_process_allgather
    ) -> dict[str, Any]:
        """Reduce the reducers of this kind of workload across ranks into ``{metric: value}``.

        One allgather carries every reducer's per-slot value. Results are converted to plain,
        JSON-writable Python (see :func:`check_metrics_serialisable`). Does not reset.
        """
        selected = [r for r in self._registrations if r.reports_in(for_training)]
        if not selected:
            return {}
        workload = "training" if for_training else "validation"
        gathered = _gather_from_all_ranks(
            lambda: [registration.call("per_slot_reduce") for registration in selected],
            allgather,
            what=f"custom reducers of the {workload} workload",
        )
        for rank, rank_values in enumerate(gathered):
            if len(rank_values) != len(selected):
                raise MetricError(
                    f"rank {rank} sent {len(rank_values)} custom {workload} reducer values but "
                    f"this rank has {len(selected)} reducers; every rank must call "
                    "wrap_reducer() with the same reducers in the same order"
                )
        return self._combine(selected, gathered)

    def cross_slot_reduce(
        self, reducers: list[MetricReducer], gathered: list[list[Any]]
    ) -> dict[str, Any]:
        """Combine ``gathered[rank][i]``, the ``per_slot_reduce()`` of ``reducers[i]`` on each
        rank, into ``{metric: value}`` (the second half of :meth:`reduce`)."""
        by_reducer = {id(r.reducer): r for r in self._registrations}
        selected = []
        for reducer in reducers:
            if id(reducer) not in by_reducer:
                raise ValueError(
                    f"run_cross_slot_reduction: {type(reducer).__name__} was not returned by "
                    "context.wrap_reducer()"
                )
            selected.append(by_reducer[id(reducer)])
        return self._combine(selected, gathered)

    @staticmethod
    def _combine(selected: list[_Registration], gathered: list[list[Any]]) -> dict[str, Any]:
        """Each registration's ``cross_slot_reduce`` of its per-rank values, named and checked."""
        metrics: dict = {}
        reported_by: dict = {}
        for position, registration in enumerate(selected):
            per_slot_metrics = [rank_values[position] for rank_values in gathered]
            result = registration.call("cross_slot_reduce", per_slot_metrics)
            if registration.name is None:
                if not isinstance(result, Mapping):
                    raise MetricError(
                        f"{registration.describe()} was wrapped with name=None, so its reduced "
                        f"result must be a dict of metric names to values, but it returned a "
                        f"{type(result).__name__}; pass name=... to report a single metric"
                    )
                named_results = check_metrics_serialisable(result, origin=registration.describe())
            else:
                if isinstance(result, Mapping):
                    raise MetricError(
                        f"{registration.describe()} was wrapped with a name, so its reduced result "
                        f"must be a single value, but it returned a dict; leave name=None to "
                        "report several metrics from one dict"
                    )
                named_results = check_metrics_serialisable(
                    {registration.name: result}, origin=registration.describe()
                )
            for metric_name, value in named_results.items():
                if metric_name in reported_by:
                    raise MetricError(
                        f"metric {metric_name!r} is reported by both {reported_by[metric_name]} "
                        f"and {registration.describe()}; each metric name needs one reducer"
                    )
                reported_by[metric_name] = registration.describe()
                metrics[metric_name] = value
        return metrics


# ---------------------------------------------------------------------------------------------
# Moving a workload's metric values to the host: one transfer per metric
# ---------------------------------------------------------------------------------------------


def _describe_value(value: Any) -> str:
    """Short description of a metric value for error messages."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"a {type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} (a {type(value).__name__})"


def _workload_metric_to_host(
    values: Sequence[Any],
    metric: str,
    origin: str,
    first_batch_idx: int,
    allow_arrays: bool,
    allow_none: bool,
) -> tuple[np.ndarray, list[int]]:
    """Convert one metric's per-batch values to a float64 array of shape ``(n, *value_shape)``.

    Returns the array and the batch positions it holds (positions whose value is ``None`` are
    left out when ``allow_none``). Tensors on a device are stacked there and copied to the host
    in one transfer. Values holding one element count as scalars whatever their shape; larger
    values are allowed only with ``allow_arrays`` and must have the same shape in every batch.
    """

    if not allow_arrays:
        fast = _scalar_tensors_to_host(values)
        if fast is not None:
            return fast, list(range(len(values)))

    def fail(position: int, value: Any, rule: str) -> MetricError:
        return MetricError(
            f"{origin} returned metric {metric!r} = {_describe_value(value)} at batch "
            f"{first_batch_idx + position}: {rule}"
        )

    value_shape: tuple[int, ...] | None = None
    host_rows: dict = {}
    tensor_positions_by_device: dict = {}
    for position, value in enumerate(values):
        if value is None and allow_none:
            continue
        if isinstance(value, torch.Tensor):
            if value.is_complex() or value.is_quantized:
                raise fail(position, value, "metric tensors must hold real numbers")
            shape = tuple(value.shape)
            numel = value.numel()
        else:
            try:
                array = np.asarray(value)
            except (TypeError, ValueError):
                array = np.asarray(None, dtype=object)
            if array.dtype.kind not in "biuf":
                expected = "numbers or arrays of numbers" if allow_arrays else "numbers"
                raise fail(position, value, f"metric values must be {expected}")
            shape = array.shape
            numel = array.size
        if numel == 0:
            raise fail(position, value, "metric values must not be empty")
        if numel == 1:
            shape = ()
        elif not allow_arrays:
            raise fail(position, value, "training metrics must be numbers or one-element tensors")
        if value_shape is None:
            value_shape = shape
        elif shape != value_shape:
            raise fail(
                position,
                value,
                f"its shape {shape} differs from the shape {value_shape} of earlier batches",
            )
        if isinstance(value, torch.Tensor):
            tensor_positions_by_device.setdefault(value.device, []).append(position)
        else:
            host_rows[position] = array.astype(np.float64).reshape(shape)

    for device_positions in tensor_positions_by_device.values():
        tensors = [values[position] for position in device_positions]
        common_dtype = functools.reduce(torch.promote_types, {t.dtype for t in tensors})
        # Reshape or cast only the tensors that need it: each such call allocates a tensor
        # (about 2.5 µs), most of this path's cost for a validation's per-batch scalars.
        with torch.no_grad():
            stacked = torch.stack([
                t if t.dtype == common_dtype and t.shape == value_shape
                else t.reshape(value_shape).to(common_dtype)
                for t in tensors
            ])
        on_host = stacked.cpu().to(torch.float64).numpy()
        for row, position in enumerate(device_positions):
            host_rows[position] = on_host[row]

    positions = sorted(host_rows)
    if not positions:
        return np.empty((0,) + (value_shape or ()), dtype=np.float64), positions
    return np.stack([host_rows[position] for position in positions]), positions


def _scalar_tensors_to_host(values: Sequence[Any]) -> np.ndarray | None:
    """The common case without a Python loop: every value a one-element real tensor.

    Returns the float64 array :func:`_workload_metric_to_host` would build, or None whenever
    anything is unusual (another type, ``None``, several elements, a complex value; off the CPU
    also mixed shapes or devices), leaving that case, and its precise error message, to the
    general path. A training workload's values are usually this case.

    When the first value is on the CPU, the values are read in one pass of ``Tensor.item`` (no
    device involved), about a third of the cost of ``torch.stack`` over a hundred 0-dim
    tensors. On a device one ``stack`` and one copy to the host replace a transfer per value.
    """
    if not values or not isinstance(values[0], torch.Tensor):
        return None
    if values[0].is_cpu:
        try:
            return np.fromiter(map(torch.Tensor.item, values), dtype=np.float64, count=len(values))
        except (RuntimeError, TypeError):  # several elements, a complex value, not a tensor
            return None
    try:
        with torch.no_grad():
            stacked = torch.stack(values)  # type: ignore[arg-type]
    except (RuntimeError, TypeError):  # not all tensors, or shapes or devices differ
        return None
    # Stacking promotes mixed dtypes as the general path does; it also stacks values of several
    # elements, which only the general path may judge, so the element count must match.
    if stacked.numel() != len(values) or stacked.is_complex() or stacked.is_quantized:
        return None
    return stacked.reshape(len(values)).cpu().to(torch.float64).numpy()


def _metric_names(batch_metrics: Sequence[Any], origin: str, first_batch_idx: int) -> list[str]:
    """The metric names every batch reported, in the first batch's order.

    Every batch must be a dict with string keys, and all batches must report the same names.
    """
    # The usual workload (dicts with the first batch's string keys) passes in one comparison of
    # key views per batch, run by ``map`` without a Python frame per batch; anything else goes
    # through the loop below, which finds and names the batch that breaks a rule.
    first = batch_metrics[0] if batch_metrics else None
    if type(first) is dict and all(isinstance(key, str) for key in first):
        try:
            if all(map(first.keys().__eq__, map(dict.keys, batch_metrics))):
                return list(first)
        except TypeError:  # a batch's metrics are not a dict
            pass
    names: list[str] | None = None
    for position, metrics in enumerate(batch_metrics):
        batch_idx = first_batch_idx + position
        if not isinstance(metrics, Mapping):
            raise MetricError(
                f"{origin} must return a dict of metric names to values, but at batch "
                f"{batch_idx} it returned {_describe_value(metrics)}"
            )
        for key in metrics:
            if not isinstance(key, str):
                raise MetricError(
                    f"{origin} returned a metric named {key!r} (a {type(key).__name__}) at batch "
                    f"{batch_idx}; metric names must be strings"
                )
        if names is None:
            names = list(metrics)
        elif set(metrics) != set(names):
            missing = sorted(set(names) - set(metrics))
            extra = sorted(set(metrics) - set(names))
            raise MetricError(
                f"{origin} must return the same metric names for every batch: batch {batch_idx} "
                f"lacks {missing} and adds {extra} compared with batch {first_batch_idx}"
            )
    return names or []


def _check_same_names_across_ranks(
    names_by_rank: Sequence[list[str] | None], origin: str
) -> list[str]:
    """The metric names shared by every rank that ran batches; error if two ranks disagree."""
    reference_rank: int | None = None
    for rank, names in enumerate(names_by_rank):
        if names is None:
            continue
        if reference_rank is None:
            reference_rank = rank
        elif set(names) != set(names_by_rank[reference_rank] or []):
            reference = set(names_by_rank[reference_rank] or [])
            raise MetricError(
                f"{origin} must return the same metric names on every rank: rank {rank} reported "
                f"{sorted(names)} but rank {reference_rank} reported {sorted(reference)}"
            )
    return list(names_by_rank[reference_rank] or []) if reference_rank is not None else []


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
        f"{_describe_value(reducer)}"
    )


def _reducer_for_each_metric(
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

    def local_summary() -> tuple[int, list[str] | None, dict]:
        if num_batches_per_rank is not None and num_batches_per_rank != len(batch_metrics):
            raise MetricError(
                f"reduce_validation_metrics() was told this rank evaluated {num_batches_per_rank} "
                f"batches but was given metrics for {len(batch_metrics)}"
            )
        if not batch_metrics:
            return 0, None, {}
        names = _metric_names(batch_metrics, "evaluate_batch", first_batch_idx=0)
        summaries = {}
        for name in names:
            values, _ = _workload_metric_to_host(
                [metrics[name] for metrics in batch_metrics],
                name,
                "evaluate_batch",
                first_batch_idx=0,
                allow_arrays=True,
                allow_none=False,
            )
            summaries[name] = _ValidationStats(
                float(values.mean()), float(values.sum()), float(values.max()), float(values.min())
            )
        return len(batch_metrics), names, summaries

    gathered = _gather_from_all_ranks(local_summary, allgather, what="validation metrics")
    names = _check_same_names_across_ranks([names for _, names, _ in gathered], "evaluate_batch")
    if not names:
        return {}
    reducer_by_metric = _reducer_for_each_metric(reducer, names)
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


# ---------------------------------------------------------------------------------------------
# Training: train_batch outputs, averaged
# ---------------------------------------------------------------------------------------------


class TrainingMetrics(NamedTuple):
    """A training workload's metrics, as ``on_training_workload_end`` receives them.

    ``batch_metrics[i]`` is batch ``i``'s metrics averaged across ranks; ``avg_metrics`` is the
    unweighted mean of those over the workload's batches. ``None`` marks a metric no rank
    reported a value for.
    """

    avg_metrics: dict[str, float | None]
    batch_metrics: list[dict[str, float | None]]


def reduce_training_metrics(
    batch_metrics: Sequence[Mapping[str, Any]],
    allgather: Allgather = single_process_allgather,
    *,
    first_batch_idx: int = 0,
    per_batch: bool = True,
) -> TrainingMetrics:
    """Average this rank's ``train_batch`` outputs across ranks and over the workload.

    Each value must be a number: a Python or numpy number, or a tensor or array with one
    element (on any device), or ``None`` for "not measured in this batch" (left out of the
    averages, as Determined does). ``first_batch_idx`` is the trial's index of the workload's
    first batch, used to name the culprit batch in errors. When ranks ran different numbers of
    batches, batch ``i`` averages the ranks that ran it. ``per_batch=False`` leaves
    ``batch_metrics`` empty: the loop passes it when nothing reads them, sparing a dict per batch.
    """

    def local_values() -> tuple[int, list[str] | None, dict]:
        if not batch_metrics:
            return 0, None, {}
        names = _metric_names(batch_metrics, "train_batch", first_batch_idx)
        per_metric: dict[str, Any] = {}
        for name in names:
            host_values, positions = _workload_metric_to_host(
                list(map(operator.itemgetter(name), batch_metrics)),
                name,
                "train_batch",
                first_batch_idx,
                allow_arrays=False,
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

    gathered = _gather_from_all_ranks(local_values, allgather, what="training metrics")
    names = _check_same_names_across_ranks([names for _, names, _ in gathered], "train_batch")
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
    avg_metrics = {}
    for name in names:
        column = columns[name]
        if isinstance(column, np.ndarray):
            # column.mean()'s value (numpy divides this same pairwise sum by the count), at a
            # third of its cost: mean() runs a Python wrapper around this reduction.
            avg_metrics[name] = float(np.add.reduce(column)) / len(column)
            continue
        reported = [value for value in column if value is not None]
        avg_metrics[name] = float(np.mean(reported)) if reported else None
    if not per_batch:
        return TrainingMetrics(avg_metrics, [])
    if not names:
        return TrainingMetrics(avg_metrics, [{} for _ in range(num_batches)])
    plain_columns = [
        columns[name].tolist() if isinstance(columns[name], np.ndarray) else columns[name]
        for name in names
    ]
    averaged_batches = [dict(zip(names, values)) for values in zip(*plain_columns)]
    return TrainingMetrics(avg_metrics, averaged_batches)


def _average_across_ranks(
    ranks_values: Sequence[dict[str, Sequence[float | None]]], name: str, batch_position: int
) -> float | None:
    """Metric ``name`` of one batch, averaged over the ranks that ran that batch and reported it."""
    reported = [
        per_metric[name][batch_position]
        for per_metric in ranks_values
        if batch_position < len(per_metric[name]) and per_metric[name][batch_position] is not None
    ]
    if len(reported) == 1:  # one rank (or one reporting rank): the value itself
        return float(reported[0])
    return float(np.mean(reported)) if reported else None


def average_training_metrics(
    batch_metrics: Sequence[Mapping[str, Any]],
    allgather: Allgather = single_process_allgather,
    *,
    first_batch_idx: int = 0,
) -> dict[str, float | None]:
    """The workload's training metrics: unweighted mean over its batches, averaged across ranks.

    The ``avg_metrics`` half of :func:`reduce_training_metrics`; see there for accepted values.
    """
    return reduce_training_metrics(
        batch_metrics, allgather, first_batch_idx=first_batch_idx
    ).avg_metrics


# ---------------------------------------------------------------------------------------------
# Reporting boundary: plain, JSON-writable Python
# ---------------------------------------------------------------------------------------------


def _to_plain(value: Any, origin: str, metric: str, path: str) -> Any:
    """Convert tensors and numpy values inside ``value`` to plain Python; refuse non-JSON values."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.generic):
        return _to_plain(value.item(), origin, metric, path)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            raise MetricError(
                f"{origin} reported metric {metric!r} as a complex tensor (at {path}); metrics "
                "must be real numbers"
            )
        return _to_plain(value.detach().cpu().tolist(), origin, metric, path)
    if isinstance(value, np.ndarray):
        return _to_plain(value.tolist(), origin, metric, path)
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise MetricError(
                    f"{origin} reported metric {metric!r} with a dict key {key!r} (a "
                    f"{type(key).__name__}) at {path}; keys must be strings to be written as JSON"
                )
            plain[key] = _to_plain(item, origin, metric, f"{path}[{key!r}]")
        return plain
    if isinstance(value, (list, tuple)):
        return [
            _to_plain(item, origin, metric, f"{path}[{index}]") for index, item in enumerate(value)
        ]
    raise MetricError(
        f"{origin} reported metric {metric!r} with {_describe_value(value)} at {path}, which "
        "cannot be written as JSON; metric values must be numbers, strings, booleans, None, "
        "tensors or arrays of numbers, or lists and string-keyed dicts of these"
    )


def check_metrics_serialisable(metrics: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """Return ``metrics`` as plain, JSON-writable Python, or raise naming ``origin`` and the key.

    Tensors (on any device) and numpy values become Python numbers and lists; strings, booleans
    and ``None`` pass through (so do NaN and infinity, which Python's ``json`` writes); dicts and
    lists are converted recursively. Anything else (a set,
    bytes, a complex number, an arbitrary object) is a :class:`MetricError` naming ``origin``
    (e.g. ``"evaluate_batch"``), the metric key and where inside the value it sits.
    """
    if not isinstance(metrics, Mapping):
        raise MetricError(
            f"{origin} must produce a dict of metric names to values, "
            f"not {_describe_value(metrics)}"
        )
    plain = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise MetricError(
                f"{origin} reported a metric named {key!r} (a {type(key).__name__}); metric names "
                "must be strings"
            )
        plain[key] = _to_plain(value, origin, key, path=repr(key))
    return plain
