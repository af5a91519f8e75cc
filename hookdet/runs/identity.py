"""A run's identity, written: its run id and where its checkpoints are, in ``run_identity.json``.

Every run has a *run id*, made when its run directory is first used and kept across every
resume into that directory. It is written to ``<run dir>/run_identity.json`` together with where
the run's checkpoint storage is (a local root, or an S3 bucket and prefix — never credentials)
and, for a ``--fork``, the run it was forked from. Every checkpoint's ``metadata.json`` records
the run id of the run that wrote it.

Reading it, and everything that leads from what a user names to a checkpoint, is
:mod:`hookdet.checkpoints.resolver`'s.
"""
from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Dict, Optional, Union

from hookdet.checkpoints.resolver import read_identity
from hookdet.runs.files import IDENTITY_FILE

logger = logging.getLogger("hookdet")


def run_id_for(run_dir: Path) -> str:
    """The run id of ``run_dir``: the one it records, or a new one for a new run."""
    identity = read_identity(run_dir)
    return str(identity["run_id"]) if identity else uuid.uuid4().hex


def write_identity(run: Any, parent: Optional[Dict[str, Any]] = None) -> None:
    """Record the run's id and storage (and ``parent`` for a fork) in its run directory."""
    previous = read_identity(run.run_dir) or {}
    identity = {
        "run_id": run.run_id,
        "storage": run.storage.locator() if run.storage is not None else None,
        "parent": parent if parent is not None else previous.get("parent"),
    }
    adopt_identity(run.run_dir, identity)  # with the run directory, where the storage paths were written


def adopt_identity(run_dir: Union[str, Path], identity: Dict[str, Any]) -> None:
    """Write ``identity`` (another run directory's, :func:`read_identity`) into ``run_dir``, so
    ``--resume run_dir`` finds that run's checkpoints in the storage it records: how a search
    worker on another machine continues a trial whose checkpoints are in S3. ``run_dir`` takes
    the run over (it is recorded as where the identity is written): it is not a copy of the
    other directory, whose run it continues (:func:`hookdet.runs.ownership.copied_from`)."""
    path = Path(run_dir) / IDENTITY_FILE
    partial = path.with_name(f".{path.name}.partial")
    identity = dict(identity, run_dir=str(Path(run_dir).absolute()))
    partial.write_text(json.dumps(identity, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)


# ---------------------------------------------------------------------------------------------
# Finding what to resume
# ---------------------------------------------------------------------------------------------
