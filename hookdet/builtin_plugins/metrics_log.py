"""Writes every training and validation report to ``metrics.jsonl`` in the run directory.

One JSON object per line (``group``, ``steps_completed``, ``metrics``, ``time``), flushed as it is
written, so the file is complete up to the last report even after a crash.
"""
from __future__ import annotations

import json
import time
from typing import IO, Any, Dict, Optional

from hookdet.markers import hookimpl

FILENAME = "metrics.jsonl"


class MetricsLogPlugin:
    """The run's ``metrics.jsonl`` (chief only: reports fire there)."""

    def __init__(self) -> None:
        self._file: Optional[IO[str]] = None

    @hookimpl
    def hookdet_report_metrics(
        self, run: Any, group: str, steps_completed: int, metrics: Dict[str, Any]
    ) -> None:
        """Append one line for this report."""
        if self._file is None:
            run.run_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(run.run_dir / FILENAME, "a", encoding="utf-8")
        record = {"group": group, "steps_completed": steps_completed, "metrics": metrics, "time": time.time()}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    @hookimpl
    def hookdet_unconfigure(self, run: Any) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: Any) -> list:
    """The records of a ``metrics.jsonl`` file, in order."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
