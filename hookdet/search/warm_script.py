"""A script entrypoint's process, forked from its warm segment instead of started cold.

A search segment of a script experiment (``entrypoint: python3 train.py ...``) is a ``hookdet
run`` forked from the warm process (:mod:`hookdet.search.warm_start`), which starts the script
as a command of its own: a new interpreter importing torch again, about two seconds of every
segment on an idle machine. When the command is this interpreter running a script
(``python3 train.py --epochs 1``: ``python3`` found first on the ``PATH`` the script gets is the
``python3`` of hookdet's environment, no interpreter option before the script), the segment
instead forks itself and the child runs the script as ``__main__``, with what a new interpreter
would give it:

- its own session (signals to its process group reach it and whatever it starts), its
  environment (the cluster info, the ``PATH``), its directory, ``sys.argv`` and ``sys.path[0]``
  (the script's directory), default signal handlers, unconfigured logging (a script's own
  ``logging.basicConfig`` takes effect);
- its exit: the status of its ``sys.exit``, 1 and the traceback for an uncaught exception, death
  by SIGINT for an uncaught Ctrl-C, and its own exit functions run at its end. The segment's
  ``hookdet run`` leaves none there to run: the directory it reads when the script has ended is
  made without a finalizer (:func:`hookdet.launch.outcome.records_directory`).

Why the script is forked from its segment, not from the pristine warm process as the segment
is: the script must be the child of its ``hookdet run``, which waits for its process group,
passes signals on to it, reads its exit status and takes it along when it dies; a process the
warm process forked would be the warm process's child. So the little the segment set up is
undone in the child (:func:`forget_the_segments_state`).

Anything else (a shell command, ``python3 -m``, a launch layer, another interpreter, a segment
started cold) starts as a new process, as outside a search.

torchrun's agent (``hookdet/distributed/torchrun_agent.py``, which a segment of several ranks
runs) is a script of this Python too: a warm segment forks it the same way, started as
:mod:`hookdet.launch.start` starts a launcher (:func:`fork_launcher`), and the agent forks the
ranks (:mod:`hookdet.distributed.forked_ranks`).
"""
from __future__ import annotations

import atexit
import builtins
import gc
import importlib.machinery
import io
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import types
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from hookdet.distributed.launcher import is_python
from hookdet.launch.orphans import set_parent_death_signal
from hookdet.launch.start import Job

#: True in a segment forked from the warm process (set by :func:`mark_warm_segment`).
_in_warm_segment = False


def mark_warm_segment() -> None:
    """Called by a segment forked from the warm process: its scripts may be forked too."""
    global _in_warm_segment
    _in_warm_segment = True


def warm_starter(command: Sequence[str], env: Dict[str, str], cwd: str) -> Optional[Callable[[Job], multiprocessing.process.BaseProcess]]:
    """What forks ``command`` from this process (:func:`fork_script`, the ``fork`` of a
    :class:`~hookdet.launch.start.Job`), or None when it must start cold (see the module's docstring)."""
    if not _in_warm_segment or len(command) < 2 or not is_python(command[0]):
        return None
    found = shutil.which(command[0], path=env.get("PATH"))
    if found is None or os.path.dirname(os.path.abspath(found)) != os.path.dirname(os.path.abspath(sys.executable)):
        return None
    script = command[1]
    if script.startswith("-") or not os.path.isfile(os.path.join(cwd, script)):
        return None
    return fork_script


def launcher_starter(command: Sequence[str], env: Dict[str, str], cwd: str) -> Optional[Callable[[Job], multiprocessing.process.BaseProcess]]:
    """What forks the launcher ``command`` (torchrun's agent, a script) from this process
    (:func:`fork_launcher`), or None when it must start as a new process (as :func:`warm_starter`)."""
    return fork_launcher if warm_starter(command, env, cwd) is not None else None


def fork_script(job: Job) -> multiprocessing.process.BaseProcess:
    """The script ``job.command[1:]`` run in a child forked from this process, which leads a
    session of its own before this returns (as ``Popen(start_new_session=True)``'s does)."""
    return forked(job, job.stdio)


def fork_launcher(job: Job) -> multiprocessing.process.BaseProcess:
    """The launcher ``job.command[1:]`` (torchrun's agent) run in a child forked from this
    process, started as :mod:`hookdet.launch.start` starts a launcher: a session of its own,
    SIGKILL when this process dies, its standard error a pipe (the returned process's ``stderr``)."""
    to_read, to_write = os.pipe()
    try:
        process = forked(job, (1, to_write), launcher=(os.getpid(), to_read))
    finally:
        os.close(to_write)
    process.stderr = os.fdopen(to_read, "rb")  # type: ignore[attr-defined]
    return process


