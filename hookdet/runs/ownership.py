"""A run takes its run directory: the lock, its run id, the record of its storage, the sweep.

:func:`hookdet.loop.trainer.init` calls :func:`take` on the chief, shares its answer with every rank
(:func:`accept` raises the same error on all of them, so no rank waits on a collective the
chief never joins), then :func:`record` once the storage exists, and :func:`give_up` at the end
(which removes a directory it made for a run that failed before training a batch).
:func:`refuse_second_history` keeps one history per run directory: training that does not resume
may not start in a directory that already holds a run, nor continue there another run's
checkpoint, nor continue a copy that shares its checkpoints with the run it was copied from; a
copy that took its checkpoints along is a run of its own (a new run id, the original its parent).
"""
from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any, Dict, Optional, Set

from hookdet.checkpoints.resolver import moved_with_the_run, read_identity
from hookdet.runs.identity import run_id_for, write_identity
from hookdet.checkpoints.os_errors import describe_os_error
from hookdet.checkpoints.storage import StorageError
from hookdet.errors import UsageError
from hookdet.runs.files import CONFIG_FILE, IDENTITY_FILE, RUN_RECORD_FILE
from hookdet.runs.lock import RunDirLock, RunDirLockedError, sweep_stale_writes
from hookdet.runs.record import read_bytes

#: Locks held by this process, by ``id(run)``.
_held: Dict[int, RunDirLock] = {}
#: ``id(run)`` of the runs whose run directory this process made.
_made_here: Set[int] = set()
#: The run each copied run directory was copied from (its parent), by ``id(run)``.
_copies: Dict[int, Dict[str, Any]] = {}


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
    held = identity_in(read_bytes(Path(run.run_dir) / IDENTITY_FILE))  # as written, where it was written
    original = copied_with_its_checkpoints(run.run_dir, held) if held is not None else None
    if original is None:
        return {"run_id": run_id_for(run.run_dir)}
    _copies[id(run)] = {"run_dir": original, "run_id": held["run_id"], "copied": True}  # type: ignore[index]
    return {"run_id": uuid.uuid4().hex}


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
        write_identity(run, parent=_copies.pop(id(run), None))
        sweep_stale_writes(run)
    return problem


def raise_problem(problem: Optional[str]) -> None:
    """Raise :func:`record`'s problem on every rank (a :class:`StorageError`)."""
    if problem is not None:
        raise StorageError(problem)


class ExistingRunError(UsageError, ValueError):
    """Training would start a second history in a run directory that holds a run already
    (:func:`refuse_second_history`): one line from ``hookdet run``."""


def refuse_second_history(run: Any, resuming: bool) -> None:
    """Raise :class:`ExistingRunError` on every rank when ``run`` would start a second history in
    a run directory that held a run before this process started (the chief decides, from the
    records :func:`hookdet.runs.record.record_start` kept, and tells the others): training from
    batch 0 there, resuming there a checkpoint another run wrote, or resuming a copy of a run
    directory whose checkpoints it shares with the original (:func:`second_history`)."""
    problem = second_history(run, resuming) if run.is_chief else None
    problem = run.distributed.broadcast(problem) if run.distributed is not None else problem
    if problem is not None:
        raise ExistingRunError(problem)


