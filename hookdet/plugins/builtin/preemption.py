"""SIGTERM, SIGINT and SIGHUP stop training gracefully: finish the batch, checkpoint, exit.

The first signal asks the trial to stop (``context.set_stop_requested(True)``) and marks the run
preempted, so ``hookdet run`` exits with :data:`PREEMPTED_EXIT_CODE` after the checkpoint is
written; ``hookdet run CONFIG --resume RUN_DIR`` then continues exactly. The handler only sets
flags: the batch in flight, a validation due at that batch and a checkpoint being written all
finish normally. A signal that arrives after training completed changes nothing (the run exits
0). A second SIGINT interrupts at once (Ctrl-C twice). Previous handlers are restored when the
run ends.

A search's segment ends the same way: under ``HOOKDET_SEGMENT_END`` (set by the search worker,
e.g. ``8 batches``) the first validation at or past that length pauses the trial (checkpoint,
exit 0, ``exit_reason`` ``paused``), as Determined's searcher stops a trial through its
preemption path: a ``module:Class`` trial, a Trainer-API script (``Trainer.fit`` returns) and a
launched command all stop there, whatever length they train to.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any, Dict, Optional

from hookdet.plugin import PREEMPTED_EXIT_CODE, ExitReason  # noqa: F401 (``hookdet run``'s status after a stop)
from hookdet.plugin import SEGMENT_END_ENV, Length, hookimpl, length_in_batches

logger = logging.getLogger("hookdet")

#: SIGHUP (the terminal closed, ``ssh`` dropped) stops like SIGTERM, as it does under the launcher.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())


class PreemptionPlugin:
    """Turns stop signals into a checkpoint-and-exit at the next batch boundary."""

    def __init__(self) -> None:
        self._previous: Dict[int, Any] = {}
        self._run: Any = None
        self.received: int = 0
        self.segment_end: Optional[Length] = None

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Install the handlers (signals can only be handled in the main thread)."""
        self._run = run
        self.segment_end = segment_end_from_environment()
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum
        logger.warning(
            "received %s: finishing the current batch, then checkpointing and stopping",
            signal.Signals(signum).name,
        )
        if self._run.exit_reason is None:  # a run that already finished stays finished
            self._run.exit_reason = ExitReason.PREEMPTED
        if self._run.context is not None:
            self._run.context.set_stop_requested(True)

    @hookimpl
    def on_training_start(self) -> None:
        """A signal that arrived while the trial was being built stops training now; so does a
        search segment resumed where it had already ended."""
        if self.received and self._run.context is not None:
            self._run.context.set_stop_requested(True)
        self._pause_if_segment_ended(validated_now=False)

    @hookimpl
    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        """Pause at the first validation at or past the search segment's end, if any."""
        self._pause_if_segment_ended(validated_now=True)

    def _pause_if_segment_ended(self, validated_now: bool) -> None:
        """Pause when the search segment's end is reached and validated: at that validation, or
        at the start of a segment resumed from a checkpoint taken there (a stop that raced the
        pause); the search's decision then reads that validation, as without the stop."""
        run = self._run
        if self.segment_end is None or run.exit_reason is not None or run.context is None:
            return
        state = run.state
        end = length_in_batches(self.segment_end, global_batch_size=run.hparams.get("global_batch_size"),
                                epoch_length_batches=state.epoch_length)
        validated = validated_now or state.last_validation_batch == state.batches_trained
        if state.batches_trained >= end and validated:
            logger.info("search segment ends at %s: pausing after the validation at batch %d",
                        _described(self.segment_end), state.batches_trained)
            run.exit_reason = ExitReason.PAUSED
            run.context.set_stop_requested(True)

    @hookimpl
    def hookdet_unconfigure(self, run: Any) -> None:
        """Restore the handlers that were there before."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


def segment_end_from_environment() -> Optional[Length]:
    """The search segment's end from ``HOOKDET_SEGMENT_END`` (``"8 batches"``), if set."""
    text = os.environ.get(SEGMENT_END_ENV, "").strip()
    if not text:
        return None
    value, _, unit = text.partition(" ")
    return Length(value=int(value), unit=unit.strip())


def _described(length: Length) -> str:
    return f"{length.value} {length.unit}"
