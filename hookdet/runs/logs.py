"""Reading a run's logs, as ``det trial logs`` showed a trial's: ``hookdet logs RUN [--follow]
[--rank N]``.

The ``run_log`` plugin writes them, one rotating file per rank (``logs/rank-<N>.log``, then
``.1``, ``.2``, oldest last), every line stamped ``[<ISO time>] [rank=<N>] [<stream>]``. Reading
merges the ranks' lines by time. Following reads each file from where it stopped (never a whole
file again), keeps reading a file that was rotated away until its end before taking the new one,
and ends when the run has ended and nothing more came. Nothing is locked or written.
"""
from __future__ import annotations

import heapq
import os
import re
import time
from pathlib import Path
from typing import IO, Dict, Iterator, List, Optional, Tuple

from hookdet.runs.files import LOGS_DIR
from hookdet.runs.record import read_record

#: How often ``--follow`` looks for new lines, in seconds.
FOLLOW_EVERY_S = 0.25
_LOG_NAME = re.compile(r"^rank-(\d+)\.log(?:\.(\d+))?$")


def log_files(run_dir: Path, rank: Optional[int] = None) -> Dict[int, List[Path]]:
    """Each rank's log files, oldest first (``rank-0.log.2``, ``.1``, then ``rank-0.log``)."""
    found: Dict[int, List[Tuple[int, Path]]] = {}
    directory = Path(run_dir) / LOGS_DIR
    for path in directory.iterdir() if directory.is_dir() else []:
        match = _LOG_NAME.match(path.name)
        if match and (rank is None or int(match.group(1)) == rank):
            found.setdefault(int(match.group(1)), []).append((int(match.group(2) or 0), path))
    return {number: [path for _, path in sorted(paths, reverse=True)] for number, paths in sorted(found.items())}


def read_lines(run_dir: Path, rank: Optional[int] = None) -> Iterator[str]:
    """Every line the run's ranks logged, in time order (each file is; the ranks are merged)."""
    per_rank = [_lines_of(paths) for paths in log_files(run_dir, rank).values()]
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
