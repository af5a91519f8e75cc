"""Progress of training and validation, on the chief: tqdm bars in a terminal, log lines elsewhere.

In a terminal (the chief's stderr is a tty) one bar counts training batches towards the fit's
``max_length`` and a second, transient one counts each validation's batches (its total is the
previous validation's count: the validation set does not change). The training bar shows the
latest reported training and validation metrics; console log messages are routed around the bars
so they do not tear them.

Anywhere else (a pipe, a file, a CI log) bars would be noise, so reports become plain log lines
instead::

    training: batch 45/450 (10%) loss=0.2345
    validation: batch 45/450 (10%) validation_loss=0.1234 accuracy=0.9722

Every validation is logged. A training report is logged when ``log_every_s`` seconds
(``plugin_config.progress.log_every_s``, default 5; 0 logs every report) have passed since the
last training line, and the one at the end of training always is, so a fast loop does not flood
the log (``metrics.jsonl`` holds every report).

Bars advance on ``hookdet_train_batch_end`` / ``hookdet_validation_batch_end`` without looking at
the batch's metric tensors (no device sync); metrics are shown only at reports. Those two
per-batch hooks belong to a helper (``progress:bars``) registered only while bars are shown, so
off a terminal, and on every rank but the chief, the loop calls no per-batch hook for progress.
"""
from __future__ import annotations

import contextlib
import logging
import numbers
import sys
import time
from typing import IO, Any, Dict, Optional

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from hookdet.markers import hookimpl
from hookdet.plugin_manager import check_known_options, read_seconds_option

logger = logging.getLogger("hookdet")

NAME = "progress"
#: Default least seconds between two plain training lines.
LOG_EVERY_S = 5.0
#: The name the per-batch helper is registered under while bars are shown.
BARS_NAME = "progress:bars"


def format_metrics(metrics: Dict[str, Any]) -> str:
    """``name=value`` pairs, numbers to 4 significant digits, non-numbers left out."""
    parts = []
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        shown = str(value) if isinstance(value, numbers.Integral) else f"{value:.4g}"
        parts.append(f"{name}={shown}")
    return " ".join(parts)


class ProgressPlugin:
    """Training and validation progress for the chief."""

    def __init__(self, options: Optional[Dict[str, Any]] = None) -> None:
        options = dict(options or {})
        check_known_options(NAME, options, ("log_every_s",))
        self.log_every_s = read_seconds_option(NAME, options, "log_every_s", LOG_EVERY_S)
        self._next_training_line = 0.0
        self._run: Any = None
        self._stream: Optional[IO[str]] = None
        self._interactive = False
        self._training_bar: Optional[tqdm] = None
        self._validation_bar: Optional[tqdm] = None
        self._validation_batches: Optional[int] = None
        self._latest: Dict[str, str] = {}
        self._log_redirect: Optional[contextlib.ExitStack] = None

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Remember the run."""
        self._run = run

    @hookimpl
    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
        """Decide bars or lines (chief only) and route console logging around the bars."""
        if not self._run.is_chief:
            return
        self._stream = sys.stderr
        self._interactive = _is_terminal(self._stream)
        if self._interactive:
            self._log_redirect = contextlib.ExitStack()
            self._log_redirect.enter_context(logging_redirect_tqdm())
            self._run.plugins.register(BARS_NAME, _BarAdvancer(self))

    @hookimpl
    def on_training_start(self) -> None:
        """Open the training bar at the batch training starts from (the resume point)."""
        if not self._interactive:
            return
        self._training_bar = tqdm(
            total=self._run.max_batches,
            initial=self._run.state.batches_trained,
            desc="training",
            unit="batch",
            file=self._stream,
            dynamic_ncols=True,
        )
        self._show_latest()

    @hookimpl
    def on_validation_start(self) -> None:
        """Open a transient validation bar."""
        if not self._interactive:
            return
        self._validation_bar = tqdm(
            total=self._validation_batches,
            desc="validation",
            unit="batch",
            file=self._stream,
            dynamic_ncols=True,
            leave=False,
        )

    @hookimpl
    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        """Close the validation bar; its count is the next validation's total."""
        if self._validation_bar is not None:
            if self._validation_bar.n:
                self._validation_batches = self._validation_bar.n
            self._validation_bar.close()
            self._validation_bar = None

    @hookimpl
    def hookdet_report_metrics(
        self, run: Any, group: str, steps_completed: int, metrics: Dict[str, Any]
    ) -> None:
        """Show the report: on the training bar, or as one log line (fires on the chief)."""
        if self._interactive:
            self._latest[group] = format_metrics(metrics)
            self._show_latest()
            return
        total = run.max_batches
        if group == "training" and steps_completed != total:
            now = time.monotonic()
            if now < self._next_training_line:
                return
            self._next_training_line = now + self.log_every_s
        where = f"batch {steps_completed}"
        if total:
            where += f"/{total} ({100 * steps_completed // total}%)"
        logger.info("%s: %s %s", group, where, format_metrics(metrics))

    def _show_latest(self) -> None:
        if self._training_bar is not None:
            shown = " ".join(text for text in self._latest.values() if text)
            self._training_bar.set_postfix_str(shown, refresh=True)

    @hookimpl
    def on_trial_shutdown(self) -> None:
        """Close the bars and give console logging back."""
        self._close()

    @hookimpl
    def hookdet_unconfigure(self, run: Any) -> None:
        """Close anything left open (training raised before the trial shut down)."""
        self._close()

    def _close(self) -> None:
        for bar in (self._validation_bar, self._training_bar):
            if bar is not None:
                bar.close()
        self._validation_bar = self._training_bar = None
        if self._log_redirect is not None:
            self._log_redirect.close()
            self._log_redirect = None
        if self._run is not None:
            self._run.plugins.unregister(BARS_NAME)


class _BarAdvancer:
    """The per-batch half of the progress plugin, registered only while bars are shown."""

    def __init__(self, progress: ProgressPlugin) -> None:
        self._progress = progress

    @hookimpl
    def hookdet_train_batch_end(self, context: Any, batch_idx: int, metrics: Dict[str, Any]) -> None:
        """Advance the training bar by one batch."""
        bar = self._progress._training_bar
        if bar is not None:
            bar.update(1)

    @hookimpl
    def hookdet_validation_batch_end(self, context: Any, batch_idx: int) -> None:
        """Advance the validation bar by one batch."""
        bar = self._progress._validation_bar
        if bar is not None:
            bar.update(1)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
