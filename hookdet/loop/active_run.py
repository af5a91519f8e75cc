"""The run in progress in this process, for APIs that reach it without a context.

Determined's legacy ``TorchWriter()`` is built with no arguments inside a trial; it finds the run
here. :func:`hookdet.loop.trainer.init` enters and leaves it; runs nest (the latest is active).
"""
from __future__ import annotations

from typing import Any, List, Optional

_runs: List[Any] = []


def active_run() -> Optional[Any]:
    """The innermost run in progress in this process, or None outside ``pytorch.init()``."""
    return _runs[-1] if _runs else None


def enter(run: Any) -> None:
    """``run`` is in progress: it is the active run until :func:`leave`."""
    _runs.append(run)


def leave(run: Any) -> None:
    """``run`` ended (the run before it, if any, is active again)."""
    if run in _runs:
        _runs.remove(run)
