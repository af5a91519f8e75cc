"""Warm trial processes: each segment forked from a process that has already imported torch.

A cold segment is ``python -m hookdet run ...`` in a new interpreter, which spends about two
seconds on an idle machine (and several under load) importing torch, ``torch._dynamo`` and
hookdet before it trains a batch, again for every segment of every trial. A search worker
instead keeps one *fork server* (the standard library's :mod:`multiprocessing` ``forkserver``,
started on first use) that has imported torch, hookdet's run path, the default plugins and the
installed libraries the trial's module imports (scikit-learn, pandas, ...: read from its source,
not run), and nothing of the user's code; each segment is a process forked from it that runs the
same command line as the cold way, ``python -m hookdet run ...``, as :mod:`runpy` runs it.

What a segment keeps from the cold way:

- a process of its own: a crash, a segfault, an out-of-memory kill or a global the trial leaks
  touches no other segment, and the fork server never runs user code;
- its environment, working directory, CPU affinity and thread count are the segment's, set in
  the child before anything runs (the thread count explicitly, for torch and for every BLAS and
  OpenMP library loaded, through threadpoolctl: each read ``OMP_NUM_THREADS`` when the fork
  server loaded it, not when the segment started);
- its output goes to the trial's log file; SIGTERM reaches it as before (it checkpoints and exits
  75), and it gets SIGTERM when its worker dies, even by SIGKILL (the fork server ends with its
  worker, :mod:`hookdet.search.warm_ready`, and the segment is told by its parent-death signal);
- the interpreter's exit functions run at its end, as at a cold interpreter's exit (all but
  torch's operator-library finalizers inherited from the warm process: see
  :mod:`hookdet.search.warm_ready`);
- the code as it is now: when a file the warm process imported from outside the interpreter's
  library and site-packages (an editable install, a ``PYTHONPATH`` entry) has changed since,
  the segment's process becomes a new interpreter (``exec``: the same process, log, affinity
  and parent-death signal) and says so in its log;
- its own random draws: NumPy's global generator is seeded afresh, as a new interpreter's is
  (Python's own ``random`` reseeds itself in a forked child).

Forking the warm process takes about 12 ms (on the 2-core development machine), so a worker does
it ahead: as a segment starts, the next segment's process is forked in a thread and waits,
having run nothing, until its worker hands it the segment it will become (:func:`start_segment`),
or ends when no segment comes.

The warm process lives as long as its worker needs it: the worker ends it (:func:`stop_warm_process`)
once no segment will start. It also answers how many GPUs torch sees (:func:`gpu_count`), so the
search's driver never imports torch.

A trial with several ranks (``slots_per_trial > 1``) starts its launcher warm; torchrun then
starts each rank as a new interpreter (its own process start, not a fork of ours). A script
entrypoint's ``hookdet run`` is warm, and it forks the script from itself when the script runs
in this Python (:mod:`hookdet.search.warm_script`).

``HOOKDET_COLD_SEGMENTS=1`` starts every segment as a new interpreter, the way before (used by
the benchmark that compares the two, and as an escape hatch).
"""
from __future__ import annotations

import ast
import atexit
import importlib.util
import logging
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from hookdet.distributed.orphans import set_parent_death_signal

logger = logging.getLogger("hookdet")

#: Set to ``1`` to start each segment as a new interpreter instead of a fork of the warm process.
COLD_ENV = "HOOKDET_COLD_SEGMENTS"

#: What the warm process imports besides the default plugins: torch (with ``torch._dynamo``,
#: which every optimizer pulls in, its TensorBoard writer and the hyperparameter records the
#: default ``tensorboard`` plugin writes as a run starts, and the serialization a checkpoint
#: uses), stevedore (which loads the plugins), every module a ``hookdet run`` of a trial class
#: goes through (the command line imports each command's module to build its parser) and
#: threadpoolctl (which gives a segment its thread count).
PRELOAD = ("torch", "torch.optim", "torch._dynamo", "torch.utils.tensorboard", "torch.utils.serialization",
           "tensorboard.plugins.hparams.api_pb2", "tensorboard.plugins.hparams.metadata",
           "tensorboard.plugins.hparams.plugin_data_pb2", "stevedore", "stevedore.named",
           "hookdet.cli.commands", "hookdet.cli.reading", "hookdet.config.overrides", "hookdet.loop.trainer",
           "hookdet.trial_api.context", "hookdet.pytorch", "hookdet.pytorch.samplers", "hookdet.checkpoints.api",
           "hookdet.checkpoints.local", "hookdet.distributed.rank_watch", "hookdet.runs.index",
           "hookdet.search.cli", "hookdet.search.worker", "hookdet.search.warm_script", "hookdet.ui.command",
           "hookdet.cli.script_entrypoint", "threadpoolctl")
