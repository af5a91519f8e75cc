"""``metrics.jsonl``: every training and validation report of the run, one JSON object a line
(``group``, ``steps_completed``, ``metrics``, ``time``), in the order they were made.

The run's record of its history, kept by the host (no plugin can switch it off): the loop
appends each report through :class:`ReportLog` on the chief before any plugin hears of it, and
``runs``/``show``/``compare``/``plot``, the search and the tests read it through
:func:`read_reports`. A resumed run first drops what a killed attempt reported after the batch
it continues from (:func:`drop_reports_after`), when it writes its first report and not before,
so the file holds each step once and a resume that fails before then leaves it as it was.

Beside it, ``metrics-summary.json`` says in brief what the file holds (:class:`ReportsSummary`:
how many reports, the last batch and time, each validation metric's smallest and largest value)
and up to which byte of which file, so a reader of many runs (``hookdet ui``'s list) reads a few
hundred bytes a run and only the reports written since, whatever the run's length. The writer
keeps it current: at each validation, at most every :data:`SUMMARY_EVERY_S` seconds of training
reports, and at the end; a summary behind its file is caught up by reading the bytes after it.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from hookdet.runs.files import METRICS_FILE, METRICS_SUMMARY_FILE

#: Seconds between two writes of the summary while only training reports come.
SUMMARY_EVERY_S = 2.0


def metrics_path(run_dir: Path) -> Path:
    """Where ``run_dir``'s reports are."""
    return Path(run_dir) / METRICS_FILE


def read_reports(run_dir: Path) -> List[Dict[str, Any]]:
    """The run's reports, in order ([] when it has none); a line cut short by a kill is skipped."""
    reports = []
    try:
        with open(metrics_path(run_dir), encoding="utf-8") as handle:
            for line in handle:
                try:
                    report = json.loads(line)
                except ValueError:
                    continue
                if isinstance(report, dict) and isinstance(report.get("metrics"), dict):
                    reports.append(report)
    except OSError:
        pass
    return reports


def drop_reports_after(run_dir: Path, steps: int) -> int:
    """Rewrite the file without the reports past batch ``steps`` (and without a torn last
    line), atomically. Returns how many lines were dropped."""
    path = metrics_path(run_dir)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:  # a line cut short by a kill
                dropped += 1
                continue
            if isinstance(record, dict) and record.get("steps_completed", 0) > steps:
                dropped += 1
                continue
            kept.append(line if line.endswith("\n") else line + "\n")
    if dropped:
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text("".join(kept), encoding="utf-8")
        os.replace(partial, path)
    return dropped


class ReportsSummary:
    """What a run's reports come to, folded one report at a time (see the module's docstring):
    ``reports``, ``last_batch``, ``last_time``, and for each validation metric its ``smallest``
    and ``largest`` finite value; ``file`` and ``bytes`` say which ``metrics.jsonl`` (its device
    and inode) and how much of it the summary covers."""

    def __init__(self, fields: Optional[Dict[str, Any]] = None) -> None:
        fields = fields or {}
        self.reports = int(fields.get("reports") or 0)
        self.last_batch = int(fields.get("last_batch") or 0)
        self.last_time: Optional[float] = fields.get("last_time")
        self.smallest: Dict[str, float] = dict(fields.get("smallest") or {})
        self.largest: Dict[str, float] = dict(fields.get("largest") or {})
        self.file: Optional[List[int]] = fields.get("file")
        self.bytes = int(fields.get("bytes") or 0)

    def take(self, report: Dict[str, Any]) -> None:
        """Fold in one report (a line of ``metrics.jsonl`` as a dict); a malformed one is skipped."""
        metrics, batch = report.get("metrics"), report.get("steps_completed")
        if not isinstance(metrics, dict) or not isinstance(batch, int) or isinstance(batch, bool):
            return
        self.reports += 1
        self.last_batch = max(self.last_batch, batch)
        if isinstance(report.get("time"), (int, float)):
            self.last_time = report["time"]
        if report.get("group") != "validation":
            return
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.smallest[name] = min(value, self.smallest.get(name, value))
                self.largest[name] = max(value, self.largest.get(name, value))

    def best(self, metric: Optional[str], smaller_is_better: bool) -> Optional[float]:
        """The best finite value the validation ``metric`` took."""
        return (self.smallest if smaller_is_better else self.largest).get(metric or "")

    def fields(self) -> Dict[str, Any]:
        return {"reports": self.reports, "last_batch": self.last_batch, "last_time": self.last_time,
                "smallest": self.smallest, "largest": self.largest, "file": self.file, "bytes": self.bytes}


def read_summary(run_dir: Path) -> Optional[ReportsSummary]:
    """The run's ``metrics-summary.json`` when it describes the ``metrics.jsonl`` there now (the
    same file, no longer than it is); None when there is none, it is damaged, or it is of a
    file a resume replaced: then the reports are read from the start."""
    try:
        fields = json.loads((Path(run_dir) / METRICS_SUMMARY_FILE).read_bytes())
        summary = ReportsSummary(fields)
        status = os.stat(metrics_path(run_dir))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if summary.file != [status.st_dev, status.st_ino] or summary.bytes > status.st_size:
        return None
    return summary


def summarize(run_dir: Path) -> ReportsSummary:
    """A summary of every report ``metrics.jsonl`` holds now, and of which file, up to its end."""
    summary = ReportsSummary()
    for report in read_reports(run_dir):
        summary.take(report)
    try:
        status = os.stat(metrics_path(run_dir))
        summary.file, summary.bytes = [status.st_dev, status.st_ino], status.st_size
    except OSError:
        pass
    return summary


def write_summary(run_dir: Path, summary: ReportsSummary) -> None:
    """``metrics-summary.json``, replaced atomically."""
    path = Path(run_dir) / METRICS_SUMMARY_FILE
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(summary.fields()), encoding="utf-8")
    os.replace(partial, path)


class ReportLog:
    """The run's ``metrics.jsonl``, appended to as reports are made (the chief's), and its
    ``metrics-summary.json`` kept current beside it."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._file: Any = None
        self.summary = ReportsSummary()
        self._summary_written = 0.0

    def append(self, group: str, steps_completed: int, metrics: Dict[str, Any], continues_from: int) -> None:
        """Write one report, flushed; the first one of this process first drops the reports
        past ``continues_from``, the batch this process started training from, and sums up
        the reports the file keeps."""
        if self._file is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            drop_reports_after(self.run_dir, continues_from)
            self._file = open(metrics_path(self.run_dir), "ab")
            self.summary = summarize(self.run_dir)
        report = {"group": group, "steps_completed": steps_completed, "metrics": metrics, "time": time.time()}
        line = (json.dumps(report) + "\n").encode("utf-8")
        self._file.write(line)
        self._file.flush()
        self.summary.take(report)
        self.summary.bytes += len(line)
        if group == "validation" or time.monotonic() - self._summary_written >= SUMMARY_EVERY_S:
            self._write_summary()

    def _write_summary(self) -> None:
        write_summary(self.run_dir, self.summary)
        self._summary_written = time.monotonic()

    def close(self) -> None:
        if self._file is not None:
            self._write_summary()
            self._file.close()
            self._file = None
