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

Starting the warm process, forking segments from it (and the next one ahead), asking it how
many GPUs torch sees and ending it are the parent's side: a :class:`~hookdet.search.warm_pool.WarmPool`,
owned by the process that runs the search's workers. This module is what the warm process is and
how a child forked from it becomes a segment.

A trial with several ranks (``slots_per_trial > 1``) starts its launcher warm; torchrun then
starts each rank as a new interpreter (its own process start, not a fork of ours). A script
entrypoint's ``hookdet run`` is warm, and it forks the script from itself when the script runs
in this Python (:mod:`hookdet.search.warm_script`).

``HOOKDET_COLD_SEGMENTS=1`` starts every segment as a new interpreter, the way before (used by
the benchmark that compares the two, and as an escape hatch).
"""
from __future__ import annotations

import ast
import importlib.util
import logging
import os
import runpy
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from hookdet.launch.start import become_segment

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


def torch_gpu_count() -> int:
    """How many GPUs torch sees here (0 when torch cannot tell)."""
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


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
    become_segment(cpus)
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