#: Imported after everything else: readies the warm process to be forked (see its docstring).
READY = "hookdet.search.warm_ready"


def cold() -> bool:
    """Whether segments start as new interpreters (``HOOKDET_COLD_SEGMENTS=1``)."""
    return os.environ.get(COLD_ENV, "") not in ("", "0")


def preload_modules(libraries: Sequence[str] = ()) -> List[str]:
    """:data:`PRELOAD`, the modules of the default plugins (read from their entry points: no
    plugin is imported to find them) and ``libraries``, then :data:`READY`."""
    from hookdet.plugins.selection import DEFAULT_PLUGINS

    plugins = {ep.name: ep.module for ep in entry_points(group="hookdet.plugins")}
    return list(PRELOAD) + [plugins[name] for name in DEFAULT_PLUGINS if name in plugins] + list(libraries) + [READY]


def libraries_of(model_dir: Path, entrypoint: Optional[str]) -> List[str]:
    """The installed modules that the entrypoint's module (:func:`entry_module`) imports at its
    top level, directly or through other modules of the model directory, read from the source
    (nothing is run). Modules of the model directory are the user's code and are left out."""
    module = entry_module(entrypoint or "")
    if module is None:
        return []
    found: List[str] = []
    pending, seen = [module], set()
    while pending:
        module = pending.pop()
        source = model_dir / (module.replace(".", "/") + ".py")
        if module in seen or not source.is_file():
            continue
        seen.add(module)
        for name in top_level_imports(source):
            top = name.split(".", 1)[0]
            if (model_dir / top).exists() or (model_dir / f"{top}.py").exists():
                pending.append(name)
            elif name not in found and importlib.util.find_spec(top) is not None:
                found.append(name)
    return found


def entry_module(entrypoint: str) -> Optional[str]:
    """The module of a ``module:Class`` entrypoint, or of the script a ``python3 SCRIPT.py ...``
    one runs (``train`` for ``python3 train.py --epochs 1``); None for any other command."""
    if ":" in entrypoint and " " not in entrypoint.strip():
        return entrypoint.split(":", 1)[0]
    from hookdet.distributed.launcher import is_python

    tokens = entrypoint.split()
    if len(tokens) < 2 or not is_python(tokens[0]):
        return None
    script = os.path.normpath(tokens[1])
    if not script.endswith(".py") or script.startswith(("-", "..", "/")):
        return None
    return script[:-len(".py")].replace(os.sep, ".")


