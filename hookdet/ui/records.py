"""One run directory as the web view shows it, refreshed in place.

A :class:`RunRecords` follows its run's ``metrics.jsonl`` (:class:`hookdet.runs.tail.JsonLinesTail`:
only new bytes each refresh) into one bounded series per metric, and the last lines of its logs
(:class:`hookdet.runs.logs.LogFollower`) into a bounded list; the list's row comes from the
summary the run's writer keeps (``metrics-summary.json``) and the reports after it, never the
whole file; ``run.json``, ``config.json``, ``history.jsonl`` and the checkpoints' metadata are
small and read again only when they changed. A search is :mod:`hookdet.ui.search_records`.
Nothing is locked or written; every file read is one of the run directory's own names, and is
read only while its resolved path lies inside the run directory (a symlink out of it reads as
absent).
"""
from __future__ import annotations

import collections
import datetime
import math
import os
import re
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Tuple

from hookdet.runs import index as run_index
from hookdet.runs.files import CONFIG_FILE, HISTORY_FILE, METRICS_FILE, METRICS_SUMMARY_FILE, RUN_RECORD_FILE
from hookdet.runs.logs import LogFollower, log_files, stamp_of
from hookdet.runs.metrics import ReportsSummary, read_summary
from hookdet.runs.record import read_history, read_record
from hookdet.runs.tail import JsonLinesTail
from hookdet.ui.series import SERIES_LIMIT, BoundedSeries

#: A ``run.json`` larger than this is damaged (a record is a few hundred bytes; the view reads it
#: at every refresh).
RECORD_MAX_BYTES = 1 << 20


class DamagedRecord(ValueError):
    """A run's record file that is there and cannot be read; the message says which and why."""


#: Log lines a run page keeps and shows (the newest).
LOG_LINES = 2000
#: Validations a run page's table shows (the newest).
VALIDATIONS = 2000
#: Points of a search trial's curve kept for the search page (twice this at most).
TRIAL_CURVE_POINTS = 100
#: A search trial's validations of one metric kept whole, up to twice this (then every other one).
VALIDATION_POINTS = 5000


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def seconds_between(start: Optional[str], end: Optional[str]) -> Optional[float]:
    """Seconds from one ISO time to another (``end`` None: now)."""
    try:
        first = datetime.datetime.fromisoformat(str(start))
        last = datetime.datetime.fromisoformat(end) if end else datetime.datetime.now(first.tzinfo)
    except (TypeError, ValueError):
        return None
    return max(0.0, (last - first).total_seconds())


#: Field names whose values are secrets (an S3 ``secret_key``, an Azure ``connection_string``, a
#: ``password`` or an ``auth_token`` anywhere in an experiment; not ``max_tokens`` or a
#: ``tokenizer``): shown as :data:`HIDDEN`, as Determined printed storage configurations with
#: their keys hidden.
SECRET_FIELD = re.compile(r"(^|[_-])(secret(_key|_access_key)?|password|passwd|token|access_key(_id)?|account_key|"
                          r"connection_string|credentials?|api_key|private_key)$", re.IGNORECASE)
HIDDEN = "********"


def redacted(value: Any) -> Any:
    """``value`` (a run's experiment, a search's record) with every secret's value hidden, at
    any depth; the rest as it is."""
    if isinstance(value, dict):
        return {key: HIDDEN if isinstance(key, str) and SECRET_FIELD.search(key) and item is not None
                else redacted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redacted(item) for item in value]
    return value


