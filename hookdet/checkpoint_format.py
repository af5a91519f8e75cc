"""The checkpoint directory: how it is written, verified and read.

A checkpoint is a directory holding ``state_dict.pth`` (Determined's file name and keys) and any
files plugins or callbacks add, plus ``metadata.json``, written last, with a manifest (size and
sha256 of every other file). A directory without ``metadata.json``, or whose files disagree with
its manifest, is not a checkpoint. ``state_dict.pth`` loads with ``torch.load(weights_only=True)``:
it holds tensors and plain Python values only.
"""
from __future__ import annotations

import hashlib
import io
import json
import platform
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

FORMAT_VERSION = 1
STATE_FILE = "state_dict.pth"
METADATA_FILE = "metadata.json"


class CheckpointError(Exception):
    """A checkpoint is missing, corrupt, incomplete or belongs to another trial."""


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_state(directory: Path, state: Dict[str, Any]) -> None:
    """Write ``state`` as ``state_dict.pth`` in ``directory``."""
    torch.save(state, directory / STATE_FILE)


def write_metadata(directory: Path, metadata: Dict[str, Any]) -> Dict[str, Any]:
    """Seal ``directory``: add the manifest of every file to ``metadata`` and write it last."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = path.relative_to(directory).as_posix()
        if relative == METADATA_FILE:
            continue
        files[relative] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
    sealed = dict(metadata, format_version=FORMAT_VERSION, files=files, created=time.time())
    (directory / METADATA_FILE).write_text(json.dumps(sealed, indent=2, sort_keys=True, default=str))
    return sealed


def base_metadata(**fields: Any) -> Dict[str, Any]:
    """Metadata common to every checkpoint: library versions and the given fields."""
    import hookdet

    return dict(
        fields,
        versions={
            "hookdet": hookdet.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    )


def read_metadata(directory: Path) -> Dict[str, Any]:
    """``metadata.json`` of ``directory``; CheckpointError when missing or unreadable."""
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory} is not a complete checkpoint: it has no {METADATA_FILE}")
    try:
        metadata = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path} is unreadable: {error}") from error
    if not isinstance(metadata, dict) or "files" not in metadata:
        raise CheckpointError(f"{path} is not hookdet checkpoint metadata (no file manifest)")
    return metadata


def verify(directory: Path) -> Dict[str, Any]:
    """Check every file against the manifest; return the metadata or raise CheckpointError."""
    directory = Path(directory)
    metadata = read_metadata(directory)
    for relative, expected in metadata["files"].items():
        path = directory / relative
        if not path.is_file():
            raise CheckpointError(f"checkpoint {directory} is corrupt: {relative} is missing")
        size = path.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(
                f"checkpoint {directory} is corrupt: {relative} has {size} bytes, "
                f"the manifest says {expected['size']} (truncated?)"
            )
        if sha256_of(path) != expected["sha256"]:
            raise CheckpointError(f"checkpoint {directory} is corrupt: {relative} fails its sha256 check")
    return metadata


def load_state(directory: Path, map_location: Any = "cpu", **torch_load_kwargs: Any) -> Dict[str, Any]:
    """Verify ``directory`` and load its ``state_dict.pth`` with ``weights_only=True``.

    The state file is read once: hashed and deserialised from the same bytes.
    """
    directory = Path(directory)
    metadata = read_metadata(directory)
    expected = metadata["files"].get(STATE_FILE)
    if expected is None:
        raise CheckpointError(f"checkpoint {directory} has no {STATE_FILE} in its manifest")
    verify_others = {k: v for k, v in metadata["files"].items() if k != STATE_FILE}
    for relative, entry in verify_others.items():
        path = directory / relative
        if not path.is_file() or path.stat().st_size != entry["size"] or sha256_of(path) != entry["sha256"]:
            raise CheckpointError(f"checkpoint {directory} is corrupt: {relative} does not match its manifest")
    try:
        payload = (directory / STATE_FILE).read_bytes()
    except OSError as error:
        raise CheckpointError(f"checkpoint {directory}: cannot read {STATE_FILE}: {error}") from error
    if len(payload) != expected["size"] or hashlib.sha256(payload).hexdigest() != expected["sha256"]:
        raise CheckpointError(
            f"checkpoint {directory} is corrupt: {STATE_FILE} does not match its manifest "
            f"({len(payload)} bytes, manifest says {expected['size']})"
        )
    torch_load_kwargs.setdefault("weights_only", True)
    try:
        return torch.load(io.BytesIO(payload), map_location=map_location, **torch_load_kwargs)
    except Exception as error:
        raise CheckpointError(f"checkpoint {directory}: {STATE_FILE} does not load: {error}") from error


def find_checkpoints(root: Path) -> List[Tuple[Path, Dict[str, Any]]]:
    """Complete checkpoints directly under ``root`` with their metadata, oldest first.

    Ordered by ``steps_completed`` then creation time; directories without readable metadata are
    skipped (they are incomplete by definition).
    """
    found = []
    if not Path(root).is_dir():
        return found
    for child in Path(root).iterdir():
        if child.is_dir() and not child.name.startswith("."):
            try:
                found.append((child, read_metadata(child)))
            except CheckpointError:
                continue
    found.sort(key=lambda item: (item[1].get("steps_completed", 0), item[1].get("created", 0)))
    return found


def newest_intact(root: Path, exclude: Optional[Path] = None) -> Optional[Path]:
    """The newest checkpoint under ``root`` that passes verification, or None."""
    for path, _metadata in reversed(find_checkpoints(root)):
        if exclude is not None and Path(path).resolve() == Path(exclude).resolve():
            continue
        try:
            verify(path)
        except CheckpointError:
            continue
        return path
    return None


def resolve_checkpoint_dir(target: Path) -> Path:
    """A checkpoint directory from a checkpoint, a run directory, or a folder of checkpoints.

    A run directory or folder resolves to its newest intact checkpoint.
    """
    target = Path(target)
    if (target / METADATA_FILE).is_file():
        return target
    for root in (target / "checkpoints", target):
        if root.is_dir() and find_checkpoints(root):
            newest = newest_intact(root)
            if newest is None:
                raise CheckpointError(f"no intact checkpoint under {root}: every one fails verification")
            return newest
    if not target.exists():
        raise CheckpointError(f"{target} does not exist")
    raise CheckpointError(f"{target} holds no checkpoint (no {METADATA_FILE} in it or below it)")


def trial_spec(trial_class: type) -> str:
    """``module:QualifiedName`` of a trial class, as recorded in checkpoint metadata."""
    return f"{trial_class.__module__}:{trial_class.__qualname__}"


def rank_rng_state() -> Dict[str, Any]:
    """This process's RNG states as tensors and plain values (loadable with weights_only)."""
    import random

    import numpy as np

    version, python_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state: Dict[str, Any] = {
        "python": [version, list(python_state), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype("int64")), int(position), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`rank_rng_state` captured."""
    import random

    import numpy as np

    version, python_state, gauss = state["python"]
    random.setstate((version, tuple(python_state), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
