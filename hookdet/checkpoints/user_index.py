"""Every checkpoint this user's local runs wrote, by id: Determined's per-user local store.

Determined's local mode keeps checkpoints in one store per user, so a checkpoint id from any
earlier run resumes (``Trainer.fit(latest_checkpoint=<id>)``, ``hookdet run --resume <id>``)
in a new process with a new run directory. hookdet's checkpoints live wherever each run's
storage puts them; this index says where: one small JSON file per checkpoint id, holding its
storage's locator (never credentials) and the run directory that wrote it, written when the
checkpoint is published and, when retention deletes it, replaced by a note of the rule that did.

The index is ``$HOOKDET_HOME/checkpoint-index`` (default ``$XDG_DATA_HOME/hookdet``, else
``~/.local/share/hookdet``). Losing it loses nothing but the lookup by bare id: run
directories and checkpoint directories still resume by path.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, Optional

from hookdet.checkpoints.storage import check_storage_id

logger = logging.getLogger("hookdet")


def index_dir() -> Path:
    """Where the index is (see the module docstring)."""
    home = os.environ.get("HOOKDET_HOME")
    if home:
        return Path(home) / "checkpoint-index"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "hookdet" / "checkpoint-index"


def record(storage_id: str, locator: Dict[str, Any], run_dir: Path) -> None:
    """Note that checkpoint ``storage_id`` is in the storage ``locator`` describes. A failure to
    write the index costs the lookup by id, never the run: it is logged."""
    entry = {"storage": locator, "run_dir": str(Path(run_dir).absolute())}
    path = index_dir() / f"{check_storage_id(storage_id)}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(entry), encoding="utf-8")
        os.replace(partial, path)
    except OSError as error:
        logger.warning("could not add checkpoint %s to the local index %s: %s", storage_id, path.parent, error)


def forget(storage_id: str, deleted_by: Optional[str] = None, run_dir: Optional[Path] = None) -> None:
    """Drop ``storage_id`` from the index (its checkpoint was deleted). With ``deleted_by`` (the
    rule that deleted it) a note stays in its place, so a later resume by that id is told what
    became of it (:func:`deletion`), not only that it is not found."""
    path = index_dir() / f"{check_storage_id(storage_id)}.json"
    try:
        if deleted_by is None:
            path.unlink(missing_ok=True)
            return
        note = {"deleted_by": deleted_by, "run_dir": str(Path(run_dir).absolute()) if run_dir else None}
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(note), encoding="utf-8")
        os.replace(partial, path)
    except (OSError, ValueError):
        pass


def deletion(storage_id: str) -> Optional[Dict[str, Any]]:
    """``{"deleted_by": rule, "run_dir": ...}`` when checkpoint ``storage_id`` of a local run
    was deleted by its retention, else None."""
    try:
        entry = json.loads((index_dir() / f"{check_storage_id(storage_id)}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and entry.get("deleted_by") else None


def lookup(storage_id: str) -> Optional[Dict[str, Any]]:
    """``{"storage": locator, "run_dir": ...}`` of an indexed checkpoint, or None."""
    try:
        entry = json.loads((index_dir() / f"{check_storage_id(storage_id)}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("storage"), dict) else None


def why_gone(storage_id: str, deleted: Dict[str, Any]) -> str:
    """Why checkpoint ``storage_id`` no longer resumes (its :func:`deletion` note): which run's
    retention deleted it, by which rule."""
    return (f"cannot resume from {storage_id!r}: run {deleted.get('run_dir') or '(unknown)'} deleted "
            f"that checkpoint by its {deleted['deleted_by']}; set checkpoint_storage.save_trial_latest "
            "(or save_trial_best) higher to keep more")
