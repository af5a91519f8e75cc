"""A run's logs, as Determined kept a trial's: one rotating file per rank, written by
:class:`RankLogFile` and read by ``hookdet logs RUN [--follow] [--rank N]``.

Each rank's file is ``logs/rank-<N>.log`` (then ``.1``, ``.2``, oldest last), every line stamped
``[<ISO time>] [rank=<N>] [<stream>]``. The ``run_log`` plugin writes what a hookdet process
prints; ``hookdet run`` writes what a command that never calls hookdet printed
(:mod:`hookdet.cli.command_output`). Reading merges the ranks' lines by time. Following reads
each file from where it stopped (never a whole file again), keeps reading a file that was rotated
away until its end before taking the new one, and ends when the run has ended and nothing more
came. Reading locks and writes nothing.
"""
from __future__ import annotations

import datetime
import heapq
import logging
import logging.handlers
import os
import re
import threading
import time
from pathlib import Path
from typing import IO, Callable, Dict, Iterator, List, Optional, Tuple

from hookdet.runs.files import LOGS_DIR
from hookdet.runs.record import read_record

#: How often ``--follow`` looks for new lines, in seconds.
FOLLOW_EVERY_S = 0.25
_LOG_NAME = re.compile(r"^rank-(\d+)\.log(?:\.(\d+))?$")
#: Lines kept in memory before a log file is open (the rest are dropped).
EARLY_LINES = 10_000

logger = logging.getLogger("hookdet")


def log_files(run_dir: Path, rank: Optional[int] = None) -> Dict[int, List[Path]]:
    """Each rank's log files, oldest first (``rank-0.log.2``, ``.1``, then ``rank-0.log``)."""
    found: Dict[int, List[Tuple[int, Path]]] = {}
    directory = Path(run_dir) / LOGS_DIR
    for path in directory.iterdir() if directory.is_dir() else []:
        match = _LOG_NAME.match(path.name)
        if match and (rank is None or int(match.group(1)) == rank):
            found.setdefault(int(match.group(1)), []).append((int(match.group(2) or 0), path))
    return {number: [path for _, path in sorted(paths, reverse=True)] for number, paths in sorted(found.items())}


def read_lines(run_dir: Path, rank: Optional[int] = None, keep: Callable[[Path], bool] = lambda path: True) -> Iterator[str]:
    """Every line the run's ranks logged, in time order (each file is; the ranks are merged);
    ``keep``: which files to read (``hookdet ui`` reads none that leads out of the run)."""
    per_rank = [_lines_of([path for path in paths if keep(path)]) for paths in log_files(run_dir, rank).values()]
    yield from heapq.merge(*per_rank, key=stamp_of)


def _lines_of(paths: List[Path]) -> Iterator[str]:
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                yield line.rstrip("\n")


def stamp_of(line: str) -> str:
    """The time stamp a log line starts with (``[<ISO time>]``), by which the ranks' lines merge."""
    return line[1:line.index("]")] if line.startswith("[") and "]" in line else ""


def follow(run_dir: Path, rank: Optional[int] = None) -> Iterator[str]:
    """The lines there are, then new ones as they are written, until the run has ended (its
    record says it is not running) and its files have no more."""
    followers: Dict[int, LogFollower] = {}
    for number, paths in log_files(run_dir, rank).items():
        followers[number] = LogFollower(paths[-1], already=paths[:-1])
    while True:
        for number, paths in log_files(run_dir, rank).items():  # a rank that started logging since
            followers.setdefault(number, LogFollower(paths[-1], already=[]))
        ended = _has_ended(run_dir)
        new = [line for follower in followers.values() for line in follower.new_lines()]
        yield from sorted(new, key=stamp_of)
        if ended and not new:
            return
        if not new:
            time.sleep(FOLLOW_EVERY_S)


def _has_ended(run_dir: Path) -> bool:
    record = read_record(run_dir)
    return record is None or record.get("state") != "running"


