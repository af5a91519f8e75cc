"""One owner per run directory: an exclusive lock held for the run's life, and the sweep of
checkpoint writes that a killed owner left behind.

The lock is ``fcntl.flock`` on ``<run dir>/.hookdet.lock``: the kernel releases it when its
holder exits by any means (SIGKILL included), so a lock is never stale. The holder writes its
pid and host into the file, so a second run or resume of the same directory is refused with a
message naming who holds it. Only the chief (rank 0) locks; the other ranks run inside the same
launch.

Under the lock, no other process can be writing checkpoints into the run's own storage, so every
hidden ``.tmp-*`` directory there is the leftover of a killed write (or delete) and is removed.
Storage outside the run directory (a ``shared_fs`` store used by several runs) is not swept: a
leftover there may be another live run's write in progress.
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any, Optional

from hookdet.errors import HookdetError
from hookdet.storage_backends import TEMP_DIR_PREFIX, LocalStorage

logger = logging.getLogger("hookdet")

LOCK_FILE = ".hookdet.lock"


class RunDirLockedError(HookdetError, RuntimeError):
    """Another live process owns the run directory."""


class RunDirLock:
    """The exclusive lock on one run directory (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._descriptor: Optional[int] = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`RunDirLockedError` naming the holder's pid and host."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 256, 0).decode(errors="replace").strip() or "unknown"
            os.close(descriptor)
            raise RunDirLockedError(
                f"run directory {self.run_dir} is in use by another hookdet run ({holder}); "
                "wait for it to end, or give another --run-dir"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        self._descriptor = descriptor

    def release(self) -> None:
        """Give the lock up (the kernel also does when the process ends)."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


def sweep_stale_writes(run: Any) -> int:
    """Remove the ``.tmp-*`` leftovers of killed checkpoint writes in the run's own storage.

    Call only while holding the run directory's lock. Returns how many were removed.
    """
    storage = run.storage
    if not isinstance(storage, LocalStorage) or not storage.root.is_dir():
        return 0
    run_dir = Path(run.run_dir).absolute()
    if storage.root != run_dir and run_dir not in storage.root.parents:
        return 0  # a store shared with other runs: a leftover may be a live write
    removed = 0
    for entry in storage.root.iterdir():
        if not entry.name.startswith(TEMP_DIR_PREFIX):
            continue
        # Every name here is hidden from readers, so a kill mid-removal leaves nothing visible.
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:  # a storage probe file of a killed start-up
            entry.unlink(missing_ok=True)
        removed += 1
    if removed:
        logger.info("removed %d unfinished checkpoint write(s) left by a killed run", removed)
    return removed
