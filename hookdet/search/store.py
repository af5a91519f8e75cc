"""The search's work queue, kept in an Optuna study: no scheduler or database of hookdet's own.

Each piece of work is a *segment*: train one hookdet trial up to a length (a rung for ASHA, the
full length otherwise), resuming its run directory. The driver adds a segment as a WAITING Optuna
trial whose user attributes describe it; a worker claims it with Optuna's atomic
WAITING -> RUNNING transition (``storage.set_trial_state_values``, which answers False to every
claimant but one), runs it, reports each validation of the searcher metric as an intermediate
value, records the outcome in user attributes and finishes it COMPLETE (or FAIL).

Liveness: while a segment runs, its worker beats (:meth:`Queue.beat`). An RDB store (SQLite,
PostgreSQL, MySQL) keeps the beats in Optuna's own heartbeat table (``RDBStorage`` opened with
``heartbeat_interval`` and ``grace_period``), and the driver fails the segments whose beats
stopped for longer than the grace period with Optuna's ``fail_stale_trials``, after beating
itself for the segments of its own machine whose worker it can see alive (so a live worker,
however slow, is never taken for dead and its segment never run twice). Optuna's journal store
has no heartbeat, so there the worker stamps a ``heartbeat`` attribute and the driver reads it.
A segment of the driver's own machine whose worker is gone is failed at once (its pid is
checked). :func:`grace_seconds` (``$HOOKDET_SEARCH_GRACE_SECONDS``) is the grace period.

Storage: ``sqlite:///SEARCH_DIR/search.db`` by default (embedded, no server); any Optuna RDB URL
(``postgresql://``, ``mysql://``) or ``journal:PATH`` (Optuna's journal file, for a shared disk).
``optuna-dashboard URL`` reads the same store. Each search is one study, named by its directory
(:func:`study_name`), so searches can share a store; the study's direction follows
``searcher.smaller_is_better``, so Optuna's ``best_trial`` (and the dashboard's) is the best.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hookdet.errors import HookdetError

#: The one study of a search made before studies were named by their search.
LEGACY_STUDY_NAME = "hookdet-search"
#: Seconds between two beats of a worker for its running segment.
BEAT_SECONDS = 2


def grace_seconds() -> int:
    """Seconds without a beat after which a segment of another machine's worker is taken for
    dead (``$HOOKDET_SEARCH_GRACE_SECONDS``, 60 by default), read when asked: a warm process
    imported this module before the search's environment existed."""
    return int(os.environ.get("HOOKDET_SEARCH_GRACE_SECONDS", "60"))


def study_name(search_dir: Path) -> str:
    """The study of the search in ``search_dir``: its name and a digest of its path, so two
    searches sharing a store never share a study."""
    resolved = str(Path(search_dir).resolve())
    digest = hashlib.blake2b(resolved.encode(), digest_size=4).hexdigest()
    return f"hookdet:{Path(resolved).name}:{digest}"


def load_optuna() -> Any:
    """Optuna, quiet below errors (a store's faults are told once, by :class:`Guarded`, not as
    Optuna's retries); without it, the extra to install."""
    try:
        import optuna
    except ImportError:
        raise SystemExit(
            "hookdet: error: a hyperparameter search needs Optuna; install the 'search' extra: "
            "pip install 'hookdet[search]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna


def default_storage(search_dir: Path) -> str:
    return f"sqlite:///{Path(search_dir).resolve() / 'search.db'}"


#: RDB dialects whose driver is an extra of its own: (the driver's module, the extra).
DRIVER_EXTRAS = {"postgresql": ("psycopg2", "search-postgres")}


def check_driver(url: str) -> None:
    """Refuse, naming the extra to install, an RDB URL whose database driver is missing."""
    dialect = url.split(":", 1)[0].split("+", 1)[0]
    if dialect not in DRIVER_EXTRAS:
        return
    module, extra = DRIVER_EXTRAS[dialect]
    try:
        __import__(module)
    except ImportError:
        raise StoreError(
            f"--storage {url.split('@')[-1]}: a {dialect} store needs the {module} driver: "
            f"pip install 'hookdet[{extra}]'"
        ) from None


logger = logging.getLogger("hookdet")


class StoreError(HookdetError):
    """A search store that cannot be opened; the message says how to fix it."""


def open_storage(url: str) -> Any:
    """An Optuna storage for ``url`` (an RDB URL or ``journal:PATH``), behind :class:`Guarded`."""
    optuna = load_optuna()
    check_driver(url)
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        path = url[len("journal:"):]
        lock = JournalFileOpenLock(path, grace_period=30)
        drop_torn_record(path, lock)
        backend = JournalFileBackend(path, lock_obj=lock)
        return Guarded(optuna.storages.JournalStorage(backend), url)
    with warnings.catch_warnings():  # Optuna marks its heartbeat arguments experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}}
                                             if url.startswith("sqlite") else {},
                                             heartbeat_interval=BEAT_SECONDS, grace_period=grace_seconds())
    return Guarded(storage, url)


