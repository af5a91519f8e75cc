"""Progress of training and validation, on the chief: a live view in a terminal, log lines elsewhere.

In a terminal (the chief's stderr is a tty) :class:`hookdet.metrics.live_view.LiveView` draws the epoch,
the batch of the total, rate and ETA, a validation bar while one runs, and the latest training
and validation metrics, each group on its own labelled row (the searcher metric first). It is
redrawn a few times a second by its own thread from what is already on the host (the loop's
batch counter, the run's ``workload_metrics`` for the latest batch's loss), so the training
loop calls no per-batch hook for it and no metric forces a device synchronisation.

Anywhere else (a pipe, a file, a CI log) every report becomes one plain log line::

    training: batch 45/450 (10%) loss=0.2345
    validation: batch 45/450 (10%) validation_loss=0.1234 accuracy=0.9722

and, so that a log never goes silent (a long validation, slow batches), a progress line is
written whenever nothing was for ``log_every_s`` seconds (``plugin_config.progress.log_every_s``,
default 30; 0 turns these lines off)::

    training: batch 120/450 (26%), epoch 2/5, 3.9 batch/s, ETA 0:01:25
    validation: batch 12/50 (24%), 1.25 s/batch, ETA 0:00:48

Under ``hookdet run``'s launcher in a terminal, the launcher draws the run's view, with a row
per rank (:mod:`hookdet.distributed.ranks_view`), and says so in the environment
(``LAUNCHER_DRAWS_ENV``): the chief then draws nothing and prints no progress lines.

Validation counts its batches with ``hookdet_validation_batch_end``, implemented by a helper
(``progress:validation``) registered on the chief only; training batches need no hook at all.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from typing import IO, Any, Dict, Optional

import pydantic

from hookdet.plugin import (
    LAUNCHER_DRAWS_ENV,
    REPORTED_PROGRESS,
    WORKLOAD_METRICS,
    LiveView,
    format_duration,
    hookimpl,
    options_for,
    ordered_metrics,
)

logger = logging.getLogger("hookdet")

NAME = "progress"
#: Default longest silence, in seconds, of a log off a terminal.
LOG_EVERY_S = 30.0
#: The name the validation batch counter is registered under (chief only).
COUNTER_NAME = "progress:validation"


def format_metrics(metrics: Dict[str, Any], first: Optional[str] = None) -> str:
    """``name=value`` pairs, numbers to 4 significant digits, non-numbers left out, ``first``
    (the searcher metric) first."""
    return " ".join(ordered_metrics(metrics, first))


class ProgressPlugin:
    """Training and validation progress for the chief."""

    class Options(pydantic.BaseModel):
        """``plugin_config.progress``."""

        model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
        log_every_s: float = pydantic.Field(
            LOG_EVERY_S, ge=0, description="seconds between progress lines when stderr is not a terminal"
        )

    def __init__(self, options: Any = None) -> None:
        self.log_every_s = options_for(ProgressPlugin, options, NAME).log_every_s
        self._run: Any = None
        self._stream: Optional[IO[str]] = None
        self._view: Optional[LiveView] = None
        self._heartbeat: Optional[_Heartbeat] = None
        self.validation_batches = 0
        self.validation_total: Optional[int] = None
        self.validating = False
        #: (monotonic time, batches) when training and the current validation started.
        self.phase_started: Dict[str, tuple] = {}
        #: The launcher draws the view: print nothing.
        self.quiet = False

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Remember the run."""
        self._run = run

    @hookimpl
    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
        """Chief only: open the live view in a terminal, else start the heartbeat lines (neither
        when the launcher draws the view)."""
        if not self._run.is_chief:
            return
        if os.environ.get(LAUNCHER_DRAWS_ENV):
            self.quiet = True
            return
        self._run.plugins.register(COUNTER_NAME, _ValidationCounter(self))
        self._stream = sys.stderr
        if _is_terminal(self._stream):
            self._view = LiveView(
                self._stream,
                batches_trained=lambda: self._run.state.batches_trained,
                validation_batches=lambda: self.validation_batches,
                searcher_metric=self._run.config.searcher.metric,
                workload=lambda: self._run.stash.get(WORKLOAD_METRICS, None),
                reported=lambda: self._run.stash.get(REPORTED_PROGRESS, {}),
            )
            self._view.open()
        elif self.log_every_s > 0:
            self._heartbeat = _Heartbeat(self, self.log_every_s)
            self._heartbeat.start()

    @hookimpl
    def on_training_start(self) -> None:
        """Show the training bar from the batch training starts at (the resume point)."""
        self.phase_started["training"] = (time.monotonic(), self._run.state.batches_trained)
        if self._view is not None:
            self._view.training_started(self._run.max_batches, self._run.state.epoch_length)

    @hookimpl
    def on_validation_start(self) -> None:
        """Count this validation's batches; its total is the previous validation's count, or
        before the first one the validation loader's length."""
        self.validation_batches = 0
        self.validating = True
        self.phase_started["validation"] = (time.monotonic(), 0)
        if self._view is not None:
            self._view.validation_started(self.expected_validation_batches)

    @property
    def run(self) -> Any:
        """The run this plugin shows (None before ``hookdet_configure``)."""
        return self._run

    @property
    def expected_validation_batches(self) -> Optional[int]:
        """How many batches this validation has: the last one's count, else the loader's length."""
        return self.validation_total or (self._run.validation_length if self._run is not None else None)

    @hookimpl
    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        """Remember how many batches a validation has (the set does not change)."""
        self.validating = False
        if self.validation_batches:
            self.validation_total = self.validation_batches
        if self._view is not None:
            self._view.validation_ended()

    @hookimpl
    def hookdet_report_metrics(
        self, run: Any, group: str, steps_completed: int, metrics: Dict[str, Any]
    ) -> None:
        """Show the report: in the view's metric rows, or as one log line (fires on the chief)."""
        if self.quiet:
            return
        if self._view is not None:
            self._view.show_metrics(group, steps_completed, metrics)
            return
        first = run.config.searcher.metric if group == "validation" else None
        self.say("%s: %s %s", group, self.where(steps_completed), format_metrics(metrics, first))

    def where(self, batches: int, total: Optional[int] = None) -> str:
        """``batch 45/450 (10%)`` (training, by default) or of ``total``; for a Core API script,
        which names no length, its own ``report_progress``/``set_status`` (``batch 45 (10%), evaluating``)."""
        training = total is None
        total = self._run.max_batches if total is None else total
        text = f"batch {batches}"
        if total:
            text += f"/{total} ({100 * batches // total}%)"
        elif training:  # a Core API script says how far it is itself
            reported = self._run.stash.get(REPORTED_PROGRESS, {})
            if reported.get("progress") is not None:
                text += f" ({int(100 * reported['progress'])}%)"
            if reported.get("status"):
                text += f", {reported['status']}"
        return text

    def say(self, message: str, *args: Any) -> None:
        """Log one progress line, and note when, for the heartbeat."""
        if self._heartbeat is not None:
            self._heartbeat.spoke()
        logger.info(message, *args)

    @hookimpl
    def on_trial_shutdown(self) -> None:
        """Close the view (its last frame stays) or stop the heartbeat."""
        self._close()

    @hookimpl
    def hookdet_unconfigure(self, run: Any) -> None:
        """Close anything left open (training raised before the trial shut down)."""
        self._close()

    def _close(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self._run is not None:
            self._run.plugins.unregister(COUNTER_NAME)


class _ValidationCounter:
    """Counts validation batches on the host (validation only: training batches need no hook)."""

    def __init__(self, progress: ProgressPlugin) -> None:
        self._progress = progress

    @hookimpl
    def hookdet_validation_batch_end(self, context: Any, batch_idx: int) -> None:
        """One more validation batch done."""
        self._progress.validation_batches = batch_idx + 1


class _Heartbeat(threading.Thread):
    """Writes a progress line whenever the log was silent for ``every_s`` seconds."""

    def __init__(self, progress: ProgressPlugin, every_s: float) -> None:
        super().__init__(name="hookdet-progress", daemon=True)
        self._progress = progress
        self._every_s = every_s
        self._stopped = threading.Event()
        self._last_line = time.monotonic()

    def spoke(self) -> None:
        """A line was just written."""
        self._last_line = time.monotonic()

    def stop(self) -> None:
        """End the thread (at once)."""
        self._stopped.set()
        self.join(timeout=5)

    def run(self) -> None:
        while not self._stopped.wait(max(0.05, self._last_line + self._every_s - time.monotonic())):
            if time.monotonic() - self._last_line >= self._every_s:
                self._progress.say("%s", self._line())

    def _line(self) -> str:
        progress, run = self._progress, self._progress.run
        if progress.validating:
            done = progress.validation_batches
            line = "validation: " + progress.where(done, progress.expected_validation_batches or 0)
            rate, remaining = self._rate("validation", done, progress.expected_validation_batches)
        else:
            done = run.state.batches_trained
            line = "training: " + progress.where(done)
            if run.state.epoch_length and run.max_batches:
                epochs = math.ceil(run.max_batches / run.state.epoch_length)
                line += f", epoch {min(done, run.max_batches - 1) // run.state.epoch_length + 1}/{epochs}"
            rate, remaining = self._rate("training", done, run.max_batches)
        if rate:
            line += f", {rate:.3g} batch/s" if rate >= 1 else f", {1 / rate:.3g} s/batch"
        if remaining is not None:
            line += f", ETA {format_duration(remaining)}"
        return line

    def _rate(self, what: str, done: int, total: Optional[int]) -> tuple:
        """(batches per second since this phase started, seconds left or None)."""
        started = self._progress.phase_started.get(what)
        if started is None:
            return None, None
        seconds, batches = time.monotonic() - started[0], done - started[1]
        if seconds <= 0 or batches <= 0:
            return None, None
        rate = batches / seconds
        return rate, ((total - done) / rate if total else None)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
