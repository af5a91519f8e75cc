"""A run takes its run directory: the lock, its run id, the record of its storage, the sweep.

:func:`hookdet.trainer.init` calls :func:`take` on the chief, shares its answer with every rank
(:func:`accept` raises the same error on all of them, so no rank waits on a collective the
chief never joins), then :func:`record` once the storage exists, and :func:`give_up` at the end.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from hookdet.runs.identity import run_id_for, write_identity
from hookdet.checkpoints.os_errors import describe_os_error
from hookdet.checkpoints.storage import StorageError
from hookdet.runs.lock import RunDirLock, RunDirLockedError, sweep_stale_writes

#: Locks held by this process, by ``id(run)``.
_held: Dict[int, RunDirLock] = {}


def take(run: Any) -> Dict[str, str]:
    """Lock ``run.run_dir`` (chief only); ``{"run_id": ...}``, or ``{"error": ...}`` when refused."""
    if run.run_dir.exists() and not run.run_dir.is_dir():
        return {"error": f"run directory {run.run_dir} is a file; give a directory (or a new name)"}
    lock = RunDirLock(run.run_dir)
    try:
        lock.acquire()
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


def give_up(run: Any) -> None:
    """Release the run directory's lock, if this process holds it."""
    lock = _held.pop(id(run), None)
    if lock is not None:
        lock.release()
