"""Checkpoints in an object store (S3, Google Cloud Storage, Azure Blob Storage): what they share.

An object store cannot rename a prefix, so a checkpoint's files are uploaded first and its
``metadata.json`` last: a checkpoint is complete exactly when its ``metadata.json`` exists.
Objects live under ``<prefix>/<storage id>/<relative path>``. :class:`ObjectStorage` does the
checkpoint logic once — staging, upload order, leftovers of a dead upload, download, delete,
listing, metadata alone — over five primitives each vendor's class implements with its own
library (boto3, google-cloud-storage, azure-storage-blob):
:meth:`~ObjectStorage.list_keys`, :meth:`~ObjectStorage.upload_file`,
:meth:`~ObjectStorage.download_file`, :meth:`~ObjectStorage.get_bytes` and
:meth:`~ObjectStorage.delete_keys`. Each raises :class:`StorageError` naming what it did
where; :meth:`~ObjectStorage.get_bytes` answers None for a missing object.

A published checkpoint never changes, so the ``metadata.json`` read while listing or choosing a
checkpoint is kept and written into the download: a resume fetches each object once. A resume
from a run directory fetches its newest checkpoint ahead (:meth:`~ObjectStorage.fetch`) to verify
it before choosing it, and that download is the one restored; ``hookdet run`` of a script hands
its download to the script (:meth:`~ObjectStorage.hand_over`, ``$HOOKDET_FETCHED_CHECKPOINTS``),
whose restore takes it instead of fetching the checkpoint again (and leaves it for the starter to
remove: every rank of the script may read it). Downloads go to folders named
``hookdet-restore-<pid>-...`` in the temporary directory, removed when restored, at exit, or, for
a process that was killed, by the next download of any process (:func:`sweep_dead_downloads`).
"""
from __future__ import annotations

import abc
import atexit
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Dict, List, Optional

from hookdet.checkpoints.storage import (
    METADATA_FILE,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CheckpointStorage,
    IncompleteCheckpointError,
    StorageError,
    check_storage_id,
    METADATA_MAX_BYTES,
    parse_metadata,
)


#: The name of every download folder starts so, followed by the downloading process's pid and "-".
DOWNLOAD_PREFIX = "hookdet-restore-"
#: Checkpoints a starter fetched for the process it started: JSON, each checkpoint's location
#: (``s3://bucket/prefix/<id>``) to the folder it was downloaded to.
FETCHED_ENV = "HOOKDET_FETCHED_CHECKPOINTS"


