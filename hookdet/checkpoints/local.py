"""Checkpoints in a local (or shared) filesystem directory: ``shared_fs``, ``directory`` and
the default ``<run dir>/checkpoints``.

Each checkpoint is written into a hidden temporary directory beside its final one, every file and
directory flushed to disk, then renamed into place: the rename is atomic, so a crash mid-write
never leaves something that looks complete. Readers get the stored directory itself, no copy.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Dict, Optional

from hookdet.checkpoints.os_errors import describe_os_error
from hookdet.checkpoints.storage import (
    CHECKPOINTS_DIR,
    METADATA_FILE,
    TEMP_DIR_PREFIX,
    CheckpointExistsError,
    CheckpointNotFoundError,
    is_inside,
    CheckpointStorage,
    IncompleteCheckpointError,
    check_storage_id,
)

__all__ = ["LocalStorage"]


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
        return (checkpoint_dir / METADATA_FILE).is_file()

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
                    f"{METADATA_FILE}; it was discarded because it could not be restored"
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
                f"{checkpoint_dir} has no {METADATA_FILE}, so it was never completely written",
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

    # ------------------------------------------------------------------ the protocol's questions

    type_name = "shared_fs"

    @classmethod
    def from_config(cls, config: Any, run_dir: Path) -> "LocalStorage":
        """``shared_fs`` under ``host_path`` (joined with ``storage_path``), ``directory`` in
        ``container_path``, and the default (retention counts only): ``<run_dir>/checkpoints``."""
        if config is None or config.type == "default":
            return cls(Path(run_dir) / CHECKPOINTS_DIR)
        if config.type == "directory":
            return cls(config.container_path)
        return cls(config.root())

    def locator(self) -> Dict[str, Any]:
        return {"type": self.type_name, "root": str(self.root)}

    def local_dir(self, storage_id: str) -> Optional[Path]:
        return self.root / check_storage_id(storage_id)

    def check(self) -> Optional[str]:
        """The root can be created, and a small file written, flushed and removed there
        (permission, read-only filesystem, disk full)."""
        probe = self.root / f"{TEMP_DIR_PREFIX}probe-{secrets.token_hex(4)}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(probe, "wb") as handle:
                handle.write(b"\0" * 4096)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as error:
            return f"checkpoint storage {self.describe()} is not writable: {describe_os_error(error)}"
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
        return None

    def sweep_incomplete(self, owner_dir: Path) -> int:
        """Remove ``.tmp-*`` leftovers when the root lies inside ``owner_dir``, both resolved; a
        root outside it may be shared with other live runs, whose writes in progress look the
        same. A root reached through a symlink that leads out of ``owner_dir`` (checkpoints moved
        to a bigger disk) is such a root: only the resolved path says where the entries are."""
        if not self.root.is_dir() or not is_inside(self.root, owner_dir):
            return 0
        removed = 0
        for entry in self.root.iterdir():
            if not entry.name.startswith(TEMP_DIR_PREFIX):
                continue
            # Every name here is hidden from readers, so a kill mid-removal leaves nothing visible.
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:  # a probe file of a killed start-up
                entry.unlink(missing_ok=True)
            removed += 1
        return removed

    def failure_cause(self, error: BaseException) -> Optional[str]:
        """torch reports a disk that refused more bytes as ``unexpected pos``."""
        if "unexpected pos" not in str(error):
            return None
        try:
            stats = os.statvfs(self.root)
            free = f"{stats.f_bavail * stats.f_frsize / 2**20:.1f} MiB"
        except OSError:
            free = "unknown space"
        return f"the write stopped short: no space left on the device (disk full?), {free} free"
