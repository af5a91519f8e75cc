"""Train once, read many: what a fixture computes for tests that only read it is computed once
per test session, whichever of pytest-xdist's workers asks first (a module- or session-scoped
fixture alone is computed once *per worker*, and work stealing spreads a module's tests over
both).

The first worker to ask computes it under a file lock (``filelock``, which torch already
requires) in a directory shared by the session's workers and saves the value; the others wait for
the lock and read the saved value. pytest-xdist's documentation gives this recipe
("Making session-scoped fixtures execute only once").
"""
from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Callable, TypeVar

import pytest
from filelock import FileLock

T = TypeVar("T")


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory every worker of this session sees (the base of one worker's own)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


def computed_once(tmp_path_factory: pytest.TempPathFactory, name: str, compute: Callable[[Path], T]) -> T:
    """``compute(directory)`` for the whole session (``directory`` is new, and shared: what the
    value names in it stays there for every worker); its value, pickled for the other workers."""
    root = session_root(tmp_path_factory) / "shared"
    root.mkdir(exist_ok=True)
    saved = root / f"{name}.pickle"
    with FileLock(str(root / f"{name}.lock")):
        if saved.exists():
            return pickle.loads(saved.read_bytes())
        directory = root / name
        shutil.rmtree(directory, ignore_errors=True)  # left by a worker whose compute failed
        directory.mkdir()
        value = compute(directory)
        saved.write_bytes(pickle.dumps(value))
        return value