class RunRecords:
    """A run directory, read incrementally (see the module docstring)."""

    def __init__(self, path: Path, search_metric: Optional[str] = None) -> None:
        """``search_metric``: the run is a search's trial, read for the search page: its
        validation reports alone, one curve (of that metric) thinned to what a chart of hundreds
        of curves can show, and every validation of every metric kept (:meth:`value_at`)."""
        self.path = Path(path)
        self.curve_metric = search_metric
        self.points = SERIES_LIMIT if search_metric is None else TRIAL_CURVE_POINTS
        self.series: Dict[str, BoundedSeries] = {}
        #: The newest validations, every metric of each (a run page's table; a search's trials keep none).
        self.validations: Deque[Tuple[int, Dict[str, Any]]] = collections.deque(
            maxlen=VALIDATIONS if search_metric is None else 0)
        self.validation_count = 0  # how many came since the file was read from its start (the newest are kept)
        #: A search trial's validations of each metric, every one up to a bound (what its value at a
        #: rung or a batch count is read from; its curve above is thinned for drawing).
        self.validation_points: Dict[str, Tuple[List[int], List[float]]] = {}
        #: How many values of each series were NaN or infinite (drawn as no point; the page says how many).
        self.nonfinite: Dict[str, int] = {}
        self.last_batch = 0
        self.resets = 0
        self._tail = JsonLinesTail(self.path / METRICS_FILE, self._take, self._forget,
                                   only_lines_with=None if search_metric is None else b'"validation"')
        self._logs: Dict[int, LogFollower] = {}
        self.log_lines: Deque[str] = collections.deque(maxlen=LOG_LINES)
        self.log_count = 0
        self._read: Dict[str, Tuple[Optional[Tuple[int, int, int]], Any]] = {}  # file -> (its stamp, what it held)
        self._reports: Optional[ReportsSummary] = None
        self._resolved: Optional[Path] = None
        self._reports_tail: Optional[JsonLinesTail] = None

    # ------------------------------------------------------------------ metrics

    def value_at(self, metric: str, at: str, smaller: bool) -> Optional[float]:
        """A search trial's value of validation ``metric`` chosen by ``at``: ``best``, ``last``,
        or ``batch:N``, the first validation at or past batch N (what it measured when it got
        that far: a trial that never did has none, and is not compared with those that did)."""
        xs, ys = self.validation_points.get(metric, ([], []))
        if not xs:
            return None
        if at == "last":
            return ys[-1]
        if at.startswith("batch:"):
            wanted = float(at.split(":", 1)[1])
            return next((y for x, y in zip(xs, ys) if x >= wanted), None)
        if at == "best":
            return min(ys) if smaller else max(ys)
        return None  # a point this trial has no length for (a rung its bracket lacks)

    def owns(self, path: Path) -> bool:
        """Whether ``path``, resolved, lies inside the run directory (resolved once: the catalog
        checks the directory itself at every scan). A file of the directory itself that is no
        symlink is inside without resolving it (the list asks of every run's files each time)."""
        path = Path(path)
        try:
            if path.parent == self.path and not path.is_symlink():
                return True
            if self._resolved is None:
                self._resolved = self.path.resolve()
            return path.resolve().is_relative_to(self._resolved)
        except OSError:
            return False

    def refresh(self) -> None:
        """Read what the run appended since the last refresh."""
        if not self.owns(self.path / METRICS_FILE):
            return
        self._tail.catch_up()

    def _take(self, report: Dict[str, Any]) -> None:
        metrics, batch = report.get("metrics"), report.get("steps_completed")
        if not isinstance(metrics, dict) or not isinstance(batch, int):
            return
        validation = report.get("group") == "validation"
        group = "validation" if validation else "training"
        self.last_batch = max(self.last_batch, batch)
        numbers: Dict[str, float] = {}
        for name, value in metrics.items():
            if is_number(value):
                numbers[name] = float(value)
            elif isinstance(value, float):  # NaN or inf: no point, but counted
                self.nonfinite[f"{group}/{name}"] = self.nonfinite.get(f"{group}/{name}", 0) + 1
        if validation and self.validations.maxlen:
            self.validations.append((batch, {name: numbers.get(name, str(value)) for name, value in metrics.items()}))
            self.validation_count += 1
        if validation and self.curve_metric is not None:  # a search's trial: every validation, one curve
            for name, value in numbers.items():
                xs, ys = self.validation_points.setdefault(name, ([], []))
                xs.append(batch)
                ys.append(value)
                if len(xs) > 2 * VALIDATION_POINTS:  # past the bound: every other one
                    xs[:], ys[:] = xs[::2], ys[::2]
            numbers = {self.curve_metric: numbers[self.curve_metric]} if self.curve_metric in numbers else {}
        for name, value in numbers.items():
            key = f"{group}/{name}"
            series = self.series.get(key)
            if series is None:
                series = self.series[key] = BoundedSeries(self.points)
            series.add(batch, value)

    def _forget(self) -> None:
        self.series, self.nonfinite, self.validation_points, self.last_batch = {}, {}, {}, 0
        self.validations.clear()
        self.validation_count = 0
        self.resets += 1

    # ------------------------------------------------------------------ files read when asked

    def record(self) -> Dict[str, Any]:
        """``run.json``, read every time: a running run whose process died reads as killed. One
        that is there but cannot be read (torn, not an object, larger than any record is)
        raises :class:`DamagedRecord`: the run is shown as damaged, with why."""
        path = self.path / RUN_RECORD_FILE
        if not self.owns(path) or not os.path.lexists(path):
            return {}
        try:
            size = os.stat(path).st_size
        except OSError as error:
            raise DamagedRecord(f"{RUN_RECORD_FILE}: {error.strerror or error}") from None
        if size > RECORD_MAX_BYTES:
            raise DamagedRecord(f"{RUN_RECORD_FILE}: {size} bytes, more than a run's record ever holds")
        record = self._read_when_changed(RUN_RECORD_FILE, lambda: read_record(self.path, check_alive=False), None)
        if record is None:
            raise DamagedRecord(f"{RUN_RECORD_FILE}: unreadable (not a JSON object)")
        if record.get("state") == "running":  # is its process still there? (asked every time)
            record = read_record(self.path) or record
        return dict(record)

    def config(self) -> Dict[str, Any]:
        """The run's experiment, its secrets hidden (:func:`redacted`)."""
        return self._read_when_changed(CONFIG_FILE, lambda: redacted(run_index.read_config(self.path)), {})

    def history(self) -> List[Dict[str, Any]]:
        return self._read_when_changed(HISTORY_FILE, lambda: read_history(self.path), [])

    def _read_when_changed(self, name: str, read: Any, absent: Any) -> Any:
        """What the run's file ``name`` holds, read again only when it was replaced or its size or
        time changed (the list asks every run each time it refreshes)."""
        path = self.path / name
        try:
            status = os.stat(path)
            stamp: Optional[Tuple[int, int, int]] = (status.st_ino, status.st_mtime_ns, status.st_size)
        except OSError:
            stamp = None
        kept = self._read.get(name)
        if kept is None or kept[0] != stamp:
            kept = self._read[name] = (stamp, read() if stamp is not None and self.owns(path) else absent)
        return kept[1]

    def reports_summary(self) -> ReportsSummary:
        """What the run's reports come to: its ``metrics-summary.json``, caught up with the
        reports written since (all of them for a run without one, or whose file was replaced)."""
        if self._reports_tail is None:
            self._reports = read_summary(self.path) if self.owns(self.path / METRICS_SUMMARY_FILE) else None
            self._reports_tail = JsonLinesTail(self.path / METRICS_FILE, lambda report: self._reports.take(report),
                                               self._forget_reports)
            if self._reports is not None and self._reports.file:
                self._reports_tail.start_from(tuple(self._reports.file), self._reports.bytes)
            self._reports = self._reports or ReportsSummary()
        if self.owns(self.path / METRICS_FILE):
            self._reports_tail.catch_up()
        assert self._reports is not None
        return self._reports

    def _forget_reports(self) -> None:
        self._reports = ReportsSummary()  # the file was replaced: it is read from its start

    def summary(self, state: Optional[str] = None) -> Dict[str, Any]:
        """The list's row: name, state, progress, best searcher metric, times (from the run's
        records and the summary of its reports: never its whole ``metrics.jsonl``)."""
        reports = self.reports_summary()
        record, searcher = self.record(), (self.config().get("searcher") or {})
        metric = record.get("searcher_metric") or searcher.get("metric")
        smaller = bool(record.get("smaller_is_better", searcher.get("smaller_is_better", True)))
        return {
            "name": self.path.name,
            "kind": "run",
            "state": state or record.get("state", "unknown"),
            "batches": max(int(record.get("batches_trained") or 0), reports.last_batch),
            "max_batches": record.get("max_batches"),
            "metric": metric,
            "best": reports.best(metric, smaller),
            "started": record.get("created") or record.get("started") or "",
            "seconds": self.training_seconds(record),
            # a Core API script's own report of how far it is (0 to 1) and what it does
            "progress": record.get("progress") if isinstance(record.get("progress"), (int, float)) else None,
            "status": record.get("status") if isinstance(record.get("status"), str) else None,
        }

    def training_seconds(self, record: Dict[str, Any]) -> Optional[float]:
        """How long the run has run: each start to its end over its history (a resumed run's
        attempts added up), the last one to now while it runs."""
        history = self.history()
        starts = [entry for entry in history if entry.get("event") in ("started", "resumed")]
        if not starts:
            ended = None if record.get("state") == "running" else record.get("ended")
            return seconds_between(record.get("started"), ended)
        total, start = 0.0, None
        for entry in history:
            if entry.get("event") in ("started", "resumed"):
                start = entry.get("time")
            elif start is not None:
                total += seconds_between(start, entry.get("time")) or 0.0
                start = None
        if start is not None and record.get("state") == "running":
            total += seconds_between(start, None) or 0.0
        return total

    # ------------------------------------------------------------------ logs

    def new_log_lines(self) -> int:
        """Read the run's new log lines into :attr:`log_lines`; how many came."""
        for rank, paths in log_files(self.path).items():
            paths = [path for path in paths if self.owns(path)]
            if rank not in self._logs and paths:
                self._logs[rank] = LogFollower(paths[-1], already=paths[:-1][-1:])
        followed = [follower for follower in self._logs.values() if self.owns(follower.path)]
        new = sorted((line for follower in followed for line in follower.new_lines()), key=stamp_of)
        self.log_lines.extend(new)
        self.log_count += len(new)
        return len(new)

    def checkpoints(self) -> Tuple[str, List[Dict[str, Any]]]:
        """Where the checkpoints are, and one row per checkpoint the run wrote."""
        where, found = run_index.checkpoints_in(self.path)
        rows = []
        for location, metadata in found:
            local = self.path / location
            problem = _size_problem(local) if local.is_dir() else None
            rows.append({
                "id": Path(location).name, "location": location,
                "batch": metadata.get("steps_completed"),
                "bytes": sum(int(entry.get("size") or 0) for entry in (metadata.get("files") or {}).values()),
                "metrics": ({str(metadata.get("searcher_metric")): metadata["validation_metric"]}
                            if is_number(metadata.get("validation_metric")) else {}),
                "intact": problem is None, "problem": problem,
            })
        return where, rows


def _size_problem(directory: Path) -> Optional[str]:
    """Why a local checkpoint is not whole by its manifest's sizes, or None (no file is read)."""
    from hookdet.checkpoints.format import CheckpointError, verify

    try:
        verify(directory, sizes_only=True)
    except (CheckpointError, OSError) as error:
        return str(error)
    return None