def drop_torn_record(path: str, lock: Any) -> None:
    """Cut a journal file's torn last record (a writer killed mid-line: no newline, no whole
    JSON), as a torn ``metrics.jsonl`` line is dropped; under the journal's own lock, so a
    record being written now is never taken for a torn one."""
    import json
    import os

    if not os.path.exists(path):
        return
    lock.acquire()
    try:
        with open(path, "rb+") as journal:
            size = journal.seek(0, os.SEEK_END)
            journal.seek(max(size - 1, 0))
            if size == 0 or journal.read(1) == b"\n":
                return
            tail_start = max(size - 1024 * 1024, 0)
            journal.seek(tail_start)
            tail = journal.read()
            start = tail_start + tail.rfind(b"\n") + 1
            try:
                json.loads(tail[start - tail_start:])
                journal.seek(0, os.SEEK_END)
                journal.write(b"\n")  # a whole record that only lacks its line end
                return
            except ValueError:
                journal.truncate(start)
        logger.warning("hookdet: warning: search store %s: dropped a torn last record (%d bytes: a "
                       "writer stopped mid-write)", path, size - start)
    finally:
        lock.release()


def _store_failures() -> tuple:
    """What a lost or damaged store raises from its backend (Optuna's storage error, SQLAlchemy's
    errors, a journal file's I/O and JSON errors, a study whose record is gone)."""
    from optuna.exceptions import StorageInternalError

    failures: tuple = (OSError, ValueError, KeyError, StorageInternalError)
    try:
        from sqlalchemy.exc import SQLAlchemyError

        failures += (SQLAlchemyError,)
    except ImportError:
        pass
    return failures


class Guarded:
    """An Optuna storage (or study) whose failures (the database deleted or damaged, the disk
    gone) come out as one :class:`StoreError` naming the store, not as a backend traceback.
    Optuna's own answers (a finished trial refusing an update) pass through unchanged; Optuna
    itself is given the storage unwrapped (``wrapped``)."""

    def __init__(self, wrapped: Any, url: str) -> None:
        self.wrapped, self.url, self.failures = wrapped, url, _store_failures()

    def _lost(self, error: BaseException) -> StoreError:
        cause = getattr(error.__cause__, "orig", None) or error.__cause__ or error  # past Optuna's wrapper
        return StoreError(f"search store {_shown(self.url)} is lost or damaged ({_first_line(cause)})")

    def __getattr__(self, name: str) -> Any:
        try:
            attribute = getattr(self.wrapped, name)  # a property (study.user_attrs) reads the store
        except self.failures as error:
            raise self._lost(error) from None
        if not callable(attribute):
            return attribute

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return attribute(*args, **kwargs)
            except self.failures as error:
                raise self._lost(error) from None
        return guarded


def _shown(url: str) -> str:
    """``url`` without credentials."""
    return url.split("@")[-1] if "@" in url else url


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


