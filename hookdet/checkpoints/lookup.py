"""Finding checkpoints on local disk: every complete one under a directory, the newest intact
one, and what a path a user gives ``--resume`` (a checkpoint, a folder of them, a run directory)
leads to. Completeness and integrity are :mod:`hookdet.checkpoints.format`'s rules.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hookdet.checkpoints.format import METADATA_FILE, STATE_FILE, CheckpointError, read_metadata, verify
from hookdet.checkpoints.storage import CHECKPOINTS_DIR

logger = logging.getLogger("hookdet")

def checkpoint_dirs(root: Path) -> List[Path]:
    """Every visible (not dot-named) directory directly under ``root``, complete or not."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(child for child in root.iterdir() if child.is_dir() and not child.name.startswith("."))


def find_checkpoints(root: Path) -> List[Tuple[Path, Dict[str, Any]]]:
    """Checkpoints directly under ``root`` whose metadata reads, with it, oldest first.

    Ordered by ``steps_completed`` then creation time. Directories without readable, untampered
    metadata are skipped, each with one line naming it and why: they are incomplete or corrupt
    by definition. Their data files are not checked here; :func:`newest_intact` does that.
    """
    found = []
    for child in checkpoint_dirs(root):
        try:
            found.append((child, read_metadata(child)))
        except CheckpointError as error:
            logger.warning("skipping %s: %s", child, error)
    found.sort(key=lambda item: order_key(item[1]))
    return found


def order_key(metadata: Dict[str, Any]) -> Tuple[int, float]:
    """Checkpoints sort by batch, then creation time (values of the wrong type count as 0)."""
    steps, created = metadata.get("steps_completed", 0), metadata.get("created", 0)
    return (
        steps if type(steps) is int else 0,
        created if type(created) in (int, float) else 0,
    )


def newest_intact(root: Path, exclude: Optional[Path] = None) -> Optional[Path]:
    """The newest checkpoint under ``root`` that passes full verification, or None.

    Newer ones that fail are logged as skipped, with the reason.
    """
    excluded = Path(exclude).resolve() if exclude is not None else None
    for path, _metadata in reversed(find_checkpoints(root)):
        if excluded is not None and path.resolve() == excluded:
            continue
        try:
            verify(path)
        except CheckpointError as error:
            logger.warning("skipping checkpoint that fails verification: %s", error)
            continue
        return path
    return None


def intact_hint(root: Optional[Path], exclude: Optional[Path] = None) -> str:
    """``"; the newest intact checkpoint is X"`` for messages (or what to do when none is)."""
    if root is None:
        return ""
    intact = newest_intact(root, exclude=exclude)
    if intact is None:
        return f"; no intact checkpoint is left in {root}"
    metadata = read_metadata(intact)
    return f"; the newest intact checkpoint is {intact} (batch {metadata.get('steps_completed')})"


def resolve_checkpoint_dir(target: Path) -> Path:
    """A checkpoint directory from a checkpoint, a run directory, or a folder of checkpoints.

    A run directory or folder resolves to its newest intact checkpoint. A directory that is an
    unfinished or damaged checkpoint (no metadata) is refused, naming the newest intact one
    beside it.
    """
    target = Path(target)
    if (target / METADATA_FILE).is_file():
        return target
    if not target.exists():
        raise CheckpointError(f"{target} does not exist")
    if not target.is_dir():
        raise CheckpointError(f"{target} is a file; give a checkpoint directory or a run directory")
    if (target / STATE_FILE).exists():
        raise CheckpointError(
            f"{target} is not a complete checkpoint: it has no {METADATA_FILE} "
            f"(its write was interrupted, or the file was removed){intact_hint(target.parent, target)}"
        )
    for root in (target / CHECKPOINTS_DIR, target):
        candidates = checkpoint_dirs(root)
        if not candidates:
            continue
        newest = newest_intact(root)
        if newest is not None:
            return newest
        if root == target and not any((c / STATE_FILE).exists() or (c / METADATA_FILE).exists() for c in candidates):
            continue
        raise CheckpointError(
            f"no intact checkpoint under {root}: each of its {len(candidates)} checkpoint "
            "directories is incomplete or fails verification"
        )
    raise CheckpointError(
        f"{target} holds no checkpoint (no {METADATA_FILE} in it, in {target / 'checkpoints'} "
        "or in its subdirectories)"
    )
