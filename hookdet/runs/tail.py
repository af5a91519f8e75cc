"""A JSON-lines file of a run (``metrics.jsonl``) read from where the last read stopped.

Each refresh reads only the bytes appended since, keeps a torn last line for the next read, and
starts again from the top when the file was replaced or cut (a resume drops a killed attempt's
reports). Nothing is locked and nothing is written. ``hookdet ui`` follows runs with it, and
``hookdet run``'s launcher the run it shows in its terminal view.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

#: Bytes read from a file per refresh at most: a huge file is caught up over several refreshes.
READ_CHUNK = 4 * 1024 * 1024


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

    def start_from(self, identity: Tuple[int, int], offset: int) -> None:
        """Begin at byte ``offset`` of the file whose ``(st_dev, st_ino)`` is ``identity``: what
        comes before is known already (a summary of it was read). Another file is read whole."""
        self.identity, self.offset, self.partial = identity, offset, b""

    def catch_up(self) -> bool:
        """Refresh until the end of the file (a big file is read a chunk per refresh); whether
        anything new came."""
        came = False
        while self.refresh():
            came = True
        return came

    def refresh(self) -> bool:
        """Read what was appended since the last refresh (at most :data:`READ_CHUNK`); whether
        anything new came."""
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
        text, cut = self.partial + chunk, (self.partial + chunk).rfind(b"\n") + 1
        text, self.partial = text[:cut], text[cut:]
        lines = [line for line in (text.split(b"\n") if self.only_lines_with is None
                                   else _lines_with(text, self.only_lines_with)) if line.strip()]
        for record in _parsed_all(lines):
            self.on_record(record)
        return True


def _parsed_all(lines: List[bytes]) -> Iterator[Dict[str, Any]]:
    """The objects of ``lines``: parsed as one JSON array (a hundred thousand lines a second
    faster than one call each), or line by line when one of them is no JSON object (a line torn
    by a kill is skipped, the others kept)."""
    try:
        records = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        records = None
    if records is not None and all(isinstance(record, dict) for record in records):
        yield from records
        return
    for line in lines:
        record = _parsed(line)
        if record is not None:
            yield record


def _lines_with(text: bytes, needle: bytes) -> Iterator[bytes]:
    """The lines of ``text`` that contain ``needle``, found without splitting the others out
    (a search page reads a trial's validations among ten times as many training reports)."""
    start = text.find(needle)
    while start >= 0:
        begin = text.rfind(b"\n", 0, start) + 1
        end = text.find(b"\n", start)
        end = len(text) if end < 0 else end
        yield text[begin:end]
        start = text.find(needle, end)


def _parsed(line: bytes) -> Optional[Dict[str, Any]]:
    try:
        record = json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is one
        return None
    return record if isinstance(record, dict) else None
