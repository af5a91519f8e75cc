"""Ranks forked from torchrun's agent, so that a rank starts in milliseconds, not seconds.

torchrun starts each rank of ``hookdet run`` as a new interpreter running
:mod:`hookdet.distributed.rank_entry`, and each of them spends seconds (several under load)
importing torch, ``torch._dynamo`` and hookdet before its first batch, again for every rank of
every run. Torchrun's agent (:mod:`hookdet.distributed.torchrun_agent`) has imported torch
already. So where torchrun would start hookdet's rank entry, the agent forks the rank from itself
(:func:`fork_hookdet_ranks`), having imported once what a rank imports (:func:`preload`: what a
search's warm process preloads, nothing of the user's code), and torchrun gets back a process
with the face of the ``Popen`` it would have started: it watches, signals and tells the ranks'
ends as it does for those (the rendezvous, restarts, a stop passed on, a failed rank's exit code
or signal are all torchrun's own). The forked rank makes itself what the new interpreter would
have been (:func:`run_rank`):

- a session of its own and exactly the environment torchrun gives the rank (``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, the rendezvous), in the agent's directory, its output where
  torchrun sends the rank's;
- default signal handlers (the agent's raise torch's ``SignalException``), the root logger
  unconfigured, the name a main process has in :mod:`multiprocessing`; the exit functions it
  inherits are those the imports register (the agent registers none of its own);
- unbuffered standard output and error, as ``python -u`` (how torchrun runs a program) gives;
- SIGKILL when the agent dies, and no start at all when ``hookdet run`` is gone, as the rank
  entry asks (:func:`hookdet.launch.orphans.die_with_launcher`);
- its own random draws (NumPy's global generator seeded afresh; Python's reseeds itself);
- its end as an interpreter's: the status of its ``sys.exit``, its exit functions run
  (:func:`hookdet.search.warm_script.end_as_an_interpreter`).

What differs from a new interpreter, on purpose: a rank's ``/proc/PID/cmdline`` is the agent's
(a rank is told by its parent, the agent).

Horovod's ranks (horovodrun starts them itself), the ranks of a script a launch layer runs
(``--no-python``), and every rank when ``HOOKDET_COLD_RANKS=1`` start as new interpreters, the
way before. (A launch layer's script forked here reaches the process-group join within
milliseconds, before torchrun has seen a peer that died as it started; torchrun's SIGTERM then
waits on the join behind the preemption plugin's handler until its SIGKILL 30 s later. Forking
those needs a stop that can end the join first.)
"""
from __future__ import annotations

import gc
import importlib
import io
import os
import signal
import subprocess
import sys
import time
from typing import IO, Any, Dict, List, Optional, Sequence, Tuple

from hookdet.distributed.launcher import RANK_ENTRY

#: Set to ``1`` to start each of torchrun's ranks as a new interpreter instead of a fork of its agent.
COLD_RANKS_ENV = "HOOKDET_COLD_RANKS"


def fork_hookdet_ranks() -> None:
    """Make torchrun fork its ranks from this process when the program it is to start is
    hookdet's rank entry (see the module's docstring).

    torchrun starts each rank through a ``SubprocessHandler`` (``get_subprocess_handler``): a
    handler of this module's kind forks the rank where the handler would start it, and hands
    back a process with the face torchrun uses of a ``Popen``, so everything else of the launch
    (the rendezvous, the ranks' environment, the signals at a stop, how a failed rank is told)
    is torchrun's own, as for a rank it started."""
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    class ForkingHandler(SubprocessHandler):
        def _popen(self, args: Tuple[str, ...], env: Dict[str, str]) -> Any:
            if not forks(args):
                return super()._popen(args, env)
            return fork_rank(list(args[3:]), env, self._stdout, self._stderr)

    api.get_subprocess_handler = ForkingHandler


def forks(command: Sequence[str]) -> bool:
    """Whether ``command`` is one this process forks: this interpreter running hookdet's rank
    entry unbuffered (``python -u rank_entry.py ...``, how torchrun runs it), and
    ``HOOKDET_COLD_RANKS`` not set."""
    if os.environ.get(COLD_RANKS_ENV, "") not in ("", "0"):
        return False
    return (len(command) >= 3 and command[0] == sys.executable and command[1] == "-u"
            and os.path.abspath(command[2]) == RANK_ENTRY)


_preloaded = False


def preload() -> None:
    """Import, once, what every rank imports (a search's warm process's preload, without the
    module that readies a fork server), so that no forked rank imports it again; the objects
    built so far leave the garbage collector's generations, so no rank's collection walks them
    (and copies their pages)."""
    global _preloaded
    if _preloaded:
        return
    from hookdet.search.warm_start import READY, preload_modules

    for module in preload_modules():
        if module != READY:
            importlib.import_module(module)
    gc.freeze()
    _preloaded = True


class ForkedRank:
    """A rank forked from this process, with what torchrun uses of a ``Popen``: ``pid``,
    ``args``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode`` (negative for the
    signal that killed it)."""

    def __init__(self, pid: int, args: List[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Its exit status; ``subprocess.TimeoutExpired`` past ``timeout`` seconds."""
        if timeout is None:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_rank(argv: List[str], env: Dict[str, str], stdout: Optional[IO[str]], stderr: Optional[IO[str]]) -> ForkedRank:
    """The rank ``hookdet ARGV``, forked from this process: a session of its own (as torchrun's
    ``Popen`` gives it), ``env`` exactly, its output to ``stdout`` and ``stderr`` where torchrun
    redirects them (else this process's)."""
    preload()
    sys.stdout.flush()  # the rank starts with empty buffers, not a copy of this process's
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedRank(pid, [sys.executable, "-u", RANK_ENTRY, *argv])
    status = 1
    try:  # the child never returns into the agent's code
        os.setsid()
        for redirect, descriptor in ((stdout, 1), (stderr, 2)):
            if redirect is not None:
                os.dup2(redirect.fileno(), descriptor)
        os.environ.clear()
        os.environ.update(env)
        status = run_rank(argv)
    finally:
        os._exit(status)


def run_rank(argv: List[str]) -> int:
    """In a rank forked from the agent: become what ``python -u rank_entry.py ARGV`` would be
    (see the module's docstring), run ``hookdet ARGV`` as that rank, and end as its interpreter
    would; the exit status."""
    from hookdet.launch.orphans import die_with_launcher
    from hookdet.search.warm_script import end_as_an_interpreter, forget_the_segments_state

    forget_the_segments_state()
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)  # torch's agent handles it too
    unbuffered_standard_streams()
    die_with_launcher()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    sys.argv = [RANK_ENTRY, *argv]
    from hookdet.cli.commands import main

    try:
        end_as_an_interpreter(lambda: sys.exit(main(argv)))
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 1
    return 0


def unbuffered_standard_streams() -> None:
    """Standard output and error written as they are printed, as under ``python -u``."""
    for name, descriptor in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        setattr(sys, name, io.TextIOWrapper(io.FileIO(descriptor, "w", closefd=False), encoding=stream.encoding,
                                            errors=stream.errors, write_through=True))
