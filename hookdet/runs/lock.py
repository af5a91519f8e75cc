"""One owner per run directory: an exclusive lock held for the run's life, and the sweep of
checkpoint writes that a killed owner left behind.

The lock is ``fcntl.flock`` on a descriptor of the run directory itself, held open for the run's
life: the kernel releases it when its holder exits by any means (SIGKILL included), so a lock is
never stale, and no file can be deleted to let a second writer in (a lock on a file's descriptor
would follow the deleted file, and a new file of the same name would be free). Only removing the
whole directory frees the name, and then nothing of the old run is left to mix with. The holder
writes its pid and host into ``.hookdet.lock``, for the message that refuses a second run or
resume of the same directory; that file only informs. Only the chief (rank 0) locks; the other
ranks run inside the same launch.

Under the lock, no other process can be writing checkpoints into the run's own storage, so the
storage removes what killed writes left there (:meth:`CheckpointStorage.sweep_incomplete`). A
storage shared with other runs (an object store's bucket, a symlinked folder) cannot tell this
run's leftovers from another run's writes in progress, so every write is also noted in the run
directory while it lasts (:func:`noting_the_write`): a note a killed write left names a
checkpoint of this run alone, and :meth:`CheckpointStorage.discard_unfinished` removes what it
left, wherever the storage is.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from pathlib import Path
from typing import Any, Iterator, Optional

from hookdet.errors import HookdetError
from hookdet.runs.files import LOCK_FILE, WRITES_IN_PROGRESS_DIR

logger = logging.getLogger("hookdet")


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
        descriptor = os.open(self.run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise RunDirLockedError(
                f"run directory {self.run_dir} is in use by another hookdet run ({self.holder()}); "
                "wait for it to end, or give another --run-dir"
            ) from None
        self._descriptor = descriptor
        partial = self.path.with_name(f"{LOCK_FILE}.partial")
        partial.write_text(f"pid {os.getpid()} on host {socket.gethostname()}\n", encoding="utf-8")
        os.replace(partial, self.path)

    def held_elsewhere(self) -> Optional[str]:
        """Who holds the lock when another process does (:meth:`holder`), else None; takes
        nothing and writes nothing."""
        try:
            descriptor = os.open(self.run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return None  # no directory yet: nobody holds it
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return self.holder()
        finally:
            os.close(descriptor)  # the lock, if taken, goes with it
        return None

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it (``unknown`` when the note is gone)."""
        try:
            return self.path.read_text(encoding="utf-8", errors="replace").strip()[:256] or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        """Give the lock up (the kernel also does when the process ends)."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


@contextlib.contextmanager
def noting_the_write(run_dir: Any, storage_id: str) -> Iterator[None]:
    """Note in the run directory that checkpoint ``storage_id`` is being written, for the life
    of the block: a process killed inside it leaves the note for :func:`sweep_stale_writes`."""
    note = Path(run_dir) / WRITES_IN_PROGRESS_DIR / storage_id
    note.parent.mkdir(exist_ok=True)
    note.touch()
    try:
        yield
    finally:
        note.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: another write's note
            note.parent.rmdir()


def sweep_stale_writes(run: Any) -> int:
    """Remove the leftovers of killed checkpoint writes: those in the run's own storage (through
    the storage, which leaves a store shared with other runs alone), and those of every write
    the run directory notes as unfinished, wherever its storage is. Call only while holding the
    run directory's lock. Returns how many were removed."""
    removed = run.storage.sweep_incomplete(Path(run.run_dir).absolute())
    notes = Path(run.run_dir) / WRITES_IN_PROGRESS_DIR
    for note in sorted(notes.iterdir()) if notes.is_dir() else []:
        if run.storage.discard_unfinished(note.name):
            removed += 1
        note.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        notes.rmdir()
    if removed:
        logger.info("removed %d unfinished checkpoint write(s) left by a killed run", removed)
    return removed
