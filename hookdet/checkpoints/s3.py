"""Checkpoints in Amazon S3 or an S3-compatible object store (MinIO, Ceph, moto), through boto3
(the ``s3`` extra). S3 cannot rename a prefix, so a checkpoint's files are uploaded first and its
``metadata.json`` last: a checkpoint is complete exactly when its ``metadata.json`` exists. Every
request has connect and read timeouts and botocore's standard retries (:data:`S3_TIMEOUTS`), so an
endpoint that stops answering fails a checkpoint instead of hanging the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Optional

from hookdet.checkpoints.storage import (
    METADATA_FILE,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CheckpointStorage,
    IncompleteCheckpointError,
    StorageError,
    check_storage_id,
    parse_metadata,
)

__all__ = ["S3_TIMEOUTS", "S3Storage"]


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

#: Seconds the pre-flight probe (:meth:`S3Storage.check`) waits to connect and for an answer;
#: short, because it is one request.
PROBE_TIMEOUT_S = float(os.environ.get("HOOKDET_S3_PROBE_TIMEOUT", "5"))


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
        check_storage_id(storage_id)
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
        metadata_key = key_prefix + METADATA_FILE
        if metadata_key in self._list_keys(key_prefix):
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
        existing_keys = self._list_keys(key_prefix)
        if key_prefix + METADATA_FILE in existing_keys:
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
        relative_files.remove(METADATA_FILE)
        relative_files.append(METADATA_FILE)
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
        if key_prefix + METADATA_FILE not in keys:
            detail = (
                f"objects under {key_prefix!r} lack {METADATA_FILE}, "
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
        metadata_key = key_prefix + METADATA_FILE
        if metadata_key in keys:
            self._delete_keys([metadata_key], f"checkpoint {storage_id!r}")
            keys.remove(metadata_key)
        self._delete_keys(keys, f"checkpoint {storage_id!r}")

    def list_ids(self) -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""
        storage_ids = set()
        for key in self._list_keys(root):
            storage_id, _, rest = key[len(root) :].partition("/")
            if rest == METADATA_FILE and storage_id and not storage_id.startswith("."):
                storage_ids.add(storage_id)
        return sorted(storage_ids)

    # ------------------------------------------------------------------ the protocol's questions

    type_name = "s3"

    @classmethod
    def from_config(cls, config: Any, run_dir: Path) -> "S3Storage":
        """The storage of a validated ``type: s3`` block."""
        return cls(
            bucket=config.bucket,
            prefix=config.prefix or "",
            endpoint_url=config.endpoint_url,
            access_key=config.access_key,
            secret_key=config.secret_key,
            region=config.region,
        )

    def locator(self) -> Dict[str, Any]:
        return {"type": self.type_name, "bucket": self.bucket, "prefix": self.prefix,
                "endpoint_url": self.endpoint_url, "region": self.region}

    def read_metadata(self, storage_id: str) -> Dict[str, Any]:
        """One GET of ``metadata.json``; the state stays in the bucket."""
        from botocore.exceptions import ClientError

        key = self._checkpoint_key_prefix(storage_id) + METADATA_FILE
        try:
            with self._s3_errors(f"reading {key!r}"):
                body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except StorageError as error:
            cause = error.__cause__
            if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise CheckpointNotFoundError(storage_id, self.describe()) from None
            raise
        return parse_metadata(body, f"s3://{self.bucket}/{key}")

    def check(self) -> Optional[str]:
        """The bucket answers a ``HEAD`` within :data:`PROBE_TIMEOUT_S`, in one attempt
        (unreachable or hanging endpoint, missing bucket, bad credentials)."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.new_client(PROBE_TIMEOUT_S, PROBE_TIMEOUT_S, max_attempts=1)
        try:
            client.head_bucket(Bucket=self.bucket)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            return f"checkpoint storage {self.describe()}: bucket {self.bucket!r} refused: {code or error}"
        except BotoCoreError as error:
            return f"checkpoint storage {self.describe()} is unreachable: {error}"
        return None
