"""What ``hookdet ui`` serves: the run and search directories under its roots, and the one way
from a URL to a path.

A root is a folder the user named (default: ``./runs`` and the run directories of the user's
checkpoint index). Each gets a short key from its resolved path, so a page's URL
(``/run/<key>/<path under the root>``) stays the same from one start of the server to the next
and can be bookmarked. :meth:`Catalog.locate` is the only function that turns a URL into a path:
it resolves the path (``..``, ``%2e%2e``, symlinks) and accepts it only when it lies inside a
root's resolved path and is a run or search directory found there. A file of a run is read only
by its fixed name inside that run (:mod:`hookdet.ui.records`).
"""
from __future__ import annotations

import hashlib
import time
import urllib.parse
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from hookdet.runs import index as run_index
from hookdet.search import report
from hookdet.ui.records import RunRecords
from hookdet.ui.search_records import SearchRecords

#: How long a scan of the roots for run and search directories is reused, in seconds.
SCAN_EVERY_S = 2.0
#: Directories whose records are kept in memory at most (the least recently used go first).
KEPT_RECORDS = 2000


class NotServed(Exception):
    """A URL naming no run or search directory of the catalog (or one outside it)."""


def default_roots() -> List[Path]:
    """``./runs``, and every run directory the user's checkpoint index names (a search's trial
    as its search directory), that exists."""
    from hookdet.checkpoints import user_index

    roots = [Path("runs")]
    directory = user_index.index_dir()
    for entry in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        run_dir = user_index.lookup(entry.stem)
        path = Path(str((run_dir or {}).get("run_dir") or ""))
        if str(path) and path.is_dir():
            roots.append(path.parent if report.is_search_dir(path.parent) else path)
    return [root for root in _distinct(roots) if root.is_dir()]


def _distinct(roots: Iterable[Path]) -> List[Path]:
    """Roots in order, without one that lies inside another already taken."""
    kept: List[Path] = []
    for root in roots:
        resolved = root.resolve()
        if not any(resolved.is_relative_to(other.resolve()) for other in kept):
            kept = [other for other in kept if not other.resolve().is_relative_to(resolved)] + [root]
    return kept


def root_key(root: Path) -> str:
    """A short name for a root, the same whenever the root is."""
    return hashlib.blake2s(str(root.resolve()).encode(), digest_size=4).hexdigest()


class Catalog:
    """The roots, what is under them, and the records of what was asked for."""

    def __init__(self, roots: Iterable[Path]) -> None:
        self.roots: Dict[str, Path] = {root_key(Path(root)): Path(root).resolve() for root in roots}
        self._scanned_at = -SCAN_EVERY_S
        self._searches: List[Path] = []
        self._runs: List[Path] = []
        self._records: Dict[Path, object] = {}

    def scan(self) -> Tuple[List[Path], List[Path]]:
        """(search directories, run directories that are no search's trial), resolved."""
        if time.monotonic() - self._scanned_at < SCAN_EVERY_S:
            return self._searches, self._runs
        searches, runs = [], []
        for root in self.roots.values():
            # Only what resolves inside the root: a symlink out of it is not served, nor listed.
            found = [path for path in map(Path.resolve, report.find_searches(root)) if path.is_relative_to(root)]
            searches += found
            runs += [path for path in map(Path.resolve, run_index.find_runs(root))
                     if path.is_relative_to(root) and not any(path.is_relative_to(search) for search in found)]
        self._searches, self._runs = sorted(set(searches)), sorted(set(runs))
        self._scanned_at = time.monotonic()
        return self._searches, self._runs

    # ------------------------------------------------------------------ URLs and paths

    def url_of(self, path: Path) -> str:
        """The page of a run or search directory under a root; its path percent-encoded, so a
        directory named with ``#``, ``?``, ``%`` or a space opens as any other."""
        path = Path(path).resolve()
        for key, root in self.roots.items():
            if path.is_relative_to(root):
                kind = "search" if report.is_search_dir(path) else "run"
                relative = urllib.parse.quote(path.relative_to(root).as_posix(), safe="/")
                return f"/{kind}/{key}/{relative}" if relative != "." else f"/{kind}/{key}/."
        raise NotServed(f"{path} is under no root of this server")

    def locate(self, key: str, relative: str, kind: str) -> Path:
        """The ``kind`` (``run`` or ``search``) directory a URL names, resolved and checked
        (see the module docstring); :class:`NotServed` otherwise."""
        root = self.roots.get(key)
        if root is None:
            raise NotServed(f"no root {key!r}")
        path = (root / relative).resolve()
        if not path.is_relative_to(root):
            raise NotServed(f"{relative!r} leads out of its root")
        is_kind = report.is_search_dir(path) if kind == "search" else run_index.is_run_dir(path)
        if not is_kind:
            raise NotServed(f"{relative!r} is not a {kind} directory")
        return path

    # ------------------------------------------------------------------ records

    def run(self, path: Path) -> RunRecords:
        return self._kept(path, RunRecords)  # type: ignore[return-value]

    def search(self, path: Path) -> SearchRecords:
        return self._kept(path, SearchRecords)  # type: ignore[return-value]

    def _kept(self, path: Path, kind: type) -> object:
        records = self._records.pop(path, None)
        if not isinstance(records, kind):
            records = kind(path)
        self._records[path] = records  # the most recently used last
        while len(self._records) > KEPT_RECORDS:
            self._records.pop(next(iter(self._records)))
        return records

    def trial_states(self, search: SearchRecords) -> Dict[Path, str]:
        """Each trial's run directory (resolved) and its state in the search."""
        return {records.path.resolve(): search.state["trials"][request_id]["state"]
                for request_id, records in search.trials.items()}

    def owner_search(self, run_dir: Path) -> Optional[Path]:
        """The search directory ``run_dir`` is a trial of, if any."""
        parent = Path(run_dir).resolve().parent
        return parent if report.is_search_dir(parent) else None