def sweep_dead_downloads() -> int:
    """Remove the download folders of processes that are gone (killed during a download or a
    restore); return how many. A folder is taken only when its name says it is one of these
    and it is a plain directory, not a symlink to elsewhere."""
    removed = 0
    for entry in Path(tempfile.gettempdir()).glob(f"{DOWNLOAD_PREFIX}*-*"):
        pid = entry.name[len(DOWNLOAD_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or entry.is_symlink() or not entry.is_dir() or _alive(int(pid)):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def normalize_prefix(prefix: Optional[str]) -> str:
    """``prefix`` without leading, trailing or doubled slashes; ValueError on ``.``/``..``."""
    if prefix is None:
        return ""
    if not isinstance(prefix, str):
        raise ValueError(f"a storage prefix must be a str, not {type(prefix).__name__}")
    parts = [part for part in prefix.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise ValueError(f"storage prefix {prefix!r} must not contain '.' or '..' components")
    return "/".join(parts)


class ObjectStorage(CheckpointStorage):
    """A :class:`CheckpointStorage` over an object store's five primitives (module docstring).

    Subclasses set :attr:`prefix` (normalized) and implement the primitives, :meth:`describe`
    and :meth:`url`.
    """

    prefix: str = ""
    #: Who the store is, for messages: ``S3 storage s3://bucket/prefix: listing ... failed``.
    vendor: str = "object"

    # ------------------------------------------------------------------ the vendor's primitives

    @abc.abstractmethod
    def list_keys(self, key_prefix: str) -> List[str]:
        """Every object key starting with ``key_prefix``."""

    @abc.abstractmethod
    def upload_file(self, local_file: Path, key: str) -> None:
        """Store ``local_file`` as object ``key``."""

    @abc.abstractmethod
    def download_file(self, key: str, local_file: Path) -> None:
        """Write object ``key`` to ``local_file``."""

    @abc.abstractmethod
    def get_bytes(self, key: str, limit: int) -> Optional[bytes]:
        """Object ``key``'s first ``limit`` bytes (all of it when smaller), or None when there
        is no such object; never more, whatever the object's size."""

    @abc.abstractmethod
    def delete_keys(self, keys: List[str]) -> None:
        """Delete the objects ``keys`` (all, or raise)."""

    @abc.abstractmethod
    def url(self, key: str) -> str:
        """``s3://bucket/key``, ``gs://...``: where object ``key`` is, for messages."""

    @property
    def _fetched(self) -> Dict[str, Path]:
        """Downloads :meth:`fetch` made ahead, by storage id, not yet restored."""
        return self.__dict__.setdefault("_fetched_by_id", {})

    @property
    def _metadata_seen(self) -> Dict[str, bytes]:
        """``metadata.json`` content by storage id, as read from the store by this object."""
        return self.__dict__.setdefault("_metadata_seen_by_id", {})

    def vendor_errors(self) -> tuple:
        """The exceptions the vendor's library raises for a failed request."""
        return (Exception,)

    @contextlib.contextmanager
    def failing_as(self, action: str) -> Iterator[None]:
        """Turn the vendor library's errors (no bucket, bad credentials, no connection) into
        one :class:`StorageError` that says what was being done where."""
        try:
            yield
        except StorageError:
            raise
        except self.vendor_errors() as error:
            raise StorageError(f"{self.vendor} storage {self.describe()}: {action} failed: {error}") from error

    # ------------------------------------------------------------------ checkpoints

    def location(self, storage_id: str) -> str:
        return self.url(self.checkpoint_key_prefix(storage_id))

    def checkpoint_key_prefix(self, storage_id: str) -> str:
        """The key prefix, ending in '/', under which one checkpoint's objects live."""
        check_storage_id(storage_id)
        return f"{self.prefix}/{storage_id}/" if self.prefix else f"{storage_id}/"

    @contextlib.contextmanager
    def store_path(self, storage_id: str) -> Iterator[Path]:
        key_prefix = self.checkpoint_key_prefix(storage_id)
        if key_prefix + METADATA_FILE in self.list_keys(key_prefix):
            raise CheckpointExistsError(storage_id, self.describe())
        staging_dir = Path(tempfile.mkdtemp(prefix=f"hookdet-store-{storage_id}-"))
        try:
            yield staging_dir
            if not (staging_dir / METADATA_FILE).is_file():
                raise IncompleteCheckpointError(
                    f"checkpoint {storage_id!r} for {self.describe()} was written without "
                    f"{METADATA_FILE}; nothing was uploaded because it could not be restored"
                )
            self._upload(staging_dir, storage_id, key_prefix)
        finally:
            shutil.rmtree(staging_dir, ignore_errors=True)

    def _upload(self, staging_dir: Path, storage_id: str, key_prefix: str) -> None:
        """Upload the staged files, ``metadata.json`` last; on failure remove what was sent."""
        existing_keys = self.list_keys(key_prefix)
        if key_prefix + METADATA_FILE in existing_keys:
            raise CheckpointExistsError(storage_id, self.describe())
        if existing_keys:
            # Leftovers of an upload that died before its metadata.json: never a checkpoint,
            # and mixing them into this one would add files it never had.
            self.delete_keys(existing_keys)
        relative_files = sorted(
            path.relative_to(staging_dir).as_posix() for path in staging_dir.rglob("*") if path.is_file()
        )
        relative_files.remove(METADATA_FILE)
        relative_files.append(METADATA_FILE)
        uploaded_keys: List[str] = []
        try:
            for relative_file in relative_files:
                self.upload_file(staging_dir / relative_file, key_prefix + relative_file)
                uploaded_keys.append(key_prefix + relative_file)
        except BaseException:
            with contextlib.suppress(Exception):
                self.delete_keys(uploaded_keys)
            raise

    @contextlib.contextmanager
    def restore_path(self, storage_id: str) -> Iterator[Path]:
        handed = None if storage_id in self._fetched else self._handed(storage_id)
        directory = self._fetched.pop(storage_id, None) or handed or self._download(storage_id)
        try:
            yield directory
        finally:
            if directory is not handed:  # the starter's download: every rank may read it; the starter removes it
                shutil.rmtree(directory, ignore_errors=True)

    def fetch(self, storage_id: str) -> Path:
        """Download checkpoint ``storage_id`` now, for :meth:`restore_path` to hand out later
        (so it can be verified before it is chosen); the folder is removed when restored, by
        :meth:`drop_fetched`, or at exit."""
        if storage_id not in self._fetched:
            directory = self._fetched[storage_id] = self._download(storage_id)
            atexit.register(shutil.rmtree, directory, True)
        return self._fetched[storage_id]

    def hand_over(self, storage_id: str) -> Dict[str, str]:
        """What a process this one starts is given (as ``$HOOKDET_FETCHED_CHECKPOINTS``) so that
        its restore of ``storage_id`` takes this process's download; empty when none was made."""
        directory = self._fetched.get(storage_id)
        return {FETCHED_ENV: json.dumps({self.location(storage_id): str(directory)})} if directory else {}

    def _handed(self, storage_id: str) -> Optional[Path]:
        """The download of ``storage_id`` this process's starter handed over, if it is still
        there and is one of hookdet's download folders."""
        try:
            handed = json.loads(os.environ.get(FETCHED_ENV, "{}")).get(self.location(storage_id))
        except (ValueError, AttributeError):
            return None
        if not handed:
            return None
        directory = Path(handed)
        if directory.is_symlink() or not directory.is_dir() or not directory.name.startswith(DOWNLOAD_PREFIX):
            return None
        return directory

    def drop_fetched(self, storage_id: str) -> None:
        """Remove what :meth:`fetch` downloaded of ``storage_id`` (a checkpoint passed over)."""
        directory = self._fetched.pop(storage_id, None)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def _download(self, storage_id: str) -> Path:
        """Every object of the checkpoint into a new folder of this process's; the folder."""
        key_prefix = self.checkpoint_key_prefix(storage_id)
        keys = self.list_keys(key_prefix)
        if key_prefix + METADATA_FILE not in keys:
            detail = f"objects under {key_prefix!r} lack {METADATA_FILE}, so the upload never finished" if keys else ""
            raise CheckpointNotFoundError(storage_id, self.describe(), detail)
        sweep_dead_downloads()
        download_dir = Path(tempfile.mkdtemp(prefix=f"{DOWNLOAD_PREFIX}{os.getpid()}-{storage_id}-"))
        try:
            for key in keys:
                if key.endswith("/"):
                    continue  # a folder marker some tools create; it holds no data
                relative_file = PurePosixPath(key[len(key_prefix):])
                if relative_file.is_absolute() or ".." in relative_file.parts:
                    raise StorageError(
                        f"{self.describe()}: checkpoint {storage_id!r} holds object {key!r}, "
                        "whose name would escape the checkpoint directory"
                    )
                local_file = download_dir.joinpath(*relative_file.parts)
                local_file.parent.mkdir(parents=True, exist_ok=True)
                seen = self._metadata_seen.get(storage_id) if key == key_prefix + METADATA_FILE else None
                if seen is not None:
                    local_file.write_bytes(seen)
                else:
                    self.download_file(key, local_file)
        except BaseException:
            shutil.rmtree(download_dir, ignore_errors=True)
            raise
        return download_dir

    def discard_unfinished(self, storage_id: str) -> bool:
        """Delete the objects of an upload of ``storage_id`` that never reached its
        ``metadata.json``; a complete checkpoint is kept."""
        key_prefix = self.checkpoint_key_prefix(storage_id)
        keys = self.list_keys(key_prefix)
        if not keys or key_prefix + METADATA_FILE in keys:
            return False
        self.delete_keys(keys)
        return True

    def delete(self, storage_id: str) -> None:
        key_prefix = self.checkpoint_key_prefix(storage_id)
        self._metadata_seen.pop(storage_id, None)
        keys = self.list_keys(key_prefix)
        if not keys:
            raise CheckpointNotFoundError(storage_id, self.describe())
        metadata_key = key_prefix + METADATA_FILE
        if metadata_key in keys:  # first: a half-deleted checkpoint never looks complete
            self.delete_keys([metadata_key])
            keys.remove(metadata_key)
        if keys:
            self.delete_keys(keys)

    def list_ids(self) -> List[str]:
        root = f"{self.prefix}/" if self.prefix else ""
        storage_ids = set()
        for key in self.list_keys(root):
            storage_id, _, rest = key[len(root):].partition("/")
            if rest == METADATA_FILE and storage_id and not storage_id.startswith("."):
                storage_ids.add(storage_id)
        return sorted(storage_ids)

    def read_metadata(self, storage_id: str) -> Dict[str, Any]:
        """One request for ``metadata.json``; the state stays in the store."""
        key = self.checkpoint_key_prefix(storage_id) + METADATA_FILE
        content = self._metadata_seen.get(storage_id)
        if content is None:
            content = self.get_bytes(key, METADATA_MAX_BYTES + 1)  # one more: over the bound is told
        if content is None:
            raise CheckpointNotFoundError(storage_id, self.describe())
        metadata = parse_metadata(content, self.url(key))
        self._metadata_seen[storage_id] = content
        return metadata