class LogFollower:
    """One rank's current log file, read from where it stopped; when the file is rotated away,
    its end is read from the handle still open, then the new file from its start."""

    def __init__(self, path: Path, already: List[Path]) -> None:
        self.path = path
        self.backlog = list(_lines_of(already))
        self.handle: Optional[IO[str]] = None
        self.partial = ""

    def new_lines(self) -> List[str]:
        lines, self.backlog = self.backlog, []
        if self.handle is None:
            if not self.path.exists():
                return lines
            self.handle = open(self.path, encoding="utf-8", errors="replace")
        lines += self._read()
        if self._rotated():
            lines += self._read()  # the rest of the file that was moved away
            self.handle.close()
            self.handle = open(self.path, encoding="utf-8", errors="replace")
            lines += self._read()
        return lines

    def _read(self) -> List[str]:
        assert self.handle is not None
        text = self.partial + self.handle.read()
        *complete, self.partial = text.split("\n")
        return complete

    def _rotated(self) -> bool:
        assert self.handle is not None
        try:
            return os.stat(self.path).st_ino != os.fstat(self.handle.fileno()).st_ino
        except FileNotFoundError:
            return False


def why_not_writable(run_dir: Path, path: Path) -> Optional[str]:
    """Why the log file ``path`` of ``run_dir`` cannot be written there, as far as can be seen
    before opening it; None when nothing is in the way (the folder may not exist yet)."""
    inside = run_dir.resolve()
    for each in (path.parent, path):
        if not (each.exists() or each.is_symlink()):
            return None
        resolved = each.resolve()
        if resolved != inside and inside not in resolved.parents:
            return f"{each.name} leads outside the run, to {resolved}"
        if each == path.parent and not each.is_dir():
            return f"{each.name} is not a folder"
    return f"{path.name} is a folder" if path.is_dir() else None


class RankLogFile:
    """One rank's log file: stamps each line it is given and writes it to ``logs/rank-<N>.log``,
    rotated past ``max_bytes`` keeping ``backups`` older files; lines given before :meth:`open` are
    kept in memory (up to :data:`EARLY_LINES`). ``writer`` names who writes it in its warnings."""

    def __init__(self, max_bytes: int, backups: int, writer: str = "run_log") -> None:
        self.max_bytes, self.backups, self.writer = max_bytes, backups, writer
        self.rank: Optional[int] = None
        self.handler: Optional[logging.handlers.RotatingFileHandler] = None
        self.early: List[str] = []
        self.refused = False  # the file cannot be written: lines are dropped
        self.lock = threading.RLock()  # a write that fails reports on stderr, which comes back here

    def add(self, stream: str, line: str) -> None:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat()
        with self.lock:
            if self.refused:
                return
            if self.handler is None:
                if len(self.early) < EARLY_LINES:
                    self.early.append(f"[{now}] [rank={{rank}}] [{stream}] {line}")
                return
            self._emit(f"[{now}] [rank={self.rank}] [{stream}] {line}")

    def open(self, run_dir: Path, rank: int) -> None:
        """Open rank ``rank``'s file in ``run_dir`` and write the lines kept; when it cannot be
        written (a ``logs`` file, a rank's file that is a folder or leads outside the run, no
        permission, a full disk), say so once and keep no lines from now on."""
        path = run_dir / LOGS_DIR / f"rank-{rank}.log"
        try:
            problem = why_not_writable(run_dir, path)
            if problem is None:
                path.parent.mkdir(exist_ok=True)
                problem = why_not_writable(run_dir, path)  # a folder made by another rank meanwhile
            if problem is None:
                handler = logging.handlers.RotatingFileHandler(path, maxBytes=self.max_bytes,
                                                               backupCount=self.backups, encoding="utf-8")
        except OSError as error:
            problem = error.strerror or str(error)
        if problem is not None:
            with self.lock:
                self.refused = True
                self.early.clear()
            logger.warning("%s: %s cannot be written (%s); the run trains on without its log", self.writer, path, problem)
            return
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.handleError = lambda record: None  # type: ignore[method-assign]  # a full disk must not stop training
        with self.lock:
            self.handler, self.rank = handler, rank
            for line in self.early:
                self._emit(line.replace("[rank={rank}]", f"[rank={rank}]", 1))
            self.early.clear()

    def _emit(self, text: str) -> None:
        assert self.handler is not None
        self.handler.emit(logging.LogRecord(self.writer, logging.INFO, "", 0, text, None, None))

    def close(self) -> None:
        with self.lock:
            if self.handler is not None:
                self.handler.close()
                self.handler = None
