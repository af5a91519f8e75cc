"""Storage failures in words a user acts on: ``disk full``, ``permission denied``...

A checkpoint write that fails says why, naming the storage; an ``OSError`` the machine caused
(disk full, quota, read-only filesystem) or a path it cannot hold (a name too long) ends a run
with one line instead of a traceback.
"""
from __future__ import annotations

import errno
from typing import Any, Optional


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
    if error.errno == errno.ENAMETOOLONG:
        return "file name too long (a name in a path has at most 255 bytes)"
    return error.strerror or str(error)


def environment_fault(error: OSError) -> Optional[str]:
    """One line for an OSError the machine caused (disk full, quota, read-only filesystem) or
    a path it cannot hold (a name too long), naming the file; None for any other error."""
    if error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG):
        return None
    filename = str(error.filename) if error.filename else ""
    if len(filename) > 120:  # the name is the problem: show its start, not all of it
        filename = f"{filename[:100]}... ({len(filename):,} characters)"
    where = f"{filename}: " if filename else ""
    return f"{where}{describe_os_error(error)}"


def failure_cause(storage: Any, error: BaseException) -> Optional[str]:
    """Why a checkpoint write to ``storage`` failed, in words, or None when the error says
    nothing more than itself."""
    if isinstance(error, OSError) and error.errno is not None:
        return describe_os_error(error)
    return storage.failure_cause(error) if storage is not None else None
