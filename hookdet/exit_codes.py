"""How a run ends: :class:`ExitReason`, recorded on the run, and the exit statuses ``hookdet run``
gives besides 0 (completed or stopped)."""
from __future__ import annotations

import enum

#: Bad input or a fault outside user code, reported as one line (``hookdet: error: ...``).
BAD_INPUT_EXIT_CODE = 2
#: The run was preempted (SIGTERM, SIGINT, SIGHUP): it checkpointed and stopped; resume it. 75 is
#: ``EX_TEMPFAIL``: try again later.
PREEMPTED_EXIT_CODE = 75
#: The trial raised ``InvalidHP``: its hyperparameters cannot train (a search replaces it).
INVALID_HP_EXIT_CODE = 76


class ExitReason(str, enum.Enum):
    """Why training ended (``Run.exit_reason``); compares equal to its value, a plain string, as
    plugins and run records read it."""

    #: Trained to ``max_length``.
    COMPLETED = "completed"
    #: A signal asked the run to stop; it checkpointed first.
    PREEMPTED = "preempted"
    #: The trial asked to stop (``context.set_stop_requested(True)``).
    STOPPED = "stopped"
    #: ``train_batch`` raised ``ShouldExit``.
    EXITED = "exited"
    #: A search's segment reached its length (a rung): the trial checkpointed at the first
    #: validation there, and the search continues it or stops it.
    PAUSED = "paused"

    def __str__(self) -> str:
        return self.value
