"""A run takes its run directory: the lock, its run id, the record of its storage, the sweep.

:func:`hookdet.loop.trainer.init` calls :func:`take` on the chief, shares its answer with every rank
(:func:`accept` raises the same error on all of them, so no rank waits on a collective the
chief never joins), then :func:`record` once the storage exists, and :func:`give_up` at the end
(which removes a directory it made for a run that failed before training a batch).
:func:`refuse_second_history` keeps one history per run directory: training that does not resume
may not start in a directory that already holds a run.
"""
from __future__ import annotations

import shutil
from typing import Any, Dict, Optional, Set

from hookdet.runs.identity import run_id_for, write_identity
from hookdet.checkpoints.os_errors import describe_os_error
from hookdet.checkpoints.storage import StorageError
from hookdet.runs.files import CONFIG_FILE, RUN_RECORD_FILE
from hookdet.runs.lock import RunDirLock, RunDirLockedError, sweep_stale_writes

#: Locks held by this process, by ``id(run)``.
_held: Dict[int, RunDirLock] = {}
#: ``id(run)`` of the runs whose run directory this process made.
_made_here: Set[int] = set()


def take(run: Any) -> Dict[str, str]:
    """Lock ``run.run_dir`` (chief only); ``{"run_id": ...}``, or ``{"error": ...}`` when refused."""
    lock = RunDirLock(run.run_dir)
    try:
        if run.run_dir.exists() and not run.run_dir.is_dir():
            return {"error": f"run directory {run.run_dir} is a file; give a directory (or a new name)"}
        new = not run.run_dir.exists()
        lock.acquire()
        if new:
            _made_here.add(id(run))
    except RunDirLockedError as error:
        return {"error": str(error)}
    except OSError as error:
        return {"error": f"cannot use run directory {run.run_dir}: {describe_os_error(error)}"}
    _held[id(run)] = lock
    return {"run_id": run_id_for(run.run_dir)}


def accept(claim: Optional[Dict[str, str]]) -> Optional[str]:
    """The run id from :func:`take`'s answer; raises its refusal on every rank. (None when no
    answer came: a rank whose collectives are stand-ins, in tests.)"""
    if claim is None:
        return None
    if "error" in claim:
        raise RunDirLockedError(claim["error"])
    return claim["run_id"]


def record(run: Any) -> Optional[str]:
    """Check the storage takes checkpoints, write the run's identity (id, storage) and sweep
    stale writes (chief, locked); the storage's problem in one line, or None."""
    problem = run.storage.check()
    if problem is None:
        write_identity(run)
        sweep_stale_writes(run)
    return problem


def raise_problem(problem: Optional[str]) -> None:
    """Raise :func:`record`'s problem on every rank (a :class:`StorageError`)."""
    if problem is not None:
        raise StorageError(problem)


class ExistingRunError(ValueError):
    """Training that does not resume was pointed at a run directory that holds a run already."""


def refuse_second_history(run: Any, resuming: bool) -> None:
    """Raise :class:`ExistingRunError` on every rank when ``run`` would train from batch 0 in a
    run directory that held a run before this process started (the chief decides, from the
    records :func:`hookdet.runs.record.record_start` kept, and tells the others)."""
    problem = None
    if run.is_chief and not resuming:
        prior = run.prior_records or {}
        if prior.get(RUN_RECORD_FILE) is not None or prior.get(CONFIG_FILE) is not None:
            problem = (
                f"run directory {run.run_dir} already holds a run; continue it with "
                f"Trainer.fit(latest_checkpoint={str(run.run_dir)!r}) (hookdet run --resume {run.run_dir}), "
                "or give another run_dir (one run directory, one history)"
            )
    problem = run.distributed.broadcast(problem) if run.distributed is not None else problem
    if problem is not None:
        raise ExistingRunError(problem)


def give_up(run: Any, discard: bool = False) -> None:
    """Release the run directory's lock, if this process holds it. With ``discard`` (the run
    failed before training a batch: a typo in ``--resume``, a trial that does not build), a run
    directory this process made is removed: it holds nothing worth keeping, and a stray
    directory would pass for a run."""
    lock = _held.pop(id(run), None)
    made_here = id(run) in _made_here
    _made_here.discard(id(run))
    if lock is not None:
        lock.release()
    if discard and made_here:
        shutil.rmtree(run.run_dir, ignore_errors=True)
