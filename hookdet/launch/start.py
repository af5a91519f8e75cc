"""Starting a process, one way: :func:`start` runs a :class:`Job` the way :class:`How` says.

Every process hookdet starts is one of four kinds, and each kind's rules live here, once:

=============  ===========================================  =====================  ==========================
``How``        what runs                                    where its signals go   when its starter dies
=============  ===========================================  =====================  ==========================
``COLD``       ``python -m hookdet ARGV``, a new             the process            SIGTERM: it checkpoints
               interpreter (a search's segment)                                     and stops
``WARM``       the same, forked from a warm server that      the process            SIGTERM (set by the fork)
               has imported torch (``job.fork`` does it)
``SCRIPT``     a user's command (an entrypoint that is a     its process group      its group is waited for
               command), forked from this process where      (a session of its
               ``job.fork`` can, else a new process          own)
``LAUNCHER``   torchrun or horovodrun, starting ranks,       the launcher alone     SIGKILL, and each rank
               forked from this process where ``job.fork``                          with it
               can, else a new process
=============  ===========================================  =====================  ==========================

A ``COLD`` or ``WARM`` segment's output is appended to ``job.log`` and it is pinned to
``job.cpus``; a ``LAUNCHER``'s standard error is a pipe (read through the launcher's filter); a
``SCRIPT``'s output is ``job.stdio`` (:mod:`hookdet.cli.command_output`), else this
process's. Whatever the kind, :class:`Started` is what comes back: its pid, a signal to it, its
exit status (negative for the signal that killed it). How it ended, beyond that status, is its
outcome record (:mod:`hookdet.launch.outcome`), which the starter names in ``job.env``.
"""
from __future__ import annotations

import dataclasses
import enum
import multiprocessing
import os
import signal
import subprocess
import sys
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from hookdet.launch.orphans import child_setup_for, set_parent_death_signal


class How(enum.Enum):
    """The kinds of process :func:`start` starts (see the module's docstring)."""

    COLD = "cold"
    WARM = "warm"
    SCRIPT = "script"
    LAUNCHER = "launcher"


@dataclasses.dataclass
class Job:
    """What to run: ``command`` (``hookdet``'s arguments for a segment, the whole command line
    otherwise), with exactly ``env``, in ``cwd``."""

    command: List[str]
    env: Dict[str, str]
    cwd: str
    #: A segment's log, its output appended (COLD, WARM).
    log: Optional[str] = None
    #: The CPUs a segment is pinned to; all when empty (COLD, WARM).
    cpus: Sequence[int] = ()
    #: How to fork it: from a warm server (WARM, needed), from this process (SCRIPT, LAUNCHER:
    #: optional).
    #: Given the job, it returns the started process (a :class:`multiprocessing` process or a
    #: ``Popen``-like one).
    fork: Optional[Callable[["Job"], Any]] = None
    #: A SCRIPT's standard output and error (file descriptors); this process's when None.
    stdio: Optional[Tuple[int, int]] = None


class Started:
    """A started process of any kind, behind one face (its ``pid``; ``stderr``, the pipe of a
    LAUNCHER's standard error, else None)."""

    def __init__(self, process: Union[multiprocessing.process.BaseProcess, subprocess.Popen, Any]) -> None:
        self.process = process
        self.pid: int = process.pid
        self.stderr: Optional[IO[bytes]] = getattr(process, "stderr", None)

    def poll(self) -> Optional[int]:
        """The exit status, or None while it runs."""
        if isinstance(self.process, multiprocessing.process.BaseProcess):
            return None if self.process.is_alive() else self.process.exitcode
        return self.process.poll()

    def running(self) -> bool:
        return self.poll() is None

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """The exit status, or None when it still runs after ``timeout`` seconds."""
        if isinstance(self.process, multiprocessing.process.BaseProcess):
            self.process.join(timeout)
            return self.process.exitcode
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, signum: int) -> None:
        """``signum`` to the process, while it runs."""
        if self.running():
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def signal_group(self, signum: int) -> None:
        """``signum`` to every process of its group (a SCRIPT leads one)."""
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass


def start(job: Job, how: How) -> Started:
    """Start ``job`` as ``how`` says (see the module's docstring)."""
    if how is How.WARM:
        if job.fork is None:
            raise ValueError("a warm start needs the warm server's fork")
        return Started(job.fork(job))
    if how is How.COLD:
        return Started(_start_cold(job))
    if how is How.SCRIPT:
        if job.fork is not None:
            return Started(job.fork(job))
        out, err = job.stdio if job.stdio is not None else (None, None)
        return Started(subprocess.Popen(job.command, env=job.env, cwd=job.cwd, start_new_session=True,
                                        stdout=out, stderr=err))
    if job.fork is not None:
        return Started(job.fork(job))
    return Started(subprocess.Popen(job.command, env=job.env, cwd=job.cwd, start_new_session=True,
                                    stderr=subprocess.PIPE, preexec_fn=child_setup_for(os.getpid())))


def become_segment(cpus: Sequence[int]) -> None:
    """What a segment, cold or warm, asks first: SIGTERM (checkpoint and stop) when its starter
    dies, and its CPUs."""
    set_parent_death_signal(signal.SIGTERM)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def _start_cold(job: Job) -> subprocess.Popen:
    """``python -m hookdet <job.command>``, its output appended to ``job.log``."""
    assert job.log is not None, "a segment has a log"
    with open(job.log, "a") as log:
        return subprocess.Popen([sys.executable, "-m", "hookdet", *job.command], env=job.env, cwd=job.cwd,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=lambda: become_segment(job.cpus))
