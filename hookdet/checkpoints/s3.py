"""``type: s3``: checkpoints in Amazon S3 or an S3-compatible object store (MinIO, Ceph, moto),
through boto3 (the ``s3`` extra). The checkpoint logic is :class:`ObjectStorage`'s; this module
is boto3's five primitives. Every request has connect and read timeouts and botocore's standard
retries (:data:`S3_TIMEOUTS`), so an endpoint that stops answering fails a checkpoint instead of
hanging the run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from hookdet.checkpoints.object_store import ObjectStorage, normalize_prefix
from hookdet.checkpoints.storage import StorageError

__all__ = ["S3_TIMEOUTS", "S3Storage"]


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


class S3Storage(ObjectStorage):
    """Checkpoints as objects ``<prefix>/<storage id>/<relative file path>`` in one bucket.

    Works with AWS S3 and S3-compatible servers (MinIO, Ceph, moto) through ``endpoint_url``.
    Credentials not given here come from boto3's usual chain (environment, config files,
    instance roles). Empty directories are not stored: object stores have none.
    """

    type_name = "s3"
    vendor = "S3"

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
        self.prefix = normalize_prefix(prefix)
        self.endpoint_url = endpoint_url
        self._access_key = access_key
        self._secret_key = secret_key
        self.region = region
        self._client: Any = None

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

    def describe(self) -> str:
        url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        return f"{url} (endpoint {self.endpoint_url})" if self.endpoint_url else url

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

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

    def vendor_errors(self) -> tuple:
        from botocore.exceptions import BotoCoreError, ClientError

        return (BotoCoreError, ClientError)

    # ------------------------------------------------------------------ boto3's primitives

    def list_keys(self, key_prefix: str) -> List[str]:
        keys: List[str] = []
        with self.failing_as(f"listing {key_prefix or 'the bucket'}"):
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=key_prefix):
                keys.extend(item["Key"] for item in page.get("Contents", ()))
        return keys

    def upload_file(self, local_file: Path, key: str) -> None:
        with self.failing_as(f"uploading {key!r}"):
            self.client.upload_file(str(local_file), self.bucket, key)

    def download_file(self, key: str, local_file: Path) -> None:
        with self.failing_as(f"downloading {key!r}"):
            self.client.download_file(self.bucket, key, str(local_file))

    def get_bytes(self, key: str, limit: int) -> Optional[bytes]:
        from botocore.exceptions import ClientError

        try:
            with self.failing_as(f"reading {key!r}"):
                return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read(limit)
        except StorageError as error:
            cause = error.__cause__
            if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    def delete_keys(self, keys: List[str]) -> None:
        """In batches of S3's 1000-key limit; any refusal raises."""
        batch_limit = 1000
        with self.failing_as(f"deleting {len(keys)} object(s)"):
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
                        f"S3 storage {self.describe()}: deleting failed for {len(refused)} "
                        f"object(s), first {first.get('Key')!r}: {first.get('Code')} {first.get('Message')}"
                    )

    # ------------------------------------------------------------------ before the first batch

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
