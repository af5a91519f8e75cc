"""Is the checkpoint storage usable? Asked once, before the first batch, not at the first
checkpoint after minutes of training.

Local storage: the root can be created and a small file written, flushed and removed there
(permission, read-only filesystem, disk full). S3: the bucket answers a ``HEAD`` within a short
timeout, with one attempt (unreachable or hanging endpoint, missing bucket, bad credentials).
The answer is a one-line problem, or None.
"""
from __future__ import annotations

import errno
import os
import secrets
from typing import Any, Optional

from hookdet.s3_storage import S3Storage
from hookdet.storage_backends import LocalStorage

#: Seconds the S3 probe waits to connect and for an answer; short, because it is one request.
PROBE_TIMEOUT_S = float(os.environ.get("HOOKDET_S3_PROBE_TIMEOUT", "5"))


def storage_problem(storage: Any) -> Optional[str]:
    """Why ``storage`` cannot take checkpoints, in one line; None when it can."""
    if isinstance(storage, LocalStorage):
        return _local_problem(storage)
    if isinstance(storage, S3Storage):
        return _s3_problem(storage)
    return None


def describe_os_error(error: OSError) -> str:
    """``disk full``, ``permission denied``... for an OSError, in words a user acts on."""
    if error.errno == errno.ENOSPC:
        return "no space left on the device (disk full)"
    if error.errno == errno.EDQUOT:
        return "disk quota exceeded"
    if error.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if error.errno == errno.EROFS:
        return "read-only filesystem"
    return error.strerror or str(error)


def environment_fault(error: OSError) -> Optional[str]:
    """One line for an OSError the machine caused (disk full, quota, read-only filesystem),
    naming the file; None for any other error."""
    if error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return None
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{describe_os_error(error)}"


def failure_cause(storage: Any, error: BaseException) -> Optional[str]:
    """Why a checkpoint write failed, in words a user acts on (``disk full``...), or None when
    the error says nothing more than itself (torch reports a full disk as ``unexpected pos``)."""
    if isinstance(error, OSError) and error.errno is not None:
        return describe_os_error(error)
    if isinstance(storage, LocalStorage) and "unexpected pos" in str(error):
        # torch's writer stopped short: the device refused more bytes (the partial write is
        # already removed, so the free space now says little; it is shown anyway).
        return f"the write stopped short: no space left on the device (disk full?), {_free(storage.root)} free"
    return None


def _free(root: Any) -> str:
    try:
        stats = os.statvfs(root)
    except OSError:
        return "unknown space"
    return f"{stats.f_bavail * stats.f_frsize / 2**20:.1f} MiB"


def _local_problem(storage: LocalStorage) -> Optional[str]:
    probe = storage.root / f".tmp-probe-{secrets.token_hex(4)}"
    try:
        storage.root.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"\0" * 4096)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        return f"checkpoint storage {storage.describe()} is not writable: {describe_os_error(error)}"
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return None


def _s3_problem(storage: S3Storage) -> Optional[str]:
    from botocore.exceptions import BotoCoreError, ClientError

    client = storage.new_client(PROBE_TIMEOUT_S, PROBE_TIMEOUT_S, max_attempts=1)
    try:
        client.head_bucket(Bucket=storage.bucket)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        return f"checkpoint storage {storage.describe()}: bucket {storage.bucket!r} refused: {code or error}"
    except BotoCoreError as error:
        return f"checkpoint storage {storage.describe()} is unreachable: {error}"
    return None
