"""One way to a checkpoint: from whatever a user names to a storage and a checkpoint.

A user names a checkpoint as a checkpoint directory, a run directory (its run's newest intact
checkpoint, wherever the run's storage keeps it), a folder of checkpoints, or a checkpoint id
(found through the user's checkpoint index, :mod:`hookdet.checkpoints.user_index`). Every reader
goes through here: ``--resume`` and ``Trainer.fit(latest_checkpoint=...)`` (the checkpoint
plugin's restore), ``hookdet export`` and ``show``, ``load_trial_from_checkpoint_path`` and the
search worker. Storages are built only from the entry-point types (:mod:`.registry`), from the
locator a run recorded in its ``run_identity.json``.

Every run has a *run id*, made when its run directory is first used and kept across every resume
into it, recorded in ``<run dir>/run_identity.json`` with where its checkpoint storage is (a local
root, or a bucket and prefix, never credentials); every checkpoint's ``metadata.json`` records the
run id of the run that wrote it. So ``--resume RUN_DIR`` finds that run's newest intact checkpoint,
and only its own, and ``--resume STORE`` of a folder holding several runs' checkpoints is refused
with the list of runs. Writing that record is the run's (:mod:`hookdet.runs.identity`).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import lookup as lookup
from hookdet.checkpoints import user_index
from hookdet.checkpoints.object_store import ObjectStorage
from hookdet.checkpoints.registry import storage_from_locator
from hookdet.checkpoints.storage import CHECKPOINTS_DIR, IDENTITY_FILE, CheckpointStorage, StorageError

logger = logging.getLogger("hookdet")


def read_identity(run_dir: Union[str, Path]) -> Optional[Dict[str, Any]]:
    """The run identity recorded in ``run_dir``, or None when it has none (or is unreadable)."""
    path = Path(run_dir) / IDENTITY_FILE
    try:
        identity = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(identity, dict) or not identity.get("run_id"):
        return None
    return moved_with_the_run(identity, Path(run_dir))


def moved_with_the_run(identity: Dict[str, Any], run_dir: Path) -> Dict[str, Any]:
    """``identity`` as seen from ``run_dir`` when the run directory was copied or moved since it
    was written: a storage path inside the run directory it was written in (the default storage,
    ``checkpoints/``) is taken inside ``run_dir``, so a copy resumes from its own checkpoints,
    never from the original's. Paths outside it (a shared folder, a bucket) stay as they are.
    (Reached through a symlink instead, the same directory is read under its other name.)"""
    written_in = identity.get("run_dir")
    here = str(run_dir.absolute())
    if not isinstance(written_in, str) or written_in == here or not isinstance(identity.get("storage"), dict):
        return identity
    storage = dict(identity["storage"])
    for key, value in storage.items():
        if isinstance(value, str) and os.path.isabs(value) and \
                (value == written_in or value.startswith(written_in.rstrip(os.sep) + os.sep)):
            storage[key] = here + value[len(written_in.rstrip(os.sep)):]
    return dict(identity, storage=storage, run_dir=here)


def storage_of(identity: Dict[str, Any], current: Optional[CheckpointStorage]) -> CheckpointStorage:
    """The storage a run directory's identity records; ``current`` (the resuming run's storage)
    when it is the same place, so its credentials are used. :class:`~fmt.CheckpointError` when
    the recorded type is not installed or its record does not rebuild it."""
    try:
        return storage_from_locator(identity.get("storage") or {}, current)
    except StorageError as error:
        raise fmt.CheckpointError(f"cannot find the run's checkpoints: {error}") from error


def checkpoints_of_run(storage: CheckpointStorage, identity: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    """(storage id, metadata) of the complete checkpoints the run of ``identity`` wrote into
    ``storage`` (:func:`own_run_ids`), oldest first (by batch, then creation time)."""
    run_ids = own_run_ids(identity)
    found = [(storage_id, metadata) for storage_id, metadata in storage.list() if metadata.get("run_id") in run_ids]
    return sorted(found, key=lambda item: lookup.order_key(item[1]))


def own_run_ids(identity: Dict[str, Any]) -> Tuple[str, ...]:
    """The run ids whose checkpoints are the run's own: its id, and for a run directory copied
    with its checkpoints (a run of its own, :func:`hookdet.runs.ownership.copied_with_its_checkpoints`)
    the id of the run it was copied from, which wrote those it took along. (A fork's parent's are
    not: a fork continues from the one checkpoint it was given.)"""
    parent = identity.get("parent") or {}
    copied = parent.get("run_id") if isinstance(parent, dict) and parent.get("copied") else None
    return tuple(str(run_id) for run_id in (identity["run_id"], copied) if run_id)


def newest_checkpoint_steps(run_dir: Path) -> Optional[int]:
    """Batches trained at the newest checkpoint the run in ``run_dir`` wrote, wherever its
    storage keeps it; None when it wrote none (or records no identity)."""
    identity = read_identity(run_dir)
    if identity is None:
        return None
    checkpoints = checkpoints_of_run(storage_of(identity, None), identity)
    return lookup.order_key(checkpoints[-1][1])[0] if checkpoints else None


def locate_for_resume(
    target: Path, current: Optional[CheckpointStorage]
) -> Union[Path, Tuple[CheckpointStorage, str]]:
    """What ``--resume TARGET`` means: a local checkpoint directory, or (storage, storage id).

    A run directory with an identity leads to its run's newest intact checkpoint in the storage
    it records, verified here (an object store's fetched ahead, the download kept for the
    restore), newer damaged ones skipped with a line naming each where it is. A checkpoint
    directory is itself. A folder
    of checkpoints (or an older run directory) resolves as before, unless it holds checkpoints
    of more than one run: then this refuses, listing each run's newest checkpoint, so the user
    names the one meant.
    """
    target = Path(target)
    identity = read_identity(target)
    if identity is None or (target / fmt.METADATA_FILE).is_file():
        refuse_mixed_store(target)
        return lookup.resolve_checkpoint_dir(target)
    storage = storage_of(identity, current)
    run_id = str(identity["run_id"])
    checkpoints = checkpoints_of_run(storage, identity)
    for storage_id, _metadata in reversed(checkpoints):
        directory = storage.local_dir(storage_id)
        if directory is None and not isinstance(storage, ObjectStorage):
            return storage, storage_id  # a storage that cannot fetch ahead: verified as it is restored
        fetched = None
        try:
            if directory is None:
                fetched = storage.fetch(storage_id)
            fmt.verify(directory or fetched)
        except (fmt.CheckpointError, StorageError) as error:
            told = str(error)
            if directory is None:  # name the checkpoint where it is, not the folder it was fetched to
                told = told.replace(str(fetched), storage.location(storage_id)) if fetched else told
                storage.drop_fetched(storage_id)
            logger.warning("skipping checkpoint that fails verification: %s", told)
            continue
        return directory or (storage, storage_id)
    raise fmt.CheckpointError(
        f"cannot resume: run {target} (run id {run_id}) has no intact checkpoint in {storage.describe()}"
    )


def refuse_mixed_store(folder: Path) -> None:
    """Refuse a folder (not a run directory with an identity) whose checkpoints were written by several runs, naming each run.
    A checkpoint is no such folder: what is inside it (Determined's ``code/``) is not a checkpoint."""
    if (folder / fmt.METADATA_FILE).is_file():
        return
    runs: Dict[str, List[Tuple[int, Path, Dict[str, Any]]]] = {}
    for root in (folder / CHECKPOINTS_DIR, folder):
        for directory, metadata in lookup.find_checkpoints(root):
            run_id = str(metadata.get("run_id") or "(no run id)")
            runs.setdefault(run_id, []).append((int(metadata.get("steps_completed") or 0), directory, metadata))
    if len(runs) < 2:
        return
    listed = []
    for run_id, entries in sorted(runs.items()):
        steps, newest, metadata = max(entries, key=lambda entry: entry[0])
        name = (metadata.get("experiment_config") or {}).get("name") or "?"
        listed.append(f"run {run_id} (experiment {name!r}, {len(entries)} checkpoint(s), newest {newest} at batch {steps})")
    raise fmt.CheckpointError(
        f"cannot resume: {folder} holds checkpoints of {len(runs)} runs; resume a run directory, "
        "or name one checkpoint directory: " + "; ".join(listed)
    )


def storage_holding(storage_id: str, entry: Optional[Dict[str, Any]],
                    current: Optional[CheckpointStorage]) -> CheckpointStorage:
    """The storage checkpoint ``storage_id`` is in: the one its entry in the user's checkpoint
    index names (a checkpoint of any earlier local run, as in Determined's per-user store), else
    ``current`` (the running run's own; the caller has made sure there is one)."""
    if entry is None:
        assert current is not None, "no index entry and no storage of a run to look in"
        return current
    try:
        return storage_from_locator(entry["storage"], current)
    except StorageError as error:
        raise fmt.CheckpointError(
            f"cannot resume from checkpoint {storage_id!r} (written by run {entry.get('run_dir')}): {error}"
        ) from error


def locate(name: str, current: Optional[CheckpointStorage],
           doing: str = "resume") -> Tuple[Union[Path, CheckpointStorage], Optional[str]]:
    """``(local checkpoint directory, None)`` or ``(storage, storage id)`` for what a user named: a
    checkpoint directory, a run directory (its newest intact checkpoint, :func:`locate_for_resume`)
    or a checkpoint id, found in the storage the user's checkpoint index names, else in
    ``current`` (the running run's storage; None for a reader outside a run). ``doing`` names
    what failed in a message (``resume``, ``read``)."""
    path = Path(name)
    if path.exists():
        found = locate_for_resume(path, current)
        return (lookup.resolve_checkpoint_dir(found), None) if isinstance(found, Path) else found
    if "/" in name or "\\" in name or name.startswith("."):
        raise fmt.CheckpointError(f"cannot {doing}: {name} does not exist")
    entry = user_index.lookup(name)
    if current is None and entry is None:
        deleted = user_index.deletion(name)
        if deleted is not None:
            raise fmt.CheckpointError(user_index.why_gone(name, deleted))
        raise fmt.CheckpointError(
            f"cannot {doing} {name!r}: no such run directory or checkpoint directory in {Path.cwd()}, "
            f"and no checkpoint with that id in this user's checkpoint index ({user_index.index_dir()})"
        )
    storage = storage_holding(name, entry, current)
    directory = storage.local_dir(name)
    return (directory, None) if directory is not None and directory.is_dir() else (storage, name)


@contextlib.contextmanager
def fetched(target: Path) -> Iterator[Path]:
    """A local directory of the checkpoint ``target`` names (a checkpoint or run directory, or a
    checkpoint id of the user's index, :func:`locate`), fetched when its storage is remote."""
    where, storage_id = locate(str(target), None, "read")
    if storage_id is None:
        yield Path(where)  # type: ignore[arg-type]
        return
    storage: CheckpointStorage = where  # type: ignore[assignment]
    try:
        with storage.restore_path(storage_id) as restored:
            yield Path(restored)
    except StorageError as error:
        raise fmt.CheckpointError(f"cannot read checkpoint {storage_id!r}: {error}") from error
