"""``metrics.jsonl``: every training and validation report of the run, one JSON object a line
(``group``, ``steps_completed``, ``metrics``, ``time``), in the order they were made.

The run's record of its history, kept by the host (no plugin can switch it off): the loop
appends each report through :class:`ReportLog` on the chief before any plugin hears of it, and
``runs``/``show``/``compare``/``plot``, the search and the tests read it through
:func:`read_reports`. A resumed run first drops what a killed attempt reported after the batch
it continues from (:func:`drop_reports_after`), when it writes its first report and not before,
so the file holds each step once and a resume that fails before then leaves it as it was.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List

from hookdet.runs.files import METRICS_FILE


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


def report_line(group: str, steps_completed: int, metrics: Dict[str, Any], time: float) -> str:
    """One report as its line in the file."""
    return json.dumps({"group": group, "steps_completed": steps_completed, "metrics": metrics, "time": time}) + "\n"


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


class ReportLog:
    """The run's ``metrics.jsonl``, appended to as reports are made (the chief's)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._file: Any = None

    def append(self, group: str, steps_completed: int, metrics: Dict[str, Any], continues_from: int) -> None:
        """Write one report, flushed; the first one of this process first drops the reports
        past ``continues_from``, the batch this process started training from."""
        if self._file is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            drop_reports_after(self.run_dir, continues_from)
            self._file = open(metrics_path(self.run_dir), "a", encoding="utf-8")
        self._file.write(report_line(group, steps_completed, metrics, time.time()))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
