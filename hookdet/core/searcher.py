"""``core_context.searcher``: Determined's deprecated searcher operations, as 0.38 yields them.

Since Determined 0.38.0 ``operations()`` no longer talks to the master: it yields one
operation whose ``length`` is the experiment's ``searcher.max_length`` (a bare number, or the
value of ``{batches: N}``/``{epochs: N}``), with a ``FutureWarning``; a search stops a Core API
trial through ``core_context.preempt`` instead. hookdet keeps exactly that. Without a
``searcher.max_length`` the context is missing and each call says so, as Determined's does.
"""
from __future__ import annotations

import enum
import logging
import warnings
from typing import Any, Dict, Iterator, Optional

logger = logging.getLogger("hookdet")

_MISSING = ("SearcherContext was not created because your experiment config does not have the searcher.max_length "
            "set.  Both the searcher.max_length and the SearcherContext are deprecated.  Instead, you should specify "
            "your training length directly in your training code and avoid all calls to core_context.searcher.")


class Unit(enum.Enum):
    """The unit of ``searcher.max_length`` (Determined's names and values)."""

    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


class SearcherMode(enum.Enum):
    """How ranks call ``operations()`` (Determined's names and values, its spelling kept)."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHEIF_ONLY"


class SearcherOperation:
    """One train-to-``length``-then-validate request (deprecated in Determined 0.38)."""

    def __init__(self, train: Any, length: int, is_chief: bool) -> None:
        self._train = train
        self._length = length
        self._is_chief = is_chief
        self._completed = False

    @property
    def length(self) -> int:
        """The total training the operation asks for, in the unit of ``searcher.max_length``."""
        return self._length

    def report_progress(self, length: float) -> None:
        """Progress towards ``length``, shown as the run's progress."""
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_progress() from the chief worker")
        if self._completed and length != self._length:
            raise RuntimeError("you must not call op.report_progress() after op.report_completed()")
        self._train.report_progress(min(1.0, max(0.0, length / self._length)))

    def report_completed(self, searcher_metric: Any) -> None:
        """The operation is done (the metric is only logged, as Determined 0.38 does)."""
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_completed() from the chief worker")
        if self._completed:
            raise RuntimeError("you may only call op.report_completed() once")
        self._completed = True
        logger.info("op.report_completed(%s)", searcher_metric)


class SearcherContext:
    """``core_context.searcher`` (deprecated in Determined 0.38)."""

    def __init__(self, distributed: Any, train: Any, length: int, units: Optional[Unit]) -> None:
        self._dist = distributed
        self._train = train
        self._length = length
        self._units = units

    def operations(self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief,
                   auto_ack: bool = True) -> Iterator[SearcherOperation]:
        """One operation of length ``searcher.max_length``, with Determined's FutureWarning."""
        warnings.warn(
            "SearcherContext.operations() was deprecated in Determined 0.38.0 and will be removed in a future "
            "version.  Instead, you should set your training length directly in your training code.",
            FutureWarning, stacklevel=2,
        )
        searcher_mode = SearcherMode(searcher_mode)
        asking_chief = searcher_mode == SearcherMode.WorkersAskChief
        if self._dist.rank == 0:
            operation = SearcherOperation(self._train, self._length, True)
            if asking_chief:
                self._dist.broadcast(operation.length)
            yield operation
            if not operation._completed:
                raise RuntimeError("you must call op.report_completed() on each operation")
            if asking_chief:
                self._dist.broadcast(None)
            return
        if not asking_chief:
            raise RuntimeError("you cannot call searcher.operations(searcher_mode=ChiefOnly) from a non-chief worker.")
        while True:
            length = self._dist.broadcast(None)
            if length is None:
                return
            yield SearcherOperation(self._train, length, False)

    def acknowledge_out_of_ops(self) -> None:
        """Ignored, as in Determined 0.38."""

    def get_configured_units(self) -> Optional[Unit]:
        """The unit ``searcher.max_length`` names (None for a bare number)."""
        return self._units


class SearcherContextMissing(SearcherContext):
    """``core_context.searcher`` of an experiment without ``searcher.max_length``: every call
    says so, in Determined's words."""

    def __init__(self) -> None:
        pass

    def operations(self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief,
                   auto_ack: bool = True) -> Iterator[SearcherOperation]:
        raise ValueError(_MISSING)

    def acknowledge_out_of_ops(self) -> None:
        raise ValueError(_MISSING)

    def get_configured_units(self) -> Optional[Unit]:
        raise ValueError(_MISSING)


def searcher_context(config: Dict[str, Any], distributed: Any, train: Any) -> Any:
    """The searcher context for the experiment file ``config`` (as a dict): a
    :class:`SearcherContext` when it sets ``searcher.max_length``, else a missing one."""
    max_length = (config.get("searcher") or {}).get("max_length")
    units = None
    if isinstance(max_length, dict) and max_length:
        unit, max_length = next(iter(max_length.items()))
        units = {"records": Unit.RECORDS, "epochs": Unit.EPOCHS, "batches": Unit.BATCHES}.get(unit)
    if not isinstance(max_length, int) or isinstance(max_length, bool) or not max_length:
        return SearcherContextMissing()
    return SearcherContext(distributed, train, max_length, units)