def forked(job: Job, stdio: Optional[Tuple[int, int]], launcher: Optional[Tuple[int, int]] = None) -> multiprocessing.process.BaseProcess:
    """The script of ``job`` run in a forked child (:func:`run_script`) that leads a session of
    its own before this returns; ``launcher``: (this process's pid, the end of the stderr pipe
    the child does not keep) for a launcher."""
    ready_to_read, ready_to_write = os.pipe()
    sys.stdout.flush()  # the child starts with empty buffers, not a copy of this process's
    sys.stderr.flush()
    process = multiprocessing.get_context("fork").Process(
        target=run_script, args=(job.command[1:], dict(job.env), str(job.cwd), ready_to_read, ready_to_write, stdio,
                                 launcher), name="hookdet-script")
    try:
        process.start()
    finally:
        os.close(ready_to_write)
    try:
        os.read(ready_to_read, 1)  # the end of the file: the child has its session (or died)
    finally:
        os.close(ready_to_read)
    return process


def run_script(argv: List[str], env: Dict[str, str], cwd: str, ready_to_read: int, ready_to_write: int,
               stdio: Optional[Tuple[int, int]] = None, launcher: Optional[Tuple[int, int]] = None) -> None:
    """In the forked child: become the script's process (see the module's docstring), with
    ``stdio`` as its standard output and error where given, run it, and exit as its interpreter
    would. A ``launcher`` (see :func:`forked`) also dies with the process that forked it."""
    os.setsid()
    if launcher is not None:
        set_parent_death_signal(signal.SIGKILL, expected_parent=launcher[0])
        os.close(launcher[1])
    os.close(ready_to_read)
    os.close(ready_to_write)  # the parent goes on
    if stdio is not None:
        for descriptor, standard in zip(stdio, (1, 2)):
            os.dup2(descriptor, standard)
        for descriptor in set(stdio) - {1, 2}:
            os.close(descriptor)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    forget_the_segments_state()
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(script)
    end_as_an_interpreter(lambda: run_as_main(script), script)


def end_as_an_interpreter(run: Callable[[], None], script: Optional[str] = None) -> None:
    """In a forked child: call ``run``, then exit as an interpreter running it would: the status
    of its ``sys.exit`` (a message printed for a non-number), 1 and ``sys.excepthook`` for an uncaught
    exception (from ``script``'s first frame when given, as for a script run by ``python3``),
    death by SIGINT for an uncaught Ctrl-C; the exit functions run first and the files left
    open are flushed (a forked child ends with ``os._exit``, which skips both)."""
    status = 0
    try:
        run()
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int) and stop.code is not None:
            print(stop.code, file=sys.stderr)
    except BaseException as error:
        frames = error.__traceback__ if script is None else from_the_script(error.__traceback__, script)
        sys.excepthook(type(error), error, frames)  # as the interpreter reports it (the script may have set its own)
        status = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    finally:
        atexit._run_exitfuncs()  # what Py_Finalize calls; no public function runs them in a fork
        flush_open_files()
        sys.stdout.flush()
        sys.stderr.flush()
    if status == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(status)


def flush_open_files() -> None:
    """Write out what the files this process opened and never closed still buffer, as a new
    interpreter does at its end (where it frees every module's objects, and a file's buffer is
    written as the file is freed): a line a trial wrote to a log it keeps in a global is on disk
    after a warm segment as after a cold one. The files are found among the objects the garbage
    collector tracks (those of the warm process are frozen out of it: it opened none for the
    segment); one that cannot be written any more is left as the interpreter would leave it."""
    gc.collect()  # a file in a reference cycle is freed, and written, here
    for found in gc.get_objects():
        if isinstance(found, io.IOBase):
            try:
                if not found.closed and found.writable():
                    found.flush()
            except (OSError, ValueError):
                continue


def run_as_main(script: str) -> None:
    """Run the file ``script`` (an absolute path) as ``__main__``, as ``python3 SCRIPT`` does:
    its ``__file__`` absolute, ``sys.argv`` as given (:mod:`runpy` would make its first item
    the path)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __cached__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", script))
    sys.modules["__main__"] = main
    with open(script, "rb") as source:
        code = compile(source.read(), script, "exec")
    exec(code, main.__dict__)


def from_the_script(frames: Optional[types.TracebackType], script: str) -> Optional[types.TracebackType]:
    """The traceback ``frames`` from the script's own first frame on (none for an error before
    it runs, a syntax error): what an interpreter shows of an uncaught exception."""
    while frames is not None and frames.tb_frame.f_code.co_filename != script:
        frames = frames.tb_next
    return frames


def forget_the_segments_state() -> None:
    """Undo what the segment's ``hookdet run`` set up and a new interpreter would not have:
    its signal handlers, its logging configuration, the process's name in :mod:`multiprocessing`."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    multiprocessing.current_process().name = "MainProcess"  # as the script's own processes see it

