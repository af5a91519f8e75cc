"""Where checkpoints live: a local directory or an S3-compatible object store.

Each backend stores a checkpoint, a directory of files, under a *storage id* (Determined uses the
checkpoint's UUID) and shows it to readers only once it is complete, so a crash mid-write never
leaves something that looks like a checkpoint:

- :class:`LocalStorage` writes into a hidden temporary directory beside the final one, flushes
  every file and directory to disk, and renames it into place; the rename is atomic.
- :class:`S3Storage` cannot rename a prefix, so it uploads every file first and ``metadata.json``
  last; a checkpoint counts as complete exactly when its ``metadata.json`` exists.

Both follow the same rule on reading: a checkpoint without ``metadata.json`` does not exist.
:func:`make_storage` builds the backend the experiment file's (validated) ``checkpoint_storage``
block names; :class:`S3Storage` lives in :mod:`hookdet.s3_storage`. This module is plain code with
no hooks; the checkpoint plugin drives it.
"""

from __future__ import annotations

import abc
import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hookdet.errors import HookdetError

__all__ = [
    "METADATA_FILENAME",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "CheckpointStorage",
    "IncompleteCheckpointError",
    "LocalStorage",
    "StorageError",
    "make_storage",
]

METADATA_FILENAME = "metadata.json"
"""The file whose presence marks a checkpoint as complete; writers must create it."""

TEMP_DIR_PREFIX = ".tmp-"
"""Local in-progress checkpoints are named ``.tmp-<storage id>-<random>``; readers skip them."""


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


class IncompleteCheckpointError(StorageError):
    """The writer left ``store_path`` without creating ``metadata.json``, so the checkpoint
    could never be restored; nothing was published."""


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

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


# ---------------------------------------------------------------------------------------------
# Local directory
# ---------------------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    """Flush one file or directory to stable storage.

    Directories are flushed so the names created inside them survive a power cut; platforms
    that cannot open a directory (Windows) skip that step.
    """
    flags = os.O_RDONLY
    if path.is_dir():
        flags |= getattr(os, "O_DIRECTORY", 0)
    try:
        descriptor = os.open(path, flags)
    except (IsADirectoryError, PermissionError):
        if path.is_dir():
            return
        raise
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root``, children before their parents."""
    for directory, _subdirs, filenames in os.walk(root, topdown=False):
        for filename in filenames:
            file_path = Path(directory, filename)
            if file_path.is_file():
                _fsync_path(file_path)
        _fsync_path(Path(directory))


class LocalStorage(CheckpointStorage):
    """Checkpoints as subdirectories ``<root>/<storage id>`` of a local or shared filesystem.

    The root is created on the first store. Readers of :meth:`restore_path` get the stored
    directory itself, with no copy.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()

    def describe(self) -> str:
        return f"local directory {self.root}"

    def location(self, storage_id: str) -> str:
        return str(self.root / check_storage_id(storage_id))

    def _is_complete(self, checkpoint_dir: Path) -> bool:
        return (checkpoint_dir / METADATA_FILENAME).is_file()

    @contextlib.contextmanager
    def store_path(self, storage_id: str) -> Iterator[Path]:
        final_dir = self.root / check_storage_id(storage_id)
        if final_dir.exists():
            raise CheckpointExistsError(storage_id, self.describe())
        self.root.mkdir(parents=True, exist_ok=True)
        # os.mkdir rather than tempfile.mkdtemp: mkdtemp's private 0700 mode would carry over
        # to the published checkpoint and hide it from other users of a shared filesystem.
        temp_dir = self.root / f"{TEMP_DIR_PREFIX}{storage_id}-{secrets.token_hex(4)}"
        temp_dir.mkdir()
        try:
            yield temp_dir
            if not self._is_complete(temp_dir):
                raise IncompleteCheckpointError(
                    f"checkpoint {storage_id!r} for {self.describe()} was written without "
                    f"{METADATA_FILENAME}; it was discarded because it could not be restored"
                )
            _fsync_tree(temp_dir)
            if final_dir.exists():
                raise CheckpointExistsError(storage_id, self.describe())
            os.rename(temp_dir, final_dir)
        except BaseException:
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise
        _fsync_path(self.root)

    @contextlib.contextmanager
    def restore_path(self, storage_id: str) -> Iterator[Path]:
        checkpoint_dir = self.root / check_storage_id(storage_id)
        if not checkpoint_dir.is_dir():
            raise CheckpointNotFoundError(storage_id, self.describe())
        if not self._is_complete(checkpoint_dir):
            raise CheckpointNotFoundError(
                storage_id,
                self.describe(),
                f"{checkpoint_dir} has no {METADATA_FILENAME}, so it was never completely written",
            )
        yield checkpoint_dir

    def delete(self, storage_id: str) -> None:
        checkpoint_dir = self.root / check_storage_id(storage_id)
        if not checkpoint_dir.is_dir():
            raise CheckpointNotFoundError(storage_id, self.describe())
        # Renaming first hides the whole checkpoint in one step; deleting files in place could
        # leave metadata.json beside a half-removed state.
        doomed_dir = self.root / f"{TEMP_DIR_PREFIX}{storage_id}-deleting-{secrets.token_hex(4)}"
        os.rename(checkpoint_dir, doomed_dir)
        shutil.rmtree(doomed_dir)

    def list_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            entry.name
            for entry in self.root.iterdir()
            if not entry.name.startswith(".") and entry.is_dir() and self._is_complete(entry)
        )


def make_storage(config: Any, run_dir: str | os.PathLike[str]) -> CheckpointStorage:
    """The backend a validated ``checkpoint_storage`` block names (a model of
    :mod:`hookdet.config.sections`; the experiment file's loader has checked it, with file and
    line in its messages): ``None`` or retention counts alone mean ``<run_dir>/checkpoints``;
    ``shared_fs`` stores under ``host_path`` (joined with ``storage_path``), ``directory`` under
    ``container_path``, ``s3`` in a bucket. Retention counts are the checkpoint plugin's
    business."""
    storage_type = None if config is None else config.type
    if storage_type in (None, "default"):
        return LocalStorage(Path(run_dir) / "checkpoints")
    if storage_type == "shared_fs":
        return LocalStorage(config.root())
    if storage_type == "directory":
        return LocalStorage(config.container_path)
    from hookdet.s3_storage import S3Storage

    return S3Storage(
        bucket=config.bucket,
        prefix=config.prefix or "",
        endpoint_url=config.endpoint_url,
        access_key=config.access_key,
        secret_key=config.secret_key,
        region=config.region,
    )
