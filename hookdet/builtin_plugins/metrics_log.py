"""Writes every training and validation report to ``metrics.jsonl`` in the run directory
(:mod:`hookdet.runs.metrics`: the file's format and its readers), each line flushed as it is
written, so the file is complete up to the last report even after a crash.

A training metric that is NaN or infinite is warned about once per metric, from the values
already reduced for the report (no extra device sync); with ``plugin_config: {metrics_log:
{stop_on_nonfinite: true}}`` the run also stops there, with a checkpoint, as on a stop request.

A resume continues the same file: reports a killed run made after the checkpoint it resumes
from are dropped first, so the file holds each step once, as if the run had never stopped. They
are dropped when the resumed run writes its first report, not before: a resume that fails
before then leaves the file as it was.
"""
from __future__ import annotations

import logging
import math
import time
from typing import IO, Any, Dict, Optional

from hookdet.markers import hookimpl
from hookdet.plugin_manager import check_known_options
from hookdet.runs.metrics import drop_reports_after, metrics_path, report_line

logger = logging.getLogger("hookdet")



class MetricsLogPlugin:
    """The run's ``metrics.jsonl`` (chief only: reports fire there)."""

    def __init__(self, options: Optional[Dict[str, Any]] = None) -> None:
        options = dict(options or {})
        check_known_options("metrics_log", options, ("stop_on_nonfinite",))
        self._stop_on_nonfinite = bool(options.get("stop_on_nonfinite", False))
        self._file: Optional[IO[str]] = None
        self._run: Any = None
        self._nonfinite_seen: set = set()
        self._resumed_at: Optional[int] = None

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Remember the run (a resume trims its file at startup)."""
        self._run = run

    @hookimpl
    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
        """On resume, note the batch it continues from: reports after it are dropped before the
        first new one is written."""
        if checkpoint_uuid is not None:
            self._resumed_at = first_batch_idx

    @hookimpl
    def hookdet_report_metrics(
        self, run: Any, group: str, steps_completed: int, metrics: Dict[str, Any]
    ) -> None:
        """Append one line for this report."""
        if self._file is None:
            run.run_dir.mkdir(parents=True, exist_ok=True)
            if self._resumed_at is not None:
                drop_reports_after(run.run_dir, self._resumed_at)
            self._file = open(metrics_path(run.run_dir), "a", encoding="utf-8")
        if group == "training":
            self._check_finite(run, steps_completed, metrics)
        self._file.write(report_line(group, steps_completed, metrics, time.time()))
        self._file.flush()

    def _check_finite(self, run: Any, steps: int, metrics: Dict[str, Any]) -> None:
        bad = [
            name for name, value in metrics.items()
            if isinstance(value, float) and not math.isfinite(value) and name not in self._nonfinite_seen
        ]
        if not bad:
            return
        self._nonfinite_seen.update(bad)
        shown = ", ".join(f"{name}={metrics[name]}" for name in bad)
        if self._stop_on_nonfinite and run.context is not None:
            logger.warning("non-finite training metric at batch %d: %s; stopping (stop_on_nonfinite)", steps, shown)
            run.context.set_stop_requested(True)
        else:
            logger.warning(
                "non-finite training metric at batch %d: %s; training goes on "
                "(plugin_config: {metrics_log: {stop_on_nonfinite: true}} stops instead)", steps, shown,
            )

    @hookimpl
    def hookdet_unconfigure(self, run: Any) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None
