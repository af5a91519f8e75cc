"""Watches the training reports: a metric that is NaN or infinite is warned about once per
metric, from the values already reduced for the report (no extra device sync); with
``plugin_config: {metrics_log: {stop_on_nonfinite: true}}`` the run also stops there, with a
checkpoint, as on a stop request.

The reports themselves are the run's record, ``metrics.jsonl``, which the host writes
(:mod:`hookdet.runs.metrics`) whatever plugins run: ``no:metrics_log`` turns the watch off,
never the history that ``runs``, ``show``, ``--resume`` and the search read.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Dict

import pydantic

from hookdet.plugin import hookimpl, options_for

logger = logging.getLogger("hookdet")


class MetricsLogPlugin:
    """Warns of (or stops at) non-finite training metrics (chief only: reports fire there)."""

    class Options(pydantic.BaseModel):
        """``plugin_config.metrics_log``."""

        model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
        stop_on_nonfinite: bool = pydantic.Field(
            False, description="stop the run at a non-finite training metric instead of warning"
        )

    def __init__(self, options: Any = None) -> None:
        self._stop_on_nonfinite = options_for(MetricsLogPlugin, options, "metrics_log").stop_on_nonfinite
        self._nonfinite_seen: set = set()

    @hookimpl
    def hookdet_report_metrics(
        self, run: Any, group: str, steps_completed: int, metrics: Dict[str, Any]
    ) -> None:
        """Check a training report's values."""
        if group != "training":
            return
        bad = [
            name for name, value in metrics.items()
            if isinstance(value, float) and not math.isfinite(value) and name not in self._nonfinite_seen
        ]
        if not bad:
            return
        self._nonfinite_seen.update(bad)
        shown = ", ".join(f"{name}={metrics[name]}" for name in bad)
        if self._stop_on_nonfinite and run.context is not None:
            logger.warning("non-finite training metric at batch %d: %s; stopping (stop_on_nonfinite)", steps_completed, shown)
            run.context.set_stop_requested(True)
        else:
            logger.warning(
                "non-finite training metric at batch %d: %s; training goes on "
                "(plugin_config: {metrics_log: {stop_on_nonfinite: true}} stops instead)", steps_completed, shown,
            )
