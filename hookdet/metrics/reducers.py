"""Determined's reducer API and the state behind ``context.wrap_reducer``, with Determined's
semantics.

Distribution is represented by an ``allgather(obj) -> list`` callable: every rank calls it with its
own object and receives all ranks' objects in rank order (single process:
:func:`single_process_allgather`). Each public reduction calls ``allgather`` exactly once on every
rank, even when this rank's metrics are bad, so one rank's mistake raises on all ranks instead of
leaving the others waiting in a collective forever (:func:`gather_from_all_ranks`).

What lives here:

- :class:`Reducer` and :class:`MetricReducer`: Determined's public names and contract.
- :class:`ReducerRegistry`: the state behind ``context.wrap_reducer`` (custom reducers, reset each
  workload, reduced with one allgather).

The reductions of a workload's ``train_batch``/``evaluate_batch`` outputs are in
:mod:`hookdet.metrics.workload_metrics`; moving metric values to the host and making them plain, JSON-able
Python in :mod:`hookdet.metrics.metric_values`.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import itertools
from collections.abc import Mapping
from typing import Any, Callable

from hookdet.errors import ArgumentTypeError
from hookdet.metrics.metric_values import MetricError, ReducerResultError, check_metrics_serialisable

__all__ = [
    "Allgather",
    "FunctionReducer",
    "MetricError",
    "MetricReducer",
    "Reducer",
    "ReducerRegistry",
    "gather_from_all_ranks",
    "single_process_allgather",
]

Allgather = Callable[[Any], list[Any]]
"""Collective gather: each rank passes its object and gets every rank's object, in rank order."""




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


def gather_from_all_ranks(
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

    def has_training_reducers(self) -> bool:
        """Whether any reducer reports in training workloads (its state is the trial's)."""
        return any(registration.for_training for registration in self._registrations)

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
            raise ArgumentTypeError(
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
        self,
        for_training: bool,
        allgather: Allgather = single_process_allgather,
        plain: bool = True,
    ) -> dict[str, Any]:
        """Reduce the reducers of this kind of workload across ranks into ``{metric: value}``.

        One allgather carries every reducer's per-slot value. Results are checked to be
        JSON-writable and, with ``plain``, converted to plain Python (see
        :func:`check_metrics_serialisable`); without it they are what ``cross_slot_reduce``
        returned, as Determined's ``context.reduce_metrics`` gives them. Does not reset.
        """
        selected = [r for r in self._registrations if r.reports_in(for_training)]
        if not selected:
            return {}
        workload = "training" if for_training else "validation"
        gathered = gather_from_all_ranks(
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
        combined = self._combine(selected, gathered)
        return check_metrics_serialisable(combined, "custom reducers") if plain else combined

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
                    raise ReducerResultError(
                        f"{registration.describe()} was wrapped with name=None, so its reduced "
                        f"result must be a dict of metric names to values, but it returned a "
                        f"{type(result).__name__}; pass name=... to report a single metric "
                        "(Determined's words: wrapped by a call to wrap_reducer() with name=None "
                        "but it did not return a dict)"
                    )
                named_results = dict(result)
            else:
                if isinstance(result, Mapping):
                    raise ReducerResultError(
                        f"{registration.describe()} was wrapped with a name, so its reduced result "
                        f"must be a single value, but it returned a dict; leave name=None to "
                        "report several metrics from one dict (Determined's words: wrapped by a "
                        "call to wrap_reducer() with name set but it returned a dict anyway)"
                    )
                named_results = {registration.name: result}
            check_metrics_serialisable(named_results, origin=registration.describe())
            for metric_name, value in named_results.items():
                if metric_name in reported_by:
                    raise MetricError(
                        f"metric {metric_name!r} is reported by both {reported_by[metric_name]} "
                        f"and {registration.describe()}; each metric name needs one reducer"
                    )
                reported_by[metric_name] = registration.describe()
                metrics[metric_name] = value
        return metrics