def second_history(run: Any, resuming: bool) -> Optional[str]:
    """Why ``run`` would start a second history in its run directory (see
    :func:`refuse_second_history`), or None. A directory is owned by the run id it records: a
    checkpoint of that run (or of the run it was forked from) continues it; a directory moved
    elsewhere is the same run; a copy is a run of its own only where its checkpoints travelled
    with it (the default storage, inside the run directory)."""
    prior = run.prior_records or {}
    if not resuming:
        if prior.get(RUN_RECORD_FILE) is not None or prior.get(CONFIG_FILE) is not None:
            return (f"run directory {run.run_dir} already holds a run; continue it with "
                    f"Trainer.fit(latest_checkpoint={str(run.run_dir)!r}) (hookdet run --resume {run.run_dir}), "
                    "or give another run_dir (one run directory, one history)")
        return None
    written_by = run.hook.hookdet_resume_run_id(run=run, checkpoint=run.resume_from)
    held = identity_in(prior.get(IDENTITY_FILE))
    if held is None:
        return None
    own = {str(run_id) for run_id in (held["run_id"], (held.get("parent") or {}).get("run_id")) if run_id}
    if written_by is not None and written_by not in own:
        return (f"cannot resume {run.resume_from} in run directory {run.run_dir}: that checkpoint was written by "
                f"run {written_by}, and the directory holds run {held['run_id']} (one run directory, one history); "
                "resume the checkpoint's own run directory, or continue from it in a new run directory")
    original = copied_from(run.run_dir, held)
    if original is not None:
        return (f"cannot resume run directory {run.run_dir}: it is a copy of {original}, which holds the same run "
                f"({held['run_id']}) and shares its checkpoint storage, so both would write one run's history; "
                f"resume {original}, or continue from one of its checkpoints in a new run directory")
    return None


def identity_in(content: Optional[bytes]) -> Optional[Dict[str, Any]]:
    """The run identity in ``content`` (a ``run_identity.json`` as it was), or None."""
    try:
        identity = json.loads(content) if content is not None else None
    except ValueError:
        return None
    return identity if isinstance(identity, dict) and identity.get("run_id") else None


def copied_from(run_dir: Path, held: Dict[str, Any]) -> Optional[str]:
    """The run directory that ``run_dir`` (which recorded identity ``held``) was copied from,
    when that directory still holds the same run and the copy would use its checkpoint storage;
    None for a directory moved (the original is gone), reached through a symlink, or copied
    with its own checkpoints."""
    original = original_of(run_dir, held)
    return original if original is not None and shares_storage(run_dir, held, original) else None


def copied_with_its_checkpoints(run_dir: Path, held: Dict[str, Any]) -> Optional[str]:
    """The run directory that ``run_dir`` was copied from with its checkpoints (the default
    storage, inside the run directory, travelled with the copy), while the original still holds
    the same run: the copy is a run of its own, with a new run id and the original as its
    parent (:func:`take`), never a second history under the original's id. None otherwise."""
    original = original_of(run_dir, held)
    return original if original is not None and not shares_storage(run_dir, held, original) else None


def original_of(run_dir: Path, held: Dict[str, Any]) -> Optional[str]:
    """The other run directory ``held`` (``run_dir``'s identity) was written in, when it still
    holds the same run (``run_dir`` is a copy of it); None when ``run_dir`` is where it was written,
    the same directory under another name (a symlink), or moved (the original is gone)."""
    written_in = held.get("run_dir")
    if not isinstance(written_in, str) or Path(written_in).resolve() == Path(run_dir).resolve():
        return None
    original = read_identity(written_in)
    return written_in if original is not None and original["run_id"] == held["run_id"] else None


def shares_storage(run_dir: Path, held: Dict[str, Any], original: str) -> bool:
    """Whether the copy ``run_dir`` would use the checkpoint storage of ``original``."""
    return moved_with_the_run(held, Path(run_dir)).get("storage") == (read_identity(original) or {}).get("storage")


def give_up(run: Any, discard: bool = False) -> None:
    """Release the run directory's lock, if this process holds it. With ``discard`` (the run
    failed before training a batch: a typo in ``--resume``, a trial that does not build), a run
    directory this process made is removed: it holds nothing worth keeping, and a stray
    directory would pass for a run."""
    lock = _held.pop(id(run), None)
    made_here = id(run) in _made_here
    _made_here.discard(id(run))
    _copies.pop(id(run), None)
    if lock is not None:
        lock.release()
    if discard and made_here:
        shutil.rmtree(run.run_dir, ignore_errors=True)
