"""Helpers of the fault corpus: experiment files, ``hookdet run`` in a child process
(:mod:`tests.support.hookdet_process`) with a bound far below the test's own timeout, and the
figures the corpus reports.

Every child is started in a session of its own and, whatever happens, its whole process group
is killed when the helper returns, so a failing case never leaves a process behind.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from tests.support import hookdet_process

#: The model directory of the tests' trials (``resume_trials:RegressionTrial``, ...).
TESTS = Path(__file__).resolve().parents[1] / "support"
REPO = TESTS.parents[1]

#: Bound on one ``hookdet run`` of the corpus, in seconds (the tests' own limit is far above).
CASE_TIMEOUT = 360

#: (case, seconds from the fault to the exit) of every case run; the slowest is reported.
EXIT_TIMES: List[tuple] = []


def child_env(**extra: str) -> Dict[str, str]:
    return hookdet_process.child_env(None, **{"OMP_NUM_THREADS": "1", **extra})


def write_config(path: Path, hparams: Optional[Dict[str, Any]] = None, **fields: Any) -> Path:
    """A small ``resume_trials:RegressionTrial`` experiment (20 batches per epoch)."""
    config: Dict[str, Any] = {
        "name": path.stem,
        "entrypoint": "resume_trials:RegressionTrial",
        "hyperparameters": {"records": 160, "global_batch_size": 8, "lr": 0.01, **(hparams or {})},
        "searcher": {"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                     "max_length": {"batches": 12}},
        "min_validation_period": {"batches": 4},
        "min_checkpoint_period": {"batches": 4},
        "scheduling_unit": 1,
        "reproducibility": {"experiment_seed": 5},
    }
    config.update(fields)
    path.write_text(yaml.safe_dump(config))
    return path


def start(args: Sequence[str], env: Optional[Dict[str, str]] = None, prefix: Sequence[str] = (),
          cold: bool = False) -> hookdet_process.Hookdet:
    """``hookdet ARGS`` in its own session (the tests directory holds the trials), warm unless
    ``cold`` or run through ``prefix`` (e.g. ``setpriv ...``)."""
    if args and args[0] == "run" and "--model-dir" not in args:
        args = [*args, "--model-dir", str(TESTS)]
    return hookdet_process.start(*args, cwd=REPO, env=child_env(**(env or {})), prefix=prefix, cold=cold)


def finish(process: hookdet_process.Hookdet, case: str, since: Optional[float] = None,
           timeout: float = CASE_TIMEOUT, fault: bool = True) -> "tuple[int, str, str]":
    """Wait for ``process`` (killing its group past ``timeout``); (status, stdout, stderr).

    ``since`` is when the fault happened; for a ``fault`` case, the time from it to the exit is
    recorded under ``case``.
    """
    since = time.monotonic() if since is None else since
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{case}: still running after {timeout} s (hung)\n{process.output()[1][-3000:]}")
    if fault:
        EXIT_TIMES.append((case, time.monotonic() - since))
    return process.returncode, stdout, stderr


def run(args: Sequence[str], case: str, env: Optional[Dict[str, str]] = None,
        timeout: float = CASE_TIMEOUT, fault: bool = True) -> "tuple[int, str, str]":
    """Start and finish ``hookdet ARGS``."""
    return finish(start(args, env), case, timeout=timeout, fault=fault)


def error_lines(stderr: str) -> List[str]:
    """The ``hookdet: error:`` lines of ``stderr``."""
    return [line for line in stderr.splitlines() if line.startswith("hookdet: error:")]


def assert_one_line(stderr: str, *fragments: str) -> str:
    """Exactly one error line, containing every fragment, and no traceback."""
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr[-4000:]
    assert "Traceback" not in stderr, stderr[-4000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def wait_until(predicate: Any, process: hookdet_process.Hookdet, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            _, stderr = process.communicate()
            raise AssertionError(f"exited ({process.returncode}) before {what}:\n{stderr[-3000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def checkpoint_metadata(root: Path) -> List[Dict[str, Any]]:
    """Metadata of every complete checkpoint directly under ``root``, oldest first."""
    from hookdet.checkpoints import lookup as lookup

    return [metadata for _, metadata in lookup.find_checkpoints(root)]
