"""No orphans: every process a run starts ends with the process that started it.

torchrun starts each rank in a session of its own, and ``hookdet run`` starts torchrun in one
too (as a search worker starts its trials), so no process-group signal reaches them all. Instead
each link of the chain asks the kernel for a *parent-death signal* (Linux
``prctl(PR_SET_PDEATHSIG)``): torchrun gets SIGKILL when ``hookdet run`` dies, each rank SIGKILL
when torchrun dies, a search's trial SIGTERM (checkpoint and stop) when its worker dies. A rank
that finds ``hookdet run`` no longer among its ancestors (torchrun died first, and the rank was
adopted by init or a *subreaper*, as a desktop ``systemd --user`` session is) exits at once.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Optional

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int = signal.SIGKILL, expected_parent: Optional[int] = None) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux only).

    If the parent is already gone (``os.getppid()`` is no longer ``expected_parent``, or is 1),
    the signal is sent now. Returns whether the request could be made.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    parent = os.getppid()
    if parent == 1 or (expected_parent is not None and parent != expected_parent):
        os.kill(os.getpid(), signum)
    return True


#: The pid of the ``hookdet run`` that launched the ranks, passed to them in the environment.
LAUNCHER_PID_ENV = "HOOKDET_LAUNCHER_PID"
#: How far up a rank looks for its launcher (torchrun; horovodrun's gloo runner and shell).
_ANCESTRY_DEPTH = 8


def parent_of(pid: int) -> Optional[int]:
    """The parent pid of ``pid`` (from ``/proc``), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def die_with_launcher() -> None:
    """A rank's first act: SIGKILL when its parent dies, and exit now if the ``hookdet run`` that
    launched it (``$HOOKDET_LAUNCHER_PID``) is no longer among its ancestors."""
    set_parent_death_signal(signal.SIGKILL)
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    if not launcher.isdigit() or not sys.platform.startswith("linux"):
        return
    pid: Optional[int] = os.getpid()
    for _ in range(_ANCESTRY_DEPTH):
        pid = parent_of(pid) if pid is not None else None
        if pid is None or pid <= 1:
            break
        if pid == int(launcher):
            return
    os.kill(os.getpid(), signal.SIGKILL)


def child_setup_for(launcher_pid: int):  # type: ignore[no-untyped-def]
    """A ``preexec_fn`` for the launcher's child: die with the launcher."""

    def setup() -> None:
        set_parent_death_signal(signal.SIGKILL, expected_parent=launcher_pid)

    return setup
