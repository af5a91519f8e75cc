"""Warm trial processes: each segment forked from a process that has already imported torch.

A cold segment is ``python -m hookdet run ...`` in a new interpreter, which spends about two
seconds on an idle machine (and several under load) importing torch, ``torch._dynamo`` and
hookdet before it trains a batch, again for every segment of every trial. A search worker
instead keeps one *fork server* (the standard library's :mod:`multiprocessing` ``forkserver``,
started on first use) that has imported torch, hookdet's run path and the default plugins, and
nothing of the user's code; each segment is a process forked from it that runs the same
``hookdet run`` command line through :func:`hookdet.cli.commands.main`.

What a segment keeps from the cold way:

- a process of its own: a crash, a segfault, an out-of-memory kill or a global the trial leaks
  touches no other segment, and the fork server never runs user code;
- its environment, working directory, CPU affinity and thread count are the segment's, set in
  the child before anything runs (the thread count explicitly: the OpenMP runtime read
  ``OMP_NUM_THREADS`` when the fork server loaded torch, not when the segment started);
- its output goes to the trial's log file; SIGTERM reaches it as before (it checkpoints and exits
  75), and it gets SIGTERM when its worker dies (the fork server leaves when its worker goes, and
  the segment is told by its parent-death signal);
- the interpreter's exit functions run at its end, as at a cold interpreter's exit.

A trial with several ranks (``slots_per_trial > 1``) starts its launcher warm; torchrun then
starts each rank as a new interpreter (its own process start, not a fork of ours). A script
entrypoint's ``hookdet run`` is warm and the script itself starts cold, as a command of its own.

``HOOKDET_COLD_SEGMENTS=1`` starts every segment as a new interpreter, the way before (used by
the benchmark that compares the two, and as an escape hatch).
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import subprocess
import sys
import traceback
from importlib.metadata import entry_points
from typing import Dict, List, Optional, Sequence, Union

#: Set to ``1`` to start each segment as a new interpreter instead of a fork of the warm process.
COLD_ENV = "HOOKDET_COLD_SEGMENTS"

#: What the warm process imports besides the default plugins: torch (with ``torch._dynamo``,
#: which every optimizer pulls in) and the modules a ``hookdet run`` of a trial class goes through.
PRELOAD = ("torch", "torch.optim", "torch._dynamo", "hookdet.cli.commands",
           "hookdet.loop.trainer", "hookdet.trial_api.context", "hookdet.search.worker")


def cold() -> bool:
    """Whether segments start as new interpreters (``HOOKDET_COLD_SEGMENTS=1``)."""
    return os.environ.get(COLD_ENV, "") not in ("", "0")


def preload_modules() -> List[str]:
    """:data:`PRELOAD` and the modules of the default plugins, read from their entry points
    (no plugin is imported to find them)."""
    from hookdet.plugins.selection import DEFAULT_PLUGINS

    plugins = {ep.name: ep.module for ep in entry_points(group="hookdet.plugins")}
    return list(PRELOAD) + [plugins[name] for name in DEFAULT_PLUGINS if name in plugins]


_context: Optional[multiprocessing.context.BaseContext] = None


def forkserver() -> multiprocessing.context.BaseContext:
    """The ``forkserver`` context whose server has :func:`preload_modules` imported."""
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(preload_modules())
        _context = context
    return _context


class SegmentProcess:
    """A started segment, warm (a forked :mod:`multiprocessing` process) or cold (a ``Popen``),
    behind one face: its ``pid``, a signal to it, waiting for its exit status (negative for the
    signal that killed it)."""

    def __init__(self, process: Union[multiprocessing.process.BaseProcess, subprocess.Popen]) -> None:
        self.process = process
        self.pid: int = process.pid

    def running(self) -> bool:
        if isinstance(self.process, subprocess.Popen):
            return self.process.poll() is None
        return self.process.is_alive()

    def send_signal(self, signum: int) -> None:
        if self.running():
            os.kill(self.pid, signum)

    def wait(self, timeout: float) -> Optional[int]:
        """The exit status, or None when it still runs after ``timeout`` seconds."""
        if isinstance(self.process, subprocess.Popen):
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
        self.process.join(timeout)
        return self.process.exitcode


def start_segment(argv: Sequence[str], env: Dict[str, str], cwd: str, log_path: str,
                  cpus: Sequence[int]) -> SegmentProcess:
    """Start ``hookdet <argv>`` in ``cwd`` with exactly ``env``, its output appended to
    ``log_path``, pinned to ``cpus`` (all when empty): forked from the warm process, or as a new
    interpreter when :func:`cold`."""
    if cold():
        def child_setup() -> None:
            set_parent_death_signal()
            if cpus and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, cpus)

        with open(log_path, "a") as log:
            return SegmentProcess(subprocess.Popen(
                [sys.executable, "-m", "hookdet", *argv], env=env, cwd=cwd, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=child_setup))
    process = forkserver().Process(target=run_segment, name="hookdet-segment",
                                   args=(list(argv), dict(env), cwd, log_path, list(cpus)))
    process.start()
    return SegmentProcess(process)


def run_segment(argv: List[str], env: Dict[str, str], cwd: str, log_path: str,
                cpus: List[int]) -> None:
    """In the forked child: become the segment's process, then run ``hookdet <argv>``."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, sys.stdout.fileno())
    os.dup2(log, sys.stderr.fileno())
    os.close(log)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    set_parent_death_signal()
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    sys.argv = ["hookdet", *argv]
    from hookdet.cli.commands import main

    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # what a cold interpreter prints for an uncaught exception, and its status
        traceback.print_exc()
        status = 1
    finally:
        atexit._run_exitfuncs()  # a forked child ends with os._exit, which skips them
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(status)


def set_parent_death_signal() -> None:
    """Get SIGTERM (checkpoint and stop) when the parent process dies without a word."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass
