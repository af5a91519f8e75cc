"""Reading what a run writes, incrementally and in bounded memory.

:class:`JsonLinesTail` reads a JSON-lines file (``metrics.jsonl``) from where it stopped: each
refresh reads only the bytes appended since, keeps a torn last line for the next read, and
starts again from the top when the file was replaced or cut (a resume drops a killed attempt's
reports). Nothing is locked and nothing is written.

:class:`BoundedSeries` keeps a metric's points for a chart in at most ``2 * limit`` points
whatever the file's length: when full, it keeps every other point and from then on takes one
point in two (and so on), so a curve of 5,000 or 5,000,000 reports costs the same and still
spans the whole run. Each series counts its *epoch*: a client that holds points of an older
epoch gets them all again, otherwise only the new ones.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

#: Points a chart's series keeps at most (twice this, just before it thins).
SERIES_LIMIT = 1000
#: Bytes read from a file per refresh at most: a huge file is caught up over several refreshes.
READ_CHUNK = 4 * 1024 * 1024


class BoundedSeries:
    """``(x, y)`` points in order, thinned to stay within ``2 * limit`` (see the module)."""

    def __init__(self, limit: int = SERIES_LIMIT) -> None:
        self.limit = limit
        self.xs: List[float] = []
        self.ys: List[float] = []
        self.epoch = 0
        self._stride = 1
        self._seen = 0
        self._last: Optional[Tuple[float, float]] = None

    def add(self, x: float, y: float) -> None:
        """Keep the point, or (thinned) only remember it as the latest."""
        self._seen += 1
        self._last = (x, y)
        if (self._seen - 1) % self._stride:
            return
        self.xs.append(x)
        self.ys.append(y)
        if len(self.xs) >= 2 * self.limit:
            self.xs, self.ys = self.xs[::2], self.ys[::2]
            self._stride *= 2
            self.epoch += 1

    @property
    def kept(self) -> int:
        """How many points are kept."""
        return len(self.xs)

    @property
    def tail(self) -> Optional[Tuple[float, float]]:
        """The latest point when thinning did not keep it (a chart shows it after the kept ones)."""
        if self._last is None or (self.xs and self.xs[-1] == self._last[0]):
            return None
        return self._last


class JsonLinesTail:
    """A JSON-lines file read from where it stopped; ``on_record`` gets each new object, and
    ``on_reset`` is called when the file was replaced or cut (the caller forgets what it had)."""

    def __init__(self, path: Path, on_record: Callable[[Dict[str, Any]], None],
                 on_reset: Callable[[], None], only_lines_with: Optional[bytes] = None) -> None:
        """``only_lines_with``: parse only the lines that contain these bytes (the others are
        skipped unread, which makes a reader of validations alone many times faster)."""
        self.path = Path(path)
        self.only_lines_with = only_lines_with
        self.on_record = on_record
        self.on_reset = on_reset
        self.offset = 0
        self.partial = b""
        self.identity: Optional[Tuple[int, int]] = None

    def refresh(self) -> bool:
        """Read what was appended since the last refresh; whether anything new came."""
        try:
            status = os.stat(self.path)
        except OSError:
            return False
        identity = (status.st_dev, status.st_ino)
        if identity != self.identity or status.st_size < self.offset:
            if self.identity is not None:
                self.on_reset()
            self.identity, self.offset, self.partial = identity, 0, b""
        if status.st_size == self.offset:
            return False
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read(READ_CHUNK)
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        if self.only_lines_with is not None:
            lines = [line for line in lines if self.only_lines_with in line]
        for line in lines:
            record = _parsed(line)
            if record is not None:
                self.on_record(record)
        return True


def _parsed(line: bytes) -> Optional[Dict[str, Any]]:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