#: The user attributes that hold a segment as the driver queued it (its trial, hyperparameters,
#: experiment, ...) and how it ended (exit code, metric, batches, times, ...): one attribute each,
#: since Optuna's RDB store writes an attribute in about a millisecond and both are written on
#: the way from one segment to the next. The worker's stamps (``worker``, ``child_pid``,
#: ``heartbeat``) are attributes of their own.
SEGMENT, OUTCOME = "segment", "outcome"


def attrs_of(segment: Any) -> Dict[str, Any]:
    """A segment's attributes in one dict: as queued, the worker's stamps, then how it ended.
    A store written before the two packed attributes kept every field as an attribute of its
    own: read alike."""
    attrs = segment.user_attrs
    stamps = {key: value for key, value in attrs.items() if key not in (SEGMENT, OUTCOME)}
    return {**attrs.get(SEGMENT, {}), **stamps, **attrs.get(OUTCOME, {})}


def sequence_number(segment: Any) -> tuple:
    """Where a segment stands in the order of decisions: the number the driver gave it (a retry
    keeps its segment's), then its queue position; a segment queued before numbers existed by
    its position alone."""
    seq = attrs_of(segment).get("seq")
    return (segment.number if seq is None else seq, segment.number)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Queue:
    """Segments of one search in an Optuna study.

    ``study`` names it (:func:`study_name`); a worker given only a store may leave it out when
    the store holds one search. ``create`` makes the study (the driver), with the direction
    ``smaller_is_better`` gives."""

    def __init__(self, storage_url: str, study: Optional[str] = None, create: bool = False,
                 smaller_is_better: bool = True) -> None:
        optuna = load_optuna()
        self.optuna = optuna
        self.url = storage_url
        try:
            self.storage = open_storage(storage_url)
            if create:
                direction = "minimize" if smaller_is_better else "maximize"
                study_object = optuna.create_study(study_name=study, storage=self.storage.wrapped,
                                                   load_if_exists=True, direction=direction)
            else:
                study_object = optuna.load_study(study_name=study or self._only_study(),
                                                 storage=self.storage.wrapped)
            self.study = Guarded(study_object, storage_url)
        except StoreError:
            raise
        except Exception as error:  # noqa: BLE001 - each driver and backend has its own classes
            raise StoreError(f"search store {_shown(storage_url)} cannot be read: "
                             f"{_first_line(error)}") from None
        self.study_id = self.storage.get_study_id_from_name(self.study.study_name)
        self._changes = threading.Condition()
        self._generation = 0

    # The driver and its local worker threads share one Queue: each tells the others when it
    # queued or finished a segment, so none of them waits out a polling interval for it.
    # Workers in other processes see the store's changes at their next poll.

    def generation(self) -> int:
        """How many segments this process has queued or finished so far."""
        return self._generation

    def wait_for_change(self, seen: int, timeout: float) -> None:
        """Wait until this process queues or finishes a segment after :meth:`generation` was
        ``seen``, or ``timeout`` seconds pass."""
        with self._changes:
            self._changes.wait_for(lambda: self._generation != seen, timeout)

    def _changed(self) -> None:
        with self._changes:
            self._generation += 1
            self._changes.notify_all()

    def wake(self) -> None:
        """Wake whoever waits in :meth:`wait_for_change` (something besides a segment changed)."""
        self._changed()

    def _only_study(self) -> str:
        """The name of the store's one study; a store shared by searches needs the name."""
        from hookdet.search.trial_view import is_view

        names = [summary.study_name for summary in self.storage.get_all_studies() if not is_view(summary.study_name)]
        if len(names) == 1:
            return names[0]
        raise StoreError(
            f"search store {_shown(self.url)} holds {len(names)} searches"
            + (f" ({', '.join(names)})" if names else "")
            + "; give the search directory, or --study NAME"
        )

    def set_info(self, info: Dict[str, Any]) -> None:
        for key, value in info.items():
            self.study.set_user_attr(key, value)

    def info(self) -> Dict[str, Any]:
        return dict(self.study.user_attrs)

    def segments(self, states: Optional[Tuple[str, ...]] = None) -> List[Any]:
        """Every segment, or those in ``states`` (Optuna's state names; the store filters)."""
        wanted = None if states is None else tuple(self.optuna.trial.TrialState[name] for name in states)
        return self.storage.get_all_trials(self.study_id, deepcopy=False, states=wanted)

    def add(self, segment: Dict[str, Any], claimed: bool = False) -> Optional[Any]:
        """Queue a segment (its ``key`` must be new; see :meth:`keys`); ``claimed``: queue it
        already claimed by this process and return it (the driver hands it to a local worker
        that waits for one, which so skips a claim's round trips to the store)."""
        states = self.optuna.trial.TrialState
        attrs = {SEGMENT: segment, **({"worker": worker_id()} if claimed else {})}
        trial = self.optuna.trial.create_trial(state=states.RUNNING if claimed else states.WAITING,
                                               user_attrs=attrs)
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=trial)
        if claimed:
            self.beat(trial_id)
        self._changed()
        return self.storage.get_trial(trial_id) if claimed else None

    def keys(self) -> set:
        return {attrs_of(t).get("key") for t in self.segments()}

    def claim(self) -> Optional[Any]:
        """Take one WAITING segment (lowest decision number first) for this worker, or None.

        SQLite ignores the row lock Optuna's RDB storage takes for the transition, so two
        claimants could both win; on SQLite claims are serialised with a file lock next to the
        database (the journal store and database servers are atomic on their own)."""
        if not self.url.startswith("sqlite:///"):
            return self._claim()
        import fcntl

        with open(self.url[len("sqlite:///"):] + ".claim-lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return self._claim()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _claim(self) -> Optional[Any]:
        # Lowest decision number first (the driver's order; a retry keeps its segment's number).
        for trial in sorted(self.segments(states=("WAITING",)), key=sequence_number):
            trial_id = self.trial_id(trial.number)
            if self.storage.set_trial_state_values(
                    trial_id, state=self.optuna.trial.TrialState.RUNNING):
                self.stamp(trial_id)
                return trial
        return None

    def trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def stamp(self, trial_id: int) -> None:
        self.storage.set_trial_user_attr(trial_id, "worker", worker_id())
        self.beat(trial_id)

    @property
    def keeps_heartbeats(self) -> bool:
        """Whether the store is Optuna's heartbeat store (RDB), else the journal."""
        return hasattr(self.storage.wrapped, "record_heartbeat")

    def beat(self, trial_id: int) -> None:
        """Say that segment ``trial_id``'s worker is alive (see the module docstring)."""
        if self.keeps_heartbeats:
            self.storage.record_heartbeat(trial_id)
        else:
            self.storage.set_trial_user_attr(trial_id, "heartbeat", time.time())

    def fail_stale(self) -> None:
        """Fail the segments whose heartbeats stopped past the grace period (RDB stores):
        Optuna's ``fail_stale_trials``."""
        if self.keeps_heartbeats:
            with warnings.catch_warnings():  # experimental in Optuna's words, public all the same
                warnings.simplefilter("ignore", self.optuna.exceptions.ExperimentalWarning)
                self.optuna.storages.fail_stale_trials(self.study.wrapped)

    def report(self, trial_id: int, step: int, value: float) -> None:
        self.storage.set_trial_intermediate_value(trial_id, step, value)

    def finish(self, trial_id: int, outcome: Dict[str, Any], ok: bool) -> None:
        """Record how segment ``trial_id`` ended (one attribute, ``outcome``: one write between
        two segments, not one per field; :func:`attrs_of` reads it), then its state."""
        self.storage.set_trial_user_attr(trial_id, OUTCOME, outcome)
        state = self.optuna.trial.TrialState
        value = outcome.get("metric")
        if ok and value is not None and not math.isnan(value):  # Optuna keeps no NaN value; the outcome has it
            self.storage.set_trial_state_values(trial_id, state=state.COMPLETE, values=[value])
        else:
            self.storage.set_trial_state_values(trial_id, state=state.FAIL)
        self._changed()
