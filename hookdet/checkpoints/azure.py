"""``type: azure``: checkpoints in an Azure Blob Storage container, through azure-storage-blob
(the ``azure`` extra), with Determined's fields: ``container``, and ``connection_string`` or
``account_url`` (with an optional ``credential``). The checkpoint logic is
:class:`ObjectStorage`'s; this module is the client library's five primitives.

As in Determined, ``container`` may carry a path after the container's name
(``checkpoints/team-a``): the path is a prefix inside the container.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from hookdet.checkpoints.object_store import ObjectStorage, normalize_prefix
from hookdet.checkpoints.storage import StorageError

__all__ = ["AzureStorage"]

#: Seconds each request may take before it fails (a hanging endpoint fails a checkpoint).
AZURE_TIMEOUT_S = float(os.environ.get("HOOKDET_AZURE_TIMEOUT", "60"))


def _blob_module() -> Any:
    try:
        from azure.storage import blob
    except ImportError as error:
        raise ImportError(
            "checkpoint_storage type 'azure' needs azure-storage-blob: pip install 'hookdet[azure]'"
        ) from error
    return blob


class AzureStorage(ObjectStorage):
    """Checkpoints as blobs ``<path>/<storage id>/<relative file path>`` in one container."""

    type_name = "azure"
    vendor = "Azure"

    def __init__(
        self,
        container: str,
        connection_string: Optional[str] = None,
        account_url: Optional[str] = None,
        credential: Optional[str] = None,
    ) -> None:
        name, _, path = str(container).strip("/").partition("/")
        if not name:
            raise ValueError(f"Azure container must name a container, got {container!r}")
        if not (connection_string or account_url):
            raise ValueError("Azure storage needs connection_string or account_url")
        self.container_name = name
        self.prefix = normalize_prefix(path)
        self.account_url = account_url
        self._connection_string = connection_string
        self._credential = credential
        self._container: Any = None

    @classmethod
    def from_config(cls, config: Any, run_dir: Path) -> "AzureStorage":
        return cls(container=config.container, connection_string=config.connection_string,
                   account_url=config.account_url, credential=config.credential)

    def locator(self) -> Dict[str, Any]:
        """Container and account, never the connection string (it holds the key)."""
        return {"type": self.type_name, "container": self._container_path(), "account": self._account()}

    @classmethod
    def from_locator(cls, locator: Dict[str, Any]) -> "AzureStorage":
        """A recorded locator holds no secret: the account URL alone, with the credential from
        ``AZURE_STORAGE_CONNECTION_STRING`` when it is set for that account."""
        connection_string = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        storage = cls(container=locator["container"], connection_string=connection_string,
                      account_url=None if connection_string else locator["account"])
        if storage._account() != locator["account"]:
            raise ValueError(f"AZURE_STORAGE_CONNECTION_STRING is for {storage._account()}, the run's storage is in {locator['account']}")
        return storage

    def _container_path(self) -> str:
        return f"{self.container_name}/{self.prefix}" if self.prefix else self.container_name

    def _account(self) -> str:
        if self.account_url:
            return self.account_url.rstrip("/")
        return self.container.url.rsplit("/", 1)[0]

    def describe(self) -> str:
        return f"container {self._container_path()}"

    def url(self, key: str) -> str:
        return f"azure://{self.container_name}/{key}"

    @property
    def container(self) -> Any:
        """The client library's container client, made on first use."""
        if self._container is None:
            blob = _blob_module()
            if self._connection_string:
                service = blob.BlobServiceClient.from_connection_string(self._connection_string)
            else:
                service = blob.BlobServiceClient(self.account_url, credential=self._credential)
            self._container = service.get_container_client(self.container_name)
        return self._container

    def list_keys(self, key_prefix: str) -> List[str]:
        with self.failing_as(f"listing {key_prefix or 'the container'}"):
            return [item.name for item in self.container.list_blobs(name_starts_with=key_prefix or None, timeout=AZURE_TIMEOUT_S)]

    def upload_file(self, local_file: Path, key: str) -> None:
        with self.failing_as(f"uploading {key!r}"), open(local_file, "rb") as data:
            self.container.upload_blob(key, data, overwrite=True, timeout=AZURE_TIMEOUT_S)

    def download_file(self, key: str, local_file: Path) -> None:
        with self.failing_as(f"downloading {key!r}"), open(local_file, "wb") as out:
            self.container.download_blob(key, timeout=AZURE_TIMEOUT_S).readinto(out)

    def get_bytes(self, key: str, limit: int) -> Optional[bytes]:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            with self.failing_as(f"reading {key!r}"):
                return self.container.download_blob(key, offset=0, length=limit, timeout=AZURE_TIMEOUT_S).readall()
        except StorageError as error:
            if isinstance(error.__cause__, ResourceNotFoundError):
                return None
            raise

    def delete_keys(self, keys: List[str]) -> None:
        with self.failing_as(f"deleting {len(keys)} blob(s)"):
            for key in keys:
                self.container.delete_blob(key, timeout=AZURE_TIMEOUT_S)

    def check(self) -> Optional[str]:
        """The container exists and answers."""
        try:
            if not self.container.exists(timeout=10):
                return f"checkpoint storage {self.describe()}: container {self.container_name!r} does not exist"
        except Exception as error:
            return f"checkpoint storage {self.describe()} is unreachable: {error}"
        return None
