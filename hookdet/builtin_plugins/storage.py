"""Checkpoint storage plugins: a local directory and S3-compatible object storage.

Each answers ``hookdet_make_checkpoint_storage`` for the ``checkpoint_storage.type`` it serves;
the classes that move the bytes are in :mod:`hookdet.storage_backends`.
"""
from __future__ import annotations

from typing import Any

from hookdet.markers import hookimpl
from hookdet.storage_backends import make_storage


class LocalStoragePlugin:
    """``shared_fs`` and ``directory`` storage, and the default: ``<run dir>/checkpoints``."""

    @hookimpl
    def hookdet_make_checkpoint_storage(self, run: Any) -> Any:
        """A :class:`LocalStorage` when the experiment file asks for a local type (or none)."""
        storage = run.config.checkpoint_storage
        if storage is None or storage.type in ("shared_fs", "directory", "default"):
            return make_storage(storage, run.run_dir)
        return None


class S3StoragePlugin:
    """``type: s3`` storage through boto3 (``pip install hookdet[s3]``)."""

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Fail before training when boto3 is missing."""
        try:
            import boto3  # noqa: F401
        except ImportError as error:
            raise ImportError(
                "checkpoint_storage type 's3' needs boto3: pip install 'hookdet[s3]'"
            ) from error

    @hookimpl
    def hookdet_make_checkpoint_storage(self, run: Any) -> Any:
        """An :class:`S3Storage` for ``type: s3``."""
        storage = run.config.checkpoint_storage
        if storage is not None and storage.type == "s3":
            return make_storage(storage, run.run_dir)
        return None
