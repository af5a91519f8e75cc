"""The checkpoint storage protocol: what the host may ask of any place checkpoints live.

A storage keeps checkpoints, directories of files, under *storage ids* (Determined uses the
checkpoint's UUID) and shows each one to readers only once it is complete: a checkpoint without
``metadata.json`` does not exist. Every question the host asks about checkpoints goes through
:class:`CheckpointStorage`, so no code outside a storage class asks which class it is:

- store, restore, delete, list: :meth:`~CheckpointStorage.store_path`,
  :meth:`~CheckpointStorage.restore_path`, :meth:`~CheckpointStorage.delete`,
  :meth:`~CheckpointStorage.list_ids`;
- metadata without the state: :meth:`~CheckpointStorage.read_metadata`,
  :meth:`~CheckpointStorage.list` (ids with their metadata, unreadable ones skipped and named);
- where it is: :meth:`~CheckpointStorage.locator` (plain values, never credentials), from which
  :func:`hookdet.checkpoints.registry.storage_from_locator` rebuilds the storage in another
  process; :meth:`~CheckpointStorage.local_dir` (the published directory, when it is local);
- before and after: :meth:`~CheckpointStorage.check` (before the first batch),
  :meth:`~CheckpointStorage.sweep_incomplete` (leftovers of killed writes),
  :meth:`~CheckpointStorage.failure_cause` (a failed write, in words).

Types are found by ``checkpoint_storage.type`` in the entry-point group
``hookdet.checkpoint_storage`` (:mod:`hookdet.checkpoints.registry`): a package adds a type by
declaring one entry point, as hookdet declares its own.
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from hookdet.errors import HookdetError

logger = logging.getLogger("hookdet")

__all__ = [
    "METADATA_FILE",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "CheckpointStorage",
    "IncompleteCheckpointError",
    "MalformedMetadataError",
    "StorageError",
    "parse_metadata",
    "is_inside",
    "read_small_file",
]

#: The state file, Determined's name for it (hookdet's checkpoints and Determined's alike).
STATE_FILE = "state_dict.pth"
#: The default storage's folder in a run directory.
CHECKPOINTS_DIR = "checkpoints"
#: The file in a run directory that records the run's id and where its checkpoints are
#: (written by hookdet.runs.identity, read by hookdet.checkpoints.resolver).
IDENTITY_FILE = "run_identity.json"
METADATA_FILE = "metadata.json"
"""The file whose presence marks a checkpoint as complete; writers must create it."""

TEMP_DIR_PREFIX = ".tmp-"
"""Local in-progress checkpoints are named ``.tmp-<storage id>-<random>``; readers skip them."""

#: The most a ``metadata.json`` may weigh, and how deeply its values may nest: a larger or deeper
#: file is not a checkpoint's (hookdet's nest about 8 levels), and reading it must not exhaust
#: memory or the interpreter's stack.
METADATA_MAX_BYTES = 64 * 2**20
METADATA_MAX_DEPTH = 64


class StorageError(HookdetError, RuntimeError):
    """A checkpoint storage operation failed; the message names the storage and checkpoint."""


class CheckpointNotFoundError(StorageError):
    """No complete checkpoint with the requested id exists in the storage."""

    def __init__(self, storage_id: str, storage: str, detail: str = "") -> None:
        self.storage_id = storage_id
        self.storage = storage
        message = f"checkpoint {storage_id!r} not found in {storage}"
        super().__init__(f"{message}: {detail}" if detail else message)


class CheckpointExistsError(StorageError):
    """A complete checkpoint already holds the id being stored; checkpoints are never
    overwritten, because a reader may be restoring it at that very moment."""

    def __init__(self, storage_id: str, storage: str) -> None:
        self.storage_id = storage_id
        self.storage = storage
        super().__init__(
            f"checkpoint {storage_id!r} already exists in {storage}; "
            "checkpoints are immutable, store under a new id"
        )


class MalformedMetadataError(StorageError):
    """A ``metadata.json`` that cannot be a checkpoint's: unreadable, not JSON, too deep or too
    large, or not a mapping. The message names the file and what is wrong with it."""


class IncompleteCheckpointError(StorageError):
    """The writer left ``store_path`` without creating ``metadata.json``, so the checkpoint
    could never be restored; nothing was published."""


def is_inside(path: Path, directory: Path) -> bool:
    """Whether ``path``, resolved (every symlink followed), is ``directory`` or lies inside it,
    resolved too."""
    resolved, owner = Path(path).resolve(), Path(directory).resolve()
    return resolved == owner or owner in resolved.parents


def check_storage_id(storage_id: object) -> str:
    """Return ``storage_id`` if it can name one checkpoint directory, else raise ValueError.

    An id is one path component: it must not climb out of the storage root, name a nested
    path, or start with ``.`` (reserved for in-progress temporary directories).
    """
    problem = None
    if not isinstance(storage_id, str):
        problem = f"must be a str, not {type(storage_id).__name__}"
    elif not storage_id:
        problem = "must not be empty"
    elif "/" in storage_id or "\\" in storage_id or "\0" in storage_id:
        problem = "must be a single name, without '/', '\\' or NUL"
    elif storage_id.startswith("."):
        problem = "must not start with '.' (reserved for temporary directories)"
    if problem is not None:
        raise ValueError(f"invalid checkpoint storage id {storage_id!r}: {problem}")
    return storage_id


def read_small_file(path: Path, limit: int = METADATA_MAX_BYTES) -> bytes:
    """The bytes of ``path``, a checkpoint's small file (its metadata, a Determined checkpoint's
    ``load_data.json`` or ``trial_state.pkl``), refused with :class:`MalformedMetadataError`
    when it is over ``limit`` bytes, before it is read: a file of gigabytes in a checkpoint is
    then one line, and the next checkpoint is tried, instead of a ``MemoryError``."""
    size = Path(path).stat().st_size
    if size > limit:
        raise MalformedMetadataError(f"{path}: {size} bytes, more than a checkpoint's {Path(path).name} can be "
                                     f"(at most {limit})")
    with open(path, "rb") as handle:
        return handle.read(limit + 1)  # a file still growing is bounded too, and parse_metadata tells it


def parse_metadata(raw: bytes, where: str) -> Dict[str, Any]:
    """``metadata.json``'s bytes as a dict, or :class:`MalformedMetadataError` naming ``where``.

    The size and nesting are bounded before the parser runs, so a hostile file (a gigabyte, or
    brackets nested 200,000 deep) costs a short refusal instead of a ``MemoryError`` or a
    ``RecursionError``.
    """
    if len(raw) > METADATA_MAX_BYTES:
        raise MalformedMetadataError(f"{where}: {len(raw)} bytes, more than a checkpoint's metadata can be")
    depth = _json_depth(raw)
    if depth > METADATA_MAX_DEPTH:
        raise MalformedMetadataError(f"{where}: nested {depth} levels deep (at most {METADATA_MAX_DEPTH})")
    try:
        metadata = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise MalformedMetadataError(f"{where}: not JSON: {error}") from None
    if not isinstance(metadata, dict):
        raise MalformedMetadataError(f"{where}: holds a JSON {type(metadata).__name__}, not a mapping")
    return metadata


def _json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, brackets inside strings not counted."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


class CheckpointStorage(abc.ABC):
    """Stores checkpoint directories under string ids, publishing each one atomically.

    Modeled on Determined's ``StorageManager``. A checkpoint is complete, and visible to
    :meth:`list_ids` and :meth:`restore_path`, once its top-level ``metadata.json`` exists.
    """

    @abc.abstractmethod
    def store_path(self, storage_id: str) -> contextlib.AbstractContextManager[Path]:
        """Yield an empty local directory to write the checkpoint's files into.

        On a clean exit the checkpoint becomes visible under ``storage_id`` all at once; it
        must contain ``metadata.json`` (else :class:`IncompleteCheckpointError`). If the block
        raises, nothing becomes visible and the temporary data is removed. Storing over an
        existing complete checkpoint raises :class:`CheckpointExistsError`.
        """

    @abc.abstractmethod
    def restore_path(self, storage_id: str) -> contextlib.AbstractContextManager[Path]:
        """Yield a local directory holding the checkpoint's files; treat it as read-only.

        Raises :class:`CheckpointNotFoundError` if no complete checkpoint has this id.
        """

    @abc.abstractmethod
    def delete(self, storage_id: str) -> None:
        """Remove the checkpoint, complete or not; ``metadata.json`` disappears first so a
        half-deleted checkpoint never looks complete. Raises :class:`CheckpointNotFoundError`
        if nothing is stored under the id."""

    @abc.abstractmethod
    def list_ids(self) -> list[str]:
        """Return the ids of all complete checkpoints, sorted."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Name this storage for messages, e.g. ``local directory /x/y`` or ``s3://b/p``."""

    @abc.abstractmethod
    def location(self, storage_id: str) -> str:
        """Where the checkpoint with this id lives, as a path or URL a user can look up."""

    # ------------------------------------------------------------------ answered by default

    #: The ``checkpoint_storage.type`` (entry-point name) this class serves; :meth:`locator`
    #: records it so :func:`~hookdet.checkpoints.registry.storage_from_locator` finds the class.
    type_name: ClassVar[str] = ""

    def read_metadata(self, storage_id: str) -> Dict[str, Any]:
        """The checkpoint's ``metadata.json``, without fetching its state where the storage can
        (the default restores the whole checkpoint; remote storages override it).

        :class:`CheckpointNotFoundError` when no complete checkpoint has the id,
        :class:`MalformedMetadataError` when its metadata cannot be a checkpoint's.
        """
        with self.restore_path(storage_id) as directory:
            path = Path(directory) / METADATA_FILE
            return parse_metadata(read_small_file(path), str(path))

    def list(self) -> List[Tuple[str, Dict[str, Any]]]:
        """``(storage id, metadata)`` of every complete checkpoint whose metadata reads, by id.

        One that does not read is skipped with a warning naming it and why: one bad checkpoint
        never hides the others.
        """
        found = []
        for storage_id in self.list_ids():
            try:
                found.append((storage_id, self.read_metadata(storage_id)))
            except (StorageError, OSError) as error:
                logger.warning("skipping checkpoint %s: %s", self.location(storage_id), error)
        return found

    def locator(self) -> Dict[str, Any]:
        """Where this storage is, as JSON-ready values (its type and fields, never credentials),
        recorded in a run directory so a later process finds the run's checkpoints again. The
        default is the type alone; a storage with fields overrides it, and its class's
        :meth:`from_locator` rebuilds it."""
        return {"type": self.type_name}

    @classmethod
    def from_config(cls, config: Any, run_dir: Path) -> "CheckpointStorage":
        """The storage a validated ``checkpoint_storage`` block asks for (``run_dir`` is the
        run's directory). The default passes the block's own fields (not ``type`` nor the
        retention counts) to ``cls`` as keyword arguments."""
        fields = {key: value for key, value in config.fields().items()}
        return cls(**fields)

    @classmethod
    def from_locator(cls, locator: Dict[str, Any]) -> "CheckpointStorage":
        """The storage a :meth:`locator` describes; the default passes its fields to ``cls``."""
        return cls(**{key: value for key, value in locator.items() if key != "type"})

    def same_place(self, locator: Dict[str, Any]) -> bool:
        """Whether ``locator`` describes this storage (then its credentials are used)."""
        return self.locator() == locator

    def local_dir(self, storage_id: str) -> Optional[Path]:
        """The local directory the checkpoint is (or will be) published in, readable in place;
        None for a storage that keeps it elsewhere (an object store)."""
        return None

    def check(self) -> Optional[str]:
        """Why this storage cannot take checkpoints, in one line; None when it can. Asked once,
        before the first batch, so a bad storage fails in seconds rather than at the first
        checkpoint after minutes of training. The default finds no problem."""
        return None

    def sweep_incomplete(self, owner_dir: Path) -> int:
        """Remove the leftovers of killed writes, where only the run owning ``owner_dir`` (whose
        lock the caller holds) can have made them; return how many. A storage shared with other
        live runs must leave what may be their writes in progress. The default removes nothing."""
        return 0

    def discard_unfinished(self, storage_id: str) -> bool:
        """Remove what a killed write of checkpoint ``storage_id`` left, if it never completed
        (a complete one is kept); whether anything was removed. Called for writes the run
        directory notes as unfinished, so the id is known to be this run's. The default removes
        nothing (a storage whose unfinished writes are hidden and swept by
        :meth:`sweep_incomplete`)."""
        return False

    def failure_cause(self, error: BaseException) -> Optional[str]:
        """Why a write failed, in words a user acts on, when ``error`` does not say; else None."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


