"""``core_context.preempt``: whether the script should stop now, agreed across its ranks.

On a Determined cluster the chief long-polls the master for a preemption signal (a pause, the
scheduler, the searcher) and ``should_preempt()`` turns true when one came. hookdet's signals
are the ones a local run gets: SIGTERM, SIGINT or SIGHUP to the process (``hookdet run`` passes
its own on), which reach the run through the ``preemption`` plugin as a trial class's do (it
marks the run, ``run.exit_reason``, and this context reads the mark), and a search's decision
to stop the trial at a rung: the search's worker makes the file ``$HOOKDET_SEARCH_STOP_FILE``
names, and the trial ends *stopped*. A search never pauses a Core API trial at a rung to resume
it later (its resume is only as exact as the script): a trial the searcher continues trains on
in the same process. A script that returns after
``should_preempt()`` said true leaves a *preempted* run (``hookdet run`` exits 75; ``--resume``
continues it).

A script that never asks still stops: :data:`GRACE_SECONDS` after a stop signal that no
``should_preempt()`` answered (``$HOOKDET_STOP_GRACE_S`` sets it), the script is interrupted
where it is (a ``KeyboardInterrupt`` in its main thread, as a second Ctrl-C does at once). A
checkpoint being stored then is discarded whole (a storage publishes only complete ones), the
run is recorded *preempted* at its latest checkpoint, and the process exits 75.

:class:`PreemptMode` is Determined's: with ``WorkersAskChief`` (the default) every rank calls
``should_preempt()`` at the same point and gets the chief's answer; ``ChiefOnly`` lets only the
chief ask; ``WorkersAskMaster`` lets every rank ask for itself.
"""
from __future__ import annotations

import _thread
import enum
import logging
import os
import threading
import time
from typing import Any, Optional

from hookdet.config.experiment import SEARCH_STOP_FILE_ENV
from hookdet.exit_codes import ExitReason

logger = logging.getLogger("hookdet")

#: Seconds a script has, after a stop signal, to ask ``should_preempt()`` before it is interrupted.
GRACE_SECONDS = 30.0
#: The environment variable that sets :data:`GRACE_SECONDS` for a run.
GRACE_ENV = "HOOKDET_STOP_GRACE_S"


class PreemptMode(enum.Enum):
    """How ``should_preempt()`` is called across ranks (Determined's names and values)."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """Determined's ``PreemptContext`` over a hookdet run (``core_context.preempt``)."""

    def __init__(self, run: Any, preempt_mode: PreemptMode = PreemptMode.WorkersAskChief) -> None:
        self._run = run
        self._dist = run.distributed
        self._preempt_mode = PreemptMode(preempt_mode)
        self._started = False
        self._closed = False
        #: Whether ``should_preempt()`` has answered True (the script was told to stop).
        self.told_to_stop = False
        #: Whether the script was interrupted for not asking within the grace period.
        self.interrupted = False
        self._watch: Optional[threading.Thread] = None

    def start(self) -> "PreemptContext":
        """Start answering (``core.init()``'s ``with`` block does it)."""
        if self._started:
            raise RuntimeError("you cannot call PreemptContext.start() multiple times")
        self._started = True
        if threading.current_thread() is threading.main_thread():
            self._watch = threading.Thread(target=self._interrupt_if_never_asked, name="hookdet-stop-grace",
                                           daemon=True)
            self._watch.start()
        return self

    def close(self) -> None:
        """Stop answering: ``should_preempt()`` after the ``with`` block is refused."""
        self._closed = True

    def _interrupt_if_never_asked(self) -> None:
        """Interrupt the main thread when a stop signal went unasked for the grace period."""
        grace = float(os.environ.get(GRACE_ENV, GRACE_SECONDS))
        while not self._closed and self._run.exit_reason is None:
            time.sleep(0.1)
        deadline = time.monotonic() + grace
        while not self._closed and not self.told_to_stop and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._closed or self.told_to_stop:
            return
        logger.warning("the script did not ask core_context.preempt.should_preempt() within %.0f s of the stop "
                       "signal: interrupting it (its latest checkpoint is kept)", grace)
        self.interrupted = True
        _thread.interrupt_main()

    def __enter__(self) -> "PreemptContext":
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.close()

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """Whether the script should save its state and return now: a stop signal or the
        search's stop reached the run. With ``WorkersAskChief`` every rank must call it at the
        same point; all get the chief's answer."""
        if self._closed:
            raise RuntimeError("should_preempt() was called after the core.init() block ended; call it inside "
                               "'with det.core.init() as core_context:'")
        if not self._started:
            raise RuntimeError("you cannot call PreemptContext.should_preempt() before PreemptContext.start()")
        chief = self._dist.rank == 0
        if not chief and self._preempt_mode == PreemptMode.ChiefOnly:
            raise RuntimeError(
                "PreemptContext was configured with preempt_mode=ChiefOnly but .should_preempt() was called "
                f"from non-chief worker of rank={self._dist.get_rank()}"
            )
        if chief:
            self._stopped_by_the_search()
        reason = self._run.exit_reason
        if self._preempt_mode == PreemptMode.WorkersAskChief:  # the chief's answer, and why
            reason = self._dist.broadcast(None if not chief or reason is None else str(reason))
            if reason is not None and self._run.exit_reason is None:
                self._run.exit_reason = ExitReason(reason)
        asked = reason is not None
        if asked and not self.told_to_stop:
            logger.info("should_preempt() -> True: the script was asked to stop (%s)", self._run.exit_reason)
            self.told_to_stop = True
        return asked

    def _stopped_by_the_search(self) -> bool:
        """Whether the search running this trial has stopped it (then the run ends ``stopped``)."""
        stop_file = os.environ.get(SEARCH_STOP_FILE_ENV)
        if not stop_file or not os.path.exists(stop_file):
            return False
        if self._run.exit_reason is None:
            logger.info("the search stopped this trial at its rung: should_preempt() -> True")
            self._run.exit_reason = ExitReason.STOPPED
        return True

    def acknowledge_preemption_signal(self) -> None:
        """Determined tells its master the task will stop; locally the run's record says so."""
