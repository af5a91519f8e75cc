"""Which run a checkpoint belongs to, and where a run directory's checkpoints are.

Every run has a *run id*, made when its run directory is first used and kept across every
resume into that directory. It is written to ``<run dir>/run_identity.json`` together with where
the run's checkpoint storage is (a local root, or an S3 bucket and prefix — never credentials)
and, for a ``--fork``, the run it was forked from. Every checkpoint's ``metadata.json`` records
the run id of the run that wrote it.

With that, ``--resume RUN_DIR`` finds the run's newest intact checkpoint wherever its storage
put it (``<run dir>/checkpoints``, a ``shared_fs`` ``host_path``, S3), and only its own; and
``--resume STORE`` of a folder holding several runs' checkpoints is refused with the list of
runs, instead of taking the newest checkpoint of any of them.
"""
from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from hookdet import checkpoint_format as fmt
from hookdet import checkpoint_lookup as lookup
from hookdet.s3_storage import S3Storage
from hookdet.storage_backends import CheckpointStorage, LocalStorage

logger = logging.getLogger("hookdet")

IDENTITY_FILE = "run_identity.json"


def read_identity(run_dir: Union[str, Path]) -> Optional[Dict[str, Any]]:
    """The run identity recorded in ``run_dir``, or None when it has none (or is unreadable)."""
    path = Path(run_dir) / IDENTITY_FILE
    try:
        identity = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return identity if isinstance(identity, dict) and identity.get("run_id") else None


def run_id_for(run_dir: Path) -> str:
    """The run id of ``run_dir``: the one it records, or a new one for a new run."""
    identity = read_identity(run_dir)
    return str(identity["run_id"]) if identity else uuid.uuid4().hex


def describe_storage(storage: Optional[CheckpointStorage]) -> Optional[Dict[str, Any]]:
    """Where ``storage`` keeps checkpoints, as plain values (no credentials)."""
    if isinstance(storage, LocalStorage):
        return {"type": "local", "root": str(storage.root)}
    if isinstance(storage, S3Storage):
        return {"type": "s3", "bucket": storage.bucket, "prefix": storage.prefix,
                "endpoint_url": storage.endpoint_url, "region": storage.region}
    return None


def write_identity(run: Any, parent: Optional[Dict[str, Any]] = None) -> None:
    """Record the run's id and storage (and ``parent`` for a fork) in its run directory."""
    previous = read_identity(run.run_dir) or {}
    identity = {
        "run_id": run.run_id,
        "storage": describe_storage(run.storage),
        "parent": parent if parent is not None else previous.get("parent"),
    }
    path = Path(run.run_dir) / IDENTITY_FILE
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(identity, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)


# ---------------------------------------------------------------------------------------------
# Finding what to resume
# ---------------------------------------------------------------------------------------------


def storage_of(identity: Dict[str, Any], current: Optional[CheckpointStorage]) -> Optional[CheckpointStorage]:
    """The storage a run directory's identity names; ``current`` (the resuming run's storage)
    when it is the same place, so its credentials are used."""
    recorded = identity.get("storage") or {}
    if describe_storage(current) == recorded:
        return current
    if recorded.get("type") == "local":
        return LocalStorage(recorded["root"])
    if recorded.get("type") == "s3":
        return S3Storage(bucket=recorded["bucket"], prefix=recorded.get("prefix") or "",
                         endpoint_url=recorded.get("endpoint_url"), region=recorded.get("region"))
    return None


def _s3_metadata(storage: S3Storage, storage_id: str) -> Optional[Dict[str, Any]]:
    key = storage.location(storage_id)[len(f"s3://{storage.bucket}/"):].rstrip("/") + "/" + fmt.METADATA_FILE
    try:
        body = storage.client.get_object(Bucket=storage.bucket, Key=key)["Body"].read()
        return json.loads(body)
    except Exception as error:  # an unreadable checkpoint is not a candidate
        logger.warning("skipping checkpoint %s: cannot read its metadata: %s", storage_id, error)
        return None


def _checkpoints_of_run(storage: CheckpointStorage, run_id: str) -> List[Tuple[str, int]]:
    """(storage id, steps) of the complete checkpoints ``run_id`` wrote into ``storage``."""
    found = []
    if isinstance(storage, LocalStorage):
        for directory, metadata in lookup.find_checkpoints(storage.root):
            if metadata.get("run_id") == run_id:
                found.append((directory.name, int(metadata.get("steps_completed") or 0)))
    elif isinstance(storage, S3Storage):
        for storage_id in storage.list_ids():
            metadata = _s3_metadata(storage, storage_id)
            if metadata is not None and metadata.get("run_id") == run_id:
                found.append((storage_id, int(metadata.get("steps_completed") or 0)))
    return sorted(found, key=lambda item: item[1])


def locate_for_resume(
    target: Path, current: Optional[CheckpointStorage]
) -> Union[Path, Tuple[CheckpointStorage, str]]:
    """What ``--resume TARGET`` means: a local checkpoint directory, or (storage, storage id).

    A run directory with an identity leads to its run's newest intact checkpoint in the storage
    it records. A checkpoint directory is itself. A folder of checkpoints (or an older run
    directory) resolves as before, unless it holds checkpoints of more than one run: then this
    refuses, listing each run's newest checkpoint, so the user names the one meant.
    """
    target = Path(target)
    identity = read_identity(target)
    if identity is None or (target / fmt.METADATA_FILE).is_file():
        refuse_mixed_store(target)
        return lookup.resolve_checkpoint_dir(target)
    storage = storage_of(identity, current)
    run_id = str(identity["run_id"])
    if storage is None:
        raise fmt.CheckpointError(f"cannot resume: {target / IDENTITY_FILE} names no storage hookdet knows")
    if isinstance(storage, LocalStorage):
        intact = None
        for directory, metadata in reversed(lookup.find_checkpoints(storage.root)):
            if metadata.get("run_id") != run_id:
                continue
            try:
                fmt.verify(directory)
            except fmt.CheckpointError as error:
                logger.warning("skipping checkpoint that fails verification: %s", error)
                continue
            intact = directory
            break
        if intact is None:
            raise fmt.CheckpointError(
                f"cannot resume: run {target} (run id {run_id}) has no intact checkpoint in "
                f"{storage.describe()}"
            )
        return intact
    checkpoints = _checkpoints_of_run(storage, run_id)
    if not checkpoints:
        raise fmt.CheckpointError(
            f"cannot resume: run {target} (run id {run_id}) has no checkpoint in {storage.describe()}"
        )
    return storage, checkpoints[-1][0]


def refuse_mixed_store(folder: Path) -> None:
    """Refuse a folder (not a run directory with an identity) whose checkpoints were written by several runs, naming each run."""
    runs: Dict[str, List[Tuple[int, Path, Dict[str, Any]]]] = {}
    for root in (folder / "checkpoints", folder):
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