def top_level_imports(source: Path) -> List[str]:
    """Absolute module names imported by the statements at the top level of ``source`` (also
    inside a top-level ``try`` or ``if``)."""
    try:
        tree = ast.parse(source.read_text(), str(source))
    except (OSError, SyntaxError, ValueError):
        return []
    names: List[str] = []
    statements = list(tree.body)
    while statements:
        statement = statements.pop(0)
        if isinstance(statement, ast.Import):
            names += [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
            names.append(statement.module)
        elif isinstance(statement, (ast.Try, ast.If)):
            statements += statement.body + statement.orelse
    return names


_context: Optional[multiprocessing.context.BaseContext] = None
#: Set when the warm process could not start: the worker's later segments start cold.
_warm_failed = False
#: Processes forked ahead (with the end of the pipe their segment comes through), and the threads
#: forking them.
_standby: List[Tuple[multiprocessing.process.BaseProcess, Any]] = []
_standby_makers: List[threading.Thread] = []
_standby_lock = threading.Lock()
_standby_ended_at_exit = False


def forkserver(model_dir: Path, entrypoint: Optional[str]) -> multiprocessing.context.BaseContext:
    """The ``forkserver`` context whose server imports :func:`preload_modules` with the
    libraries of the first trial it serves (one server serves one worker's search)."""
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(preload_modules(libraries_of(model_dir, entrypoint)))
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

    def wait(self, timeout: Optional[float]) -> Optional[int]:
        """The exit status, or None when it still runs after ``timeout`` seconds."""
        if isinstance(self.process, subprocess.Popen):
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
        self.process.join(timeout)
        return self.process.exitcode


def warm_up(model_dir: Path, entrypoint: Optional[str]) -> None:
    """Start the warm process now (it imports while the caller goes on), for trials of
    ``entrypoint`` in ``model_dir``; nothing when segments start cold."""
    if cold() or _warm_failed:
        return
    forkserver(model_dir, entrypoint)
    from multiprocessing import forkserver as server

    server.ensure_running()


def stop_warm_process() -> None:
    """End the warm process now that no segment will start (a search or a worker ends). Left to
    itself it would notice its caller's exit and tear down an interpreter full of torch, about a
    second of a core with the command's output held open (a pipe reading it waits). A process
    forked from it ends it with SIGKILL: it keeps nothing (it never runs a trial's code)."""
    global _context
    if _context is None or cold() or _warm_failed:
        return
    _end_standby()
    try:
        ender = _context.Process(target=_end_parent, name="hookdet-warm-end")
        ender.start()
        ender.join()  # its status comes from the warm process, which is gone: EOF, exit code 255
    except (OSError, EOFError):
        pass
    _context = None


def _end_standby() -> None:
    """End the processes forked ahead: each sees its pipe close and exits, having run nothing."""
    with _standby_lock:
        makers = list(_standby_makers)
        _standby_makers.clear()
    for maker in makers:
        maker.join()
    with _standby_lock:
        waiting = list(_standby)
        _standby.clear()
    for process, sending in waiting:
        sending.close()
        process.join(5)


def _end_parent() -> None:
    os.kill(os.getppid(), signal.SIGKILL)


def gpu_count() -> int:
    """How many GPUs torch sees, asked of a process forked from the warm process once it runs
    (so that a search's driver never imports torch: it starts, and ends, a second sooner); here
    when segments start cold."""
    if _context is not None and not cold() and not _warm_failed:
        try:
            receiving, sending = _context.Pipe(duplex=False)
            asker = _context.Process(target=_send_gpu_count, args=(sending,), name="hookdet-gpus")
            asker.start()
            sending.close()
            count = receiving.recv()
            asker.join()
            return count
        except (OSError, EOFError):  # the warm process failed: start_segment says so
            pass
    return _torch_gpu_count()


def _torch_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def _send_gpu_count(sending: multiprocessing.connection.Connection) -> None:
    sending.send(_torch_gpu_count())
    sending.close()


def start_segment(argv: Sequence[str], env: Dict[str, str], cwd: str, log_path: str,
                  cpus: Sequence[int], entrypoint: Optional[str] = None) -> SegmentProcess:
    """Start ``hookdet <argv>`` in ``cwd`` (the model directory) with exactly ``env``, its output
    appended to ``log_path``, pinned to ``cpus`` (all when empty): forked from the warm process
    (which imports the libraries of ``entrypoint``'s module when it starts), or as a new
    interpreter when :func:`cold` or when the warm process cannot start."""
    global _warm_failed
    if not cold() and not _warm_failed:
        try:
            job = (list(argv), dict(env), cwd, log_path, list(cpus))
            process = _hand_to_standby(job)
            if process is None:
                process = forkserver(Path(cwd), entrypoint).Process(target=run_segment, args=job,
                                                                    name="hookdet-segment")
                process.start()
            _fork_standby(forkserver(Path(cwd), entrypoint))
            return SegmentProcess(process)
        except (OSError, EOFError) as error:  # e.g. a library that crashed the server as it loaded
            _warm_failed = True
            logger.warning("hookdet: warning: the warm process for trials failed to start (%s: %s);"
                           " starting each trial as a new process", type(error).__name__, error)
    return start_cold(argv, env, cwd, log_path, cpus)


def _hand_to_standby(job: Tuple[Any, ...]) -> Optional[multiprocessing.process.BaseProcess]:
    """A process forked ahead, now running ``job``; None when none waits."""
    while True:
        with _standby_lock:
            if not _standby:
                return None
            process, sending = _standby.pop()
        try:
            sending.send(job)
            return process
        except OSError:  # it died waiting (killed from outside): the next, or a fork now
            continue
        finally:
            sending.close()


def _fork_standby(context: multiprocessing.context.BaseContext) -> None:
    """Fork the next segment's process now, in a thread (the segment just started goes on)."""
    global _standby_ended_at_exit

    def fork() -> None:
        try:
            receiving, sending = context.Pipe(duplex=False)
            process = context.Process(target=_wait_for_segment, args=(receiving,), name="hookdet-segment")
            process.start()
            receiving.close()
        except (OSError, EOFError):  # the warm process is gone: the next start says so
            return
        with _standby_lock:
            _standby.append((process, sending))

    maker = threading.Thread(target=fork, name="hookdet-standby", daemon=True)
    with _standby_lock:
        if not _standby_ended_at_exit:  # at any exit of this process, before multiprocessing
            atexit.register(_end_standby)  # joins its children (a standby would wait for ever)
            _standby_ended_at_exit = True
        _standby_makers[:] = [each for each in _standby_makers if each.is_alive()] + [maker]
    maker.start()


def _wait_for_segment(receiving: Any) -> None:
    """In a process forked ahead: wait for the segment to become, and become it."""
    set_parent_death_signal(signal.SIGTERM)  # the warm process (or its worker) died: no segment comes
    try:
        job = receiving.recv()
    except (EOFError, OSError):  # the worker ended it, or is gone
        return
    receiving.close()
    run_segment(*job)


def start_cold(argv: Sequence[str], env: Dict[str, str], cwd: str, log_path: str,
               cpus: Sequence[int]) -> SegmentProcess:
    """:func:`start_segment` as a new interpreter: ``python -m hookdet <argv>``."""
    def child_setup() -> None:
        set_parent_death_signal(signal.SIGTERM)  # checkpoint and stop
        if cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)

    with open(log_path, "a") as log:
        return SegmentProcess(subprocess.Popen(
            [sys.executable, "-m", "hookdet", *argv], env=env, cwd=cwd, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=child_setup))


