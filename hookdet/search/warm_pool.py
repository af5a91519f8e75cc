"""A worker's warm process and the segment processes forked ahead from it, as one object.

:mod:`hookdet.search.warm_start` says what the warm process is and how a segment forked from it
becomes ``hookdet run``; this module is the parent's side. A :class:`WarmPool` belongs to the
process that runs a search's workers: ``hookdet run`` of a search makes one for its driver's
local workers, ``hookdet search worker`` one for its own, and each closes its pool once no
segment will start (:meth:`WarmPool.close`), or at the latest as the process exits.

- The warm process starts on first use (:meth:`WarmPool.warm_up`, as the search starts, so it
  imports while the driver opens its store), importing the libraries of the first trial it
  serves. The standard library keeps one ``forkserver`` per process, so a process has one pool.
- As a segment starts, the next segment's process is forked in a thread and waits, having run
  nothing, until the pool hands it the segment it will become (about 12 ms saved a segment).
- The pool answers how many GPUs torch sees (:meth:`WarmPool.gpu_count`), asked of a process
  forked from the warm one, so the search's driver never imports torch.
- When the warm process cannot start (a library that crashes as it loads), the pool says so
  once and starts every later segment as a new interpreter.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing
import os
import signal
import threading
from pathlib import Path
from typing import Any, List, Optional, Tuple

from hookdet.launch.orphans import set_parent_death_signal
from hookdet.launch.start import How, Job, Started, start
from hookdet.search.warm_start import cold, libraries_of, preload_modules, run_segment, torch_gpu_count

logger = logging.getLogger("hookdet")


class WarmPool:
    """The warm process of one process that runs search workers, and the processes forked ahead
    from it (see the module's docstring)."""

    def __init__(self) -> None:
        self._context: Optional[multiprocessing.context.BaseContext] = None
        #: Set when the warm process could not start: later segments start cold.
        self.failed = False
        #: Processes forked ahead (with the end of the pipe their segment comes through), and the
        #: threads forking them.
        self._standby: List[Tuple[multiprocessing.process.BaseProcess, Any]] = []
        self._makers: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._ended_at_exit = False

    def warm(self) -> bool:
        """Whether segments start warm: not ``HOOKDET_COLD_SEGMENTS=1``, nor a warm process failed."""
        return not cold() and not self.failed

    def server(self, model_dir: Path, entrypoint: Optional[str]) -> multiprocessing.context.BaseContext:
        """The ``forkserver`` context whose server imports :func:`preload_modules` with the
        libraries of the first trial it serves."""
        if self._context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(preload_modules(libraries_of(model_dir, entrypoint)))
            self._context = context
        return self._context

    def warm_up(self, model_dir: Path, entrypoint: Optional[str]) -> None:
        """Start the warm process now (it imports while the caller goes on), for trials of
        ``entrypoint`` in ``model_dir``; nothing when segments start cold."""
        if not self.warm():
            return
        self.server(model_dir, entrypoint)
        from multiprocessing import forkserver

        forkserver.ensure_running()

    def start_segment(self, job: Job, entrypoint: Optional[str] = None) -> Started:
        """Start the segment ``hookdet <job.command>`` (in the model directory ``job.cwd``, its
        output appended to ``job.log``, pinned to ``job.cpus``): forked from the warm process
        (which imports the libraries of ``entrypoint``'s module when it starts), or as a new
        interpreter when segments start cold or the warm process cannot start."""
        if self.warm():
            try:
                return start(dataclasses.replace(job, fork=lambda job: self._fork_segment(job, entrypoint)), How.WARM)
            except (OSError, EOFError) as error:  # e.g. a library that crashed the server as it loaded
                self.failed = True
                logger.warning("hookdet: warning: the warm process for trials failed to start (%s: %s);"
                               " starting each trial as a new process", type(error).__name__, error)
        return start(job, How.COLD)

    def _fork_segment(self, job: Job, entrypoint: Optional[str]) -> multiprocessing.process.BaseProcess:
        """The segment's process: the one forked ahead when one waits, else one forked now; the
        next one is forked ahead as it starts."""
        arguments = (list(job.command), dict(job.env), job.cwd, job.log, list(job.cpus))
        process = self._hand_to_standby(arguments)
        if process is None:
            process = self.server(Path(job.cwd), entrypoint).Process(target=run_segment, args=arguments,
                                                                     name="hookdet-segment")
            process.start()
        self._fork_standby(self.server(Path(job.cwd), entrypoint))
        return process

    def gpu_count(self) -> int:
        """How many GPUs torch sees, asked of a process forked from the warm process once it runs
        (so that a search's driver never imports torch: it starts, and ends, a second sooner);
        here when segments start cold."""
        if self._context is not None and self.warm():
            try:
                receiving, sending = self._context.Pipe(duplex=False)
                asker = self._context.Process(target=_send_gpu_count, args=(sending,), name="hookdet-gpus")
                asker.start()
                sending.close()
                count = receiving.recv()
                asker.join()
                return count
            except (OSError, EOFError):  # the warm process failed: start_segment says so
                pass
        return torch_gpu_count()

    def close(self) -> None:
        """End the warm process now that no segment will start (a search or a worker ends). Left
        to itself it would notice its caller's exit and tear down an interpreter full of torch,
        about a second of a core with the command's output held open (a pipe reading it waits).
        A process forked from it ends it with SIGKILL: it keeps nothing (it never runs a trial's
        code)."""
        if self._context is None or not self.warm():
            return
        self._end_standby()
        try:
            ender = self._context.Process(target=_end_parent, name="hookdet-warm-end")
            ender.start()
            ender.join()  # its status comes from the warm process, which is gone: EOF, exit code 255
        except (OSError, EOFError):
            pass
        self._context = None

    def _end_standby(self) -> None:
        """End the processes forked ahead: each sees its pipe close and exits, having run nothing."""
        with self._lock:
            makers = list(self._makers)
            self._makers.clear()
        for maker in makers:
            maker.join()
        with self._lock:
            waiting = list(self._standby)
            self._standby.clear()
        for process, sending in waiting:
            sending.close()
            process.join(5)

    def _hand_to_standby(self, job: Tuple[Any, ...]) -> Optional[multiprocessing.process.BaseProcess]:
        """A process forked ahead, now running ``job``; None when none waits."""
        while True:
            with self._lock:
                if not self._standby:
                    return None
                process, sending = self._standby.pop()
            try:
                sending.send(job)
                return process
            except OSError:  # it died waiting (killed from outside): the next, or a fork now
                continue
            finally:
                sending.close()

    def _fork_standby(self, context: multiprocessing.context.BaseContext) -> None:
        """Fork the next segment's process now, in a thread (the segment just started goes on)."""
        def fork() -> None:
            try:
                receiving, sending = context.Pipe(duplex=False)
                process = context.Process(target=_wait_for_segment, args=(receiving,), name="hookdet-segment")
                process.start()
                receiving.close()
            except (OSError, EOFError):  # the warm process is gone: the next start says so
                return
            with self._lock:
                self._standby.append((process, sending))

        maker = threading.Thread(target=fork, name="hookdet-standby", daemon=True)
        with self._lock:
            if not self._ended_at_exit:  # at any exit of this process, before multiprocessing
                atexit.register(self._end_standby)  # joins its children (a standby would wait for ever)
                self._ended_at_exit = True
            self._makers[:] = [each for each in self._makers if each.is_alive()] + [maker]
        maker.start()


def _end_parent() -> None:
    os.kill(os.getppid(), signal.SIGKILL)


def _send_gpu_count(sending: multiprocessing.connection.Connection) -> None:
    sending.send(torch_gpu_count())
    sending.close()


def _wait_for_segment(receiving: Any) -> None:
    """In a process forked ahead: wait for the segment to become, and become it."""
    set_parent_death_signal(signal.SIGTERM)  # the warm process (or its worker) died: no segment comes
    try:
        job = receiving.recv()
    except (EOFError, OSError):  # the worker ended it, or is gone
        return
    receiving.close()
    run_segment(*job)
