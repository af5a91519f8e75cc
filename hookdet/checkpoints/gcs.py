"""``type: gcs``: checkpoints in a Google Cloud Storage bucket, through google-cloud-storage (the
``gcs`` extra), with Determined's fields (``bucket``, ``prefix``). The checkpoint logic is
:class:`ObjectStorage`'s; this module is the client library's five primitives.

Credentials come from Google's usual chain (``GOOGLE_APPLICATION_CREDENTIALS``, the metadata
server), as in Determined. With ``STORAGE_EMULATOR_HOST`` set (an emulator on this machine, as
the tests start), the client talks to it anonymously.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from hookdet.checkpoints.object_store import ObjectStorage, normalize_prefix
from hookdet.checkpoints.storage import StorageError

__all__ = ["GCSStorage"]

#: Seconds each request may take before it fails (a hanging endpoint fails a checkpoint).
GCS_TIMEOUT_S = float(os.environ.get("HOOKDET_GCS_TIMEOUT", "60"))


def _client() -> Any:
    try:
        from google.cloud import storage
    except ImportError as error:
        raise ImportError(
            "checkpoint_storage type 'gcs' needs google-cloud-storage: pip install 'hookdet[gcs]'"
        ) from error
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "hookdet"), credentials=AnonymousCredentials())
    return storage.Client()


class GCSStorage(ObjectStorage):
    """Checkpoints as objects ``<prefix>/<storage id>/<relative file path>`` in one bucket."""

    type_name = "gcs"
    vendor = "GCS"

    def __init__(self, bucket: str, prefix: Optional[str] = None) -> None:
        if not isinstance(bucket, str) or not bucket or "/" in bucket:
            raise ValueError(f"GCS bucket must be a bucket name without '/', got {bucket!r}")
        self.bucket_name = bucket
        self.prefix = normalize_prefix(prefix)
        self._bucket: Any = None

    @classmethod
    def from_config(cls, config: Any, run_dir: Path) -> "GCSStorage":
        return cls(bucket=config.bucket, prefix=config.prefix)

    def locator(self) -> Dict[str, Any]:
        return {"type": self.type_name, "bucket": self.bucket_name, "prefix": self.prefix}

    def describe(self) -> str:
        return self.url(self.prefix)

    def url(self, key: str) -> str:
        return f"gs://{self.bucket_name}/{key}" if key else f"gs://{self.bucket_name}"

    @property
    def bucket(self) -> Any:
        """The client library's bucket, made on first use."""
        if self._bucket is None:
            self._bucket = _client().bucket(self.bucket_name)
        return self._bucket

    def list_keys(self, key_prefix: str) -> List[str]:
        with self.failing_as(f"listing {key_prefix or 'the bucket'}"):
            return [blob.name for blob in self.bucket.list_blobs(prefix=key_prefix, timeout=GCS_TIMEOUT_S)]

    def upload_file(self, local_file: Path, key: str) -> None:
        with self.failing_as(f"uploading {key!r}"):
            self.bucket.blob(key).upload_from_filename(str(local_file), timeout=GCS_TIMEOUT_S)

    def download_file(self, key: str, local_file: Path) -> None:
        with self.failing_as(f"downloading {key!r}"):
            self.bucket.blob(key).download_to_filename(str(local_file), timeout=GCS_TIMEOUT_S)

    def get_bytes(self, key: str, limit: int) -> Optional[bytes]:
        from google.api_core.exceptions import NotFound

        try:
            with self.failing_as(f"reading {key!r}"):
                return self.bucket.blob(key).download_as_bytes(start=0, end=limit - 1, timeout=GCS_TIMEOUT_S)
        except StorageError as error:
            if isinstance(error.__cause__, NotFound):
                return None
            raise

    def delete_keys(self, keys: List[str]) -> None:
        with self.failing_as(f"deleting {len(keys)} object(s)"):
            for key in keys:
                self.bucket.blob(key).delete(timeout=GCS_TIMEOUT_S)

    def check(self) -> Optional[str]:
        """The bucket exists and answers."""
        try:
            if not self.bucket.exists(timeout=min(GCS_TIMEOUT_S, 10)):
                return f"checkpoint storage {self.describe()}: bucket {self.bucket_name!r} does not exist"
        except Exception as error:
            return f"checkpoint storage {self.describe()} is unreachable: {error}"
        return None