def holds_packages(entry: str) -> bool:
    """Whether the ``sys.path`` entry holds installed packages' metadata (where entry points are
    found); a model directory does not."""
    try:
        return any(name.endswith((".dist-info", ".egg-info")) for name in os.listdir(entry or "."))
    except OSError:
        return False


def forget_entry_points() -> None:
    """Forget the entry points the warm process read (:mod:`hookdet.search.warm_ready`): this
    segment's ``sys.path`` has packages they were not read from (reading them again costs about
    0.1 s, more than the rest of a segment's start)."""
    import stevedore

    from hookdet.checkpoints.registry import storage_class

    stevedore.ExtensionManager.ENTRY_POINT_CACHE.clear()
    storage_class.cache_clear()


def set_thread_count(threads: int) -> None:
    """Give torch and every BLAS and OpenMP library loaded (NumPy's and SciPy's OpenBLAS, MKL,
    torch's OpenMP) ``threads`` threads: each read ``OMP_NUM_THREADS`` as the warm process loaded
    it, with the warm process's environment, not the segment's."""
    import torch

    torch.set_num_threads(threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # hookdet[search] brings it; without it, torch's threads alone
        return
    threadpool_limits(limits=threads)


def run_segment(argv: List[str], env: Dict[str, str], cwd: str, log_path: str,
                cpus: List[int], errors_path: Optional[str] = None) -> None:
    """In the forked child: become the segment's process, then run ``hookdet <argv>``, its
    output appended to ``log_path`` (its standard error to ``errors_path`` when given)."""
    from hookdet.search.warm_script import end_as_an_interpreter, mark_warm_segment

    mark_warm_segment()
    for stream, path in ((sys.stdout, log_path), (sys.stderr, errors_path or log_path)):
        log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, stream.fileno())
        os.close(log)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # sys.path and the import system as ``python -m`` in ``cwd`` with this PYTHONPATH would
    # have them (the warm process started elsewhere, and files may be new since it did)
    added = [cwd] + [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:0] = [entry for entry in dict.fromkeys(added) if entry not in sys.path]
    importlib.invalidate_caches()
    ready = sys.modules.get(READY)
    if ready is None or any(holds_packages(entry) for entry in sys.path if entry not in ready.PATH_READ):
        forget_entry_points()
    set_parent_death_signal(signal.SIGTERM)  # checkpoint and stop
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    changed = ready.changed_source() if ready is not None else None
    if changed is not None:  # the code as it is now, in a new interpreter (same process, log, signals)
        print(f"hookdet: warning: {changed} changed since the warm process imported it: this segment "
              "starts as a new interpreter", file=sys.stderr, flush=True)
        os.execve(sys.executable, [sys.executable, "-m", "hookdet", *argv], env)
    if "numpy.random" in sys.modules:  # a new interpreter's draws, not the warm process's state
        sys.modules["numpy.random"].seed()
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        set_thread_count(int(threads))
    sys.argv = ["hookdet", *argv]
    end_as_an_interpreter(lambda: runpy.run_module("hookdet", run_name="__main__", alter_sys=True))  # python -m hookdet
