"""Where checkpoints live: a local directory or an S3-compatible object store.

Each backend stores a checkpoint, a directory of files, under a *storage id* (Determined uses the
checkpoint's UUID) and shows it to readers only once it is complete, so a crash mid-write never
leaves something that looks like a checkpoint:

- :class:`LocalStorage` writes into a hidden temporary directory beside the final one, flushes
  every file and directory to disk, and renames it into place; the rename is atomic.
- :class:`S3Storage` cannot rename a prefix, so it uploads every file first and ``metadata.json``
  last; a checkpoint counts as complete exactly when its ``metadata.json`` exists.

Both follow the same rule on reading: a checkpoint without ``metadata.json`` does not exist.
:func:`make_storage` turns the ``checkpoint_storage`` block of a Determined experiment file into
a backend. This module is plain code with no hooks; the checkpoint plugin drives it.
"""

from __future__ import annotations

import abc
import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = [
    "METADATA_FILENAME",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "CheckpointStorage",
    "IncompleteCheckpointError",
    "LocalStorage",
    "S3Storage",
    "StorageConfigError",
    "StorageError",
    "SUPPORTED_STORAGE_TYPES",
    "make_storage",
]

METADATA_FILENAME = "metadata.json"
"""The file whose presence marks a checkpoint as complete; writers must create it."""

TEMP_DIR_PREFIX = ".tmp-"
"""Local in-progress checkpoints are named ``.tmp-<storage id>-<random>``; readers skip them."""

SUPPORTED_STORAGE_TYPES = ("shared_fs", "directory", "s3")

RETENTION_KEYS = frozenset({"save_experiment_best", "save_trial_best", "save_trial_latest"})
"""Determined's retention policy keys; they belong to the checkpoint plugin, not to storage."""


class StorageError(RuntimeError):
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


class StorageConfigError(ValueError):
    """The ``checkpoint_storage`` block of the experiment file is malformed."""


def _check_storage_id(storage_id: object) -> str:
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
        return str(self.root / _check_storage_id(storage_id))

    def _is_complete(self, checkpoint_dir: Path) -> bool:
        return (checkpoint_dir / METADATA_FILENAME).is_file()

    @contextlib.contextmanager
    def store_path(self, storage_id: str) -> Iterator[Path]:
        final_dir = self.root / _check_storage_id(storage_id)
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
        checkpoint_dir = self.root / _check_storage_id(storage_id)
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
        checkpoint_dir = self.root / _check_storage_id(storage_id)
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


# ---------------------------------------------------------------------------------------------
# S3 and S3-compatible object stores
# ---------------------------------------------------------------------------------------------


def _normalize_s3_prefix(prefix: str) -> str:
    """Return ``prefix`` without leading, trailing or doubled slashes; reject ``.``/``..``."""
    if not isinstance(prefix, str):
        raise ValueError(f"S3 prefix must be a str, not {type(prefix).__name__}")
    parts = [part for part in prefix.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise ValueError(f"S3 prefix {prefix!r} must not contain '.' or '..' components")
    return "/".join(parts)


S3_TIMEOUTS = {
    "connect_timeout": float(os.environ.get("HOOKDET_S3_CONNECT_TIMEOUT", "5")),
    "read_timeout": float(os.environ.get("HOOKDET_S3_READ_TIMEOUT", "30")),
    "max_attempts": int(os.environ.get("HOOKDET_S3_MAX_ATTEMPTS", "3")),  # in all, first included
}
"""Seconds to connect, seconds to wait for an answer, and attempts per S3 request (botocore's
standard retry mode backs off between them); environment variables override each."""


def _import_boto3() -> Any:
    """Import boto3, or explain how to install it: S3 support is an optional extra."""
    try:
        import boto3
    except ImportError as err:
        raise ImportError(
            "S3 checkpoint storage needs boto3, which is not installed; "
            "install it with `pip install hookdet[s3]`"
        ) from err
    return boto3


class S3Storage(CheckpointStorage):
    """Checkpoints as objects ``<prefix>/<storage id>/<relative file path>`` in one bucket.

    Works with AWS S3 and S3-compatible servers (MinIO, Ceph, moto) through ``endpoint_url``.
    Credentials not given here come from boto3's usual chain (environment, config files,
    instance roles). Empty directories are not stored: object stores have none.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str | None = None,
    ) -> None:
        if not isinstance(bucket, str) or not bucket or "/" in bucket:
            raise ValueError(f"S3 bucket must be a bucket name without '/', got {bucket!r}")
        self._boto3 = _import_boto3()
        self.bucket = bucket
        self.prefix = _normalize_s3_prefix(prefix)
        self.endpoint_url = endpoint_url
        self._access_key = access_key
        self._secret_key = secret_key
        self.region = region
        self._client: Any = None

    def describe(self) -> str:
        url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        return f"{url} (endpoint {self.endpoint_url})" if self.endpoint_url else url

    def location(self, storage_id: str) -> str:
        return f"s3://{self.bucket}/{self._checkpoint_key_prefix(storage_id)}"

    @property
    def client(self) -> Any:
        """The boto3 S3 client, created on first use, with :data:`S3_TIMEOUTS`."""
        if self._client is None:
            self._client = self.new_client(**S3_TIMEOUTS)
        return self._client

    def new_client(self, connect_timeout: float, read_timeout: float, max_attempts: int) -> Any:
        """A boto3 client for this storage whose timeouts and retries (with backoff) are
        botocore's own: an endpoint that never answers fails the request instead of hanging."""
        from botocore.config import Config

        session = self._boto3.session.Session()
        return session.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self._access_key,
            aws_secret_access_key=self._secret_key,
            region_name=self.region,
            config=Config(
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                retries={"total_max_attempts": max_attempts, "mode": "standard"},
            ),
        )

    def _checkpoint_key_prefix(self, storage_id: str) -> str:
        """The key prefix, ending in '/', under which one checkpoint's objects live."""
        _check_storage_id(storage_id)
        return f"{self.prefix}/{storage_id}/" if self.prefix else f"{storage_id}/"

    @contextlib.contextmanager
    def _s3_errors(self, action: str) -> Iterator[None]:
        """Turn boto3's errors (no bucket, bad credentials, no connection) into one
        :class:`StorageError` that says what was being done where."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as err:
            raise StorageError(f"S3 storage {self.describe()}: {action} failed: {err}") from err

    def _list_keys(self, key_prefix: str) -> list[str]:
        """All object keys starting with ``key_prefix``, across result pages."""
        keys: list[str] = []
        with self._s3_errors(f"listing {key_prefix or 'the bucket'}"):
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=key_prefix):
                keys.extend(item["Key"] for item in page.get("Contents", ()))
        return keys

    def _delete_keys(self, keys: list[str], what: str) -> None:
        """Delete objects in batches of S3's 1000-key limit; any refusal raises."""
        batch_limit = 1000
        with self._s3_errors(f"deleting {what}"):
            for start in range(0, len(keys), batch_limit):
                batch = keys[start : start + batch_limit]
                response = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
                )
                refused = response.get("Errors", [])
                if refused:
                    first = refused[0]
                    raise StorageError(
                        f"S3 storage {self.describe()}: deleting {what} failed for "
                        f"{len(refused)} object(s), first {first.get('Key')!r}: "
                        f"{first.get('Code')} {first.get('Message')}"
                    )

    @contextlib.contextmanager
    def store_path(self, storage_id: str) -> Iterator[Path]:
        key_prefix = self._checkpoint_key_prefix(storage_id)
        metadata_key = key_prefix + METADATA_FILENAME
        if metadata_key in self._list_keys(key_prefix):
            raise CheckpointExistsError(storage_id, self.describe())
        staging_dir = Path(tempfile.mkdtemp(prefix=f"hookdet-store-{storage_id}-"))
        try:
            yield staging_dir
            if not (staging_dir / METADATA_FILENAME).is_file():
                raise IncompleteCheckpointError(
                    f"checkpoint {storage_id!r} for {self.describe()} was written without "
                    f"{METADATA_FILENAME}; nothing was uploaded because it could not be restored"
                )
            self._upload(staging_dir, storage_id, key_prefix)
        finally:
            shutil.rmtree(staging_dir, ignore_errors=True)

    def _upload(self, staging_dir: Path, storage_id: str, key_prefix: str) -> None:
        """Upload the staged files, ``metadata.json`` last; on failure remove what was sent."""
        existing_keys = self._list_keys(key_prefix)
        if key_prefix + METADATA_FILENAME in existing_keys:
            raise CheckpointExistsError(storage_id, self.describe())
        if existing_keys:
            # Leftovers of an upload that died before its metadata.json: never a checkpoint,
            # and mixing them into this one would add files it never had.
            self._delete_keys(existing_keys, f"leftovers of an unfinished upload of {storage_id!r}")

        relative_files = sorted(
            path.relative_to(staging_dir).as_posix()
            for path in staging_dir.rglob("*")
            if path.is_file()
        )
        relative_files.remove(METADATA_FILENAME)
        relative_files.append(METADATA_FILENAME)
        uploaded_keys: list[str] = []
        try:
            for relative_file in relative_files:
                key = key_prefix + relative_file
                with self._s3_errors(f"uploading {relative_file!r} of checkpoint {storage_id!r}"):
                    self.client.upload_file(str(staging_dir / relative_file), self.bucket, key)
                uploaded_keys.append(key)
        except BaseException:
            with contextlib.suppress(Exception):
                self._delete_keys(uploaded_keys, f"partial upload of {storage_id!r}")
            raise

    @contextlib.contextmanager
    def restore_path(self, storage_id: str) -> Iterator[Path]:
        key_prefix = self._checkpoint_key_prefix(storage_id)
        keys = self._list_keys(key_prefix)
        if key_prefix + METADATA_FILENAME not in keys:
            detail = (
                f"objects under {key_prefix!r} lack {METADATA_FILENAME}, "
                "so the upload never finished"
                if keys
                else ""
            )
            raise CheckpointNotFoundError(storage_id, self.describe(), detail)
        download_dir = Path(tempfile.mkdtemp(prefix=f"hookdet-restore-{storage_id}-"))
        try:
            for key in keys:
                if key.endswith("/"):
                    continue  # a folder marker some S3 tools create; it holds no data
                relative_file = PurePosixPath(key[len(key_prefix) :])
                if relative_file.is_absolute() or ".." in relative_file.parts:
                    raise StorageError(
                        f"S3 storage {self.describe()}: checkpoint {storage_id!r} holds object "
                        f"{key!r}, whose name would escape the checkpoint directory"
                    )
                local_file = download_dir.joinpath(*relative_file.parts)
                local_file.parent.mkdir(parents=True, exist_ok=True)
                with self._s3_errors(f"downloading {key!r}"):
                    self.client.download_file(self.bucket, key, str(local_file))
            yield download_dir
        finally:
            shutil.rmtree(download_dir, ignore_errors=True)

    def delete(self, storage_id: str) -> None:
        key_prefix = self._checkpoint_key_prefix(storage_id)
        keys = self._list_keys(key_prefix)
        if not keys:
            raise CheckpointNotFoundError(storage_id, self.describe())
        metadata_key = key_prefix + METADATA_FILENAME
        if metadata_key in keys:
            self._delete_keys([metadata_key], f"checkpoint {storage_id!r}")
            keys.remove(metadata_key)
        self._delete_keys(keys, f"checkpoint {storage_id!r}")

    def list_ids(self) -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""
        storage_ids = set()
        for key in self._list_keys(root):
            storage_id, _, rest = key[len(root) :].partition("/")
            if rest == METADATA_FILENAME and storage_id and not storage_id.startswith("."):
                storage_ids.add(storage_id)
        return sorted(storage_ids)


# ---------------------------------------------------------------------------------------------
# The experiment file's checkpoint_storage block
# ---------------------------------------------------------------------------------------------

_ALLOWED_KEYS = {
    "shared_fs": {"host_path", "storage_path", "container_path", "propagation"},
    "directory": {"container_path"},
    "s3": {"bucket", "prefix", "endpoint_url", "access_key", "secret_key", "region"},
}
"""Keys each storage type accepts besides ``type`` and the retention keys. ``container_path``
and ``propagation`` of ``shared_fs`` describe a cluster's container mount and mean nothing
locally; they are accepted and ignored so a Determined experiment file runs unchanged."""


def _optional_str(spec: Mapping[str, Any], storage_type: str, key: str) -> str | None:
    value = spec.get(key)
    if value is not None and not isinstance(value, str):
        raise StorageConfigError(
            f"checkpoint_storage.{key} (type {storage_type}) must be a string, "
            f"got {type(value).__name__} {value!r}"
        )
    return value


def _required_str(spec: Mapping[str, Any], storage_type: str, key: str) -> str:
    value = _optional_str(spec, storage_type, key)
    if not value:
        raise StorageConfigError(f"checkpoint_storage of type {storage_type} needs {key!r}")
    return value


def _shared_fs_root(host_path: str, storage_path: str | None) -> Path:
    """Determined's rule: ``host_path`` is absolute; ``storage_path``, relative to it or
    absolute, must lie inside it."""
    if not os.path.isabs(host_path):
        raise StorageConfigError(
            f"checkpoint_storage.host_path must be an absolute path, got {host_path!r}"
        )
    host = Path(os.path.normpath(host_path))
    if storage_path is None:
        return host
    root = Path(os.path.normpath(host / storage_path))
    if root != host and host not in root.parents:
        raise StorageConfigError(
            f"checkpoint_storage.storage_path {storage_path!r} must be a subdirectory of "
            f"host_path {host_path!r}"
        )
    return root


def make_storage(
    spec: Mapping[str, Any] | None, run_dir: str | os.PathLike[str]
) -> CheckpointStorage:
    """Build the backend that a Determined ``checkpoint_storage`` block describes.

    ``None`` means the default: ``<run_dir>/checkpoints``. ``shared_fs`` stores under
    ``host_path`` (joined with ``storage_path`` if given), ``directory`` under
    ``container_path``, ``s3`` in a bucket. Retention keys (``save_trial_best`` and friends)
    are the checkpoint plugin's business and are ignored here.
    """
    if spec is None:
        return LocalStorage(Path(run_dir) / "checkpoints")
    if not isinstance(spec, Mapping):
        raise StorageConfigError(
            f"checkpoint_storage must be a mapping, got {type(spec).__name__} {spec!r}"
        )
    storage_type = spec.get("type")
    if storage_type not in SUPPORTED_STORAGE_TYPES:
        shown = "missing" if storage_type is None else repr(storage_type)
        raise StorageConfigError(
            f"checkpoint_storage.type is {shown}; supported types: "
            + ", ".join(SUPPORTED_STORAGE_TYPES)
        )
    unknown = sorted(set(spec) - {"type"} - RETENTION_KEYS - _ALLOWED_KEYS[storage_type])
    if unknown:
        raise StorageConfigError(
            f"checkpoint_storage of type {storage_type} has unknown key(s) "
            f"{', '.join(map(repr, unknown))}; allowed: "
            + ", ".join(sorted(_ALLOWED_KEYS[storage_type] | RETENTION_KEYS))
        )

    if storage_type == "shared_fs":
        host_path = _required_str(spec, storage_type, "host_path")
        storage_path = _optional_str(spec, storage_type, "storage_path")
        return LocalStorage(_shared_fs_root(host_path, storage_path))
    if storage_type == "directory":
        return LocalStorage(_required_str(spec, storage_type, "container_path"))
    try:
        return S3Storage(
            bucket=_required_str(spec, storage_type, "bucket"),
            prefix=_optional_str(spec, storage_type, "prefix") or "",
            endpoint_url=_optional_str(spec, storage_type, "endpoint_url"),
            access_key=_optional_str(spec, storage_type, "access_key"),
            secret_key=_optional_str(spec, storage_type, "secret_key"),
            region=_optional_str(spec, storage_type, "region"),
        )
    except ValueError as err:
        if isinstance(err, StorageConfigError):
            raise
        raise StorageConfigError(f"checkpoint_storage (type s3): {err}") from err
