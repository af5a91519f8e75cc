"""A search runs the model directory as it was when the search started, as Determined ran the
context directory it uploaded when the experiment was created.

A search that started from ``model/`` copies it into ``SEARCH_DIR/model/`` before its first
segment, and every segment (a resumed search's too) runs that copy: an edit to ``model/`` while
the search trains reaches no trial, so no trial spans two versions of the code. What the copy
leaves out, as Determined's upload did: ``__pycache__``, version-control folders, the lines of a
``.detignore`` file in the model directory (one glob per line, as in ``.gitignore``: matched
against each name at any depth, or, with a ``/`` at its start or inside it, against the path
from the model directory; a trailing ``/`` matches folders only; ``#`` starts a comment), the search directory itself when it lies inside the model directory, and every
run or search directory in it (``runs/`` of earlier runs started from inside it). A
symlinked folder (a data folder kept elsewhere) stays a link to where it leads. A model
directory whose copy would be over :data:`LIMIT_BYTES` (Determined's limit) is refused, naming
``.detignore``.

A search started before snapshots existed (its directory has no ``model/``) runs the model
directory it was given, as before.
"""
from __future__ import annotations

import fnmatch
import os
import shutil
from pathlib import Path
from typing import List, Optional

from hookdet.errors import UsageError
from hookdet.runs.files import IDENTITY_FILE, RUN_RECORD_FILE
from hookdet.search.report import META_FILE

#: The copy's name inside the search directory.
SNAPSHOT_DIR = "model"
#: What a snapshot may hold at most (Determined refused a larger context directory).
LIMIT_BYTES = 96 * 2**20
#: Left out of every snapshot.
ALWAYS_LEFT_OUT = ("__pycache__", ".git", ".hg", ".svn")
#: Files by which a folder is known as a run or search directory, left out of a snapshot.
RECORDS = (RUN_RECORD_FILE, IDENTITY_FILE, META_FILE)


def snapshot(model_dir: Path, search_dir: Path) -> Path:
    """Copy ``model_dir`` into ``search_dir`` (see the module's docstring) and return the copy."""
    model_dir, search_dir = model_dir.resolve(), search_dir.resolve()
    patterns = detignore_patterns(model_dir)
    chosen = chosen_files(model_dir, search_dir, patterns)
    size = sum(path.stat().st_size for path in chosen if not path.is_dir())
    if size > LIMIT_BYTES:
        raise UsageError(f"model directory {model_dir} holds {size / 2**20:.0f} MiB to snapshot for the search, "
                         f"over the {LIMIT_BYTES // 2**20} MiB limit; list data and outputs in "
                         f"{model_dir / '.detignore'} (one glob per line) to leave them out")
    target = search_dir / SNAPSHOT_DIR
    partial = search_dir / f".{SNAPSHOT_DIR}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    for path in chosen:
        copied = partial / path.relative_to(model_dir)
        copied.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():  # a symlinked folder
            os.symlink(path.resolve(), copied)
        else:
            shutil.copy2(path, copied)
    partial.mkdir(exist_ok=True)  # an empty model directory is a snapshot too
    os.replace(partial, target)
    return target


def snapshot_of(search_dir: Path) -> Optional[Path]:
    """The search's snapshot of its model directory, or None for a search that has none."""
    found = Path(search_dir) / SNAPSHOT_DIR
    return found if found.is_dir() else None


def detignore_patterns(model_dir: Path) -> List[str]:
    """The globs of ``model_dir/.detignore`` (none when it has no such file)."""
    try:
        lines = (model_dir / ".detignore").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def left_out(relative: Path, is_dir: bool, patterns: List[str]) -> bool:
    """Whether the file or folder at ``relative`` (to the model directory) stays out of the copy."""
    if relative.name in ALWAYS_LEFT_OUT:
        return True
    for pattern in patterns:
        if pattern.endswith("/") and not is_dir:
            continue
        glob = pattern.strip("/")
        anchored = pattern.startswith("/") or "/" in glob  # a path from the model directory
        if fnmatch.fnmatch(relative.as_posix(), glob) or (not anchored and fnmatch.fnmatch(relative.name, glob)):
            return True
    return False


def holds_records(folder: Path) -> bool:
    """Whether ``folder`` is a run or search directory (hookdet's records, not the model's code:
    ``runs/`` of a search started from inside the model directory)."""
    return any((folder / name).is_file() for name in RECORDS)


def chosen_files(model_dir: Path, search_dir: Path, patterns: List[str]) -> List[Path]:
    """What the snapshot holds of ``model_dir``: its files (a symlinked file as the file it
    leads to) and its symlinked folders (kept as links to where they lead: a data folder
    elsewhere is read there, not copied)."""
    chosen: List[Path] = []
    for root, folders, files in os.walk(model_dir):  # symlinked folders are listed, not entered
        here = Path(root)
        folders[:] = [name for name in folders
                      if (here / name).resolve() != search_dir and not holds_records(here / name)
                      and not left_out((here / name).relative_to(model_dir), True, patterns)]
        chosen += [here / name for name in folders if (here / name).is_symlink()]
        chosen += [here / name for name in files
                   if not left_out((here / name).relative_to(model_dir), False, patterns) and (here / name).is_file()]
    return chosen
