"""Problems in an experiment file, and how they are worded: :class:`ConfigError` (file, line,
field), the line index that finds a field's line, and the small helpers every message uses.

Validators raise :class:`FieldProblem` for a spot below the field they check; the reader turns it
into a :class:`ConfigError` naming the whole dotted path and its line.
"""
from __future__ import annotations

import difflib
from typing import Any, Dict, List, Optional, Tuple

from hookdet.errors import HookdetError

FieldPath = Tuple[str, ...]


class ConfigError(HookdetError):
    """A bad experiment file or dict; the message says where (file:line) and what.

    ``source`` is the file (or ``"<dict>"``), ``line`` and ``column`` are 1-based when known,
    ``field`` is the dotted field path when the problem belongs to one. When one reading found
    several problems, this is the first in file order and :attr:`others` holds the rest; the
    message lists them all, one per line.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str,
        line: Optional[int] = None,
        column: Optional[int] = None,
        field: Optional[str] = None,
    ) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.column = column
        self.field = field
        self.others: List["ConfigError"] = []
        location = source
        if line is not None:
            location += f":{line}" + (f":{column}" if column is not None else "")
        self.located = f"{location}: {message}"
        super().__init__(self.located)

    def __str__(self) -> str:
        return "\n  ".join([self.located] + [other.located for other in self.others])


def all_at_once(problems: List[ConfigError]) -> ConfigError:
    """One error for every problem of a reading, the first in file order first."""
    ordered = sorted(problems, key=lambda problem: problem.line or 0)
    first = ordered[0]
    first.others = ordered[1:]
    return first


class FieldProblem(ValueError):
    """Raised by validators for a problem below the field they validate, so the error can
    name (and find the line of) e.g. ``hyperparameters.optimizer.lr`` rather than just
    ``hyperparameters``."""

    def __init__(self, subpath: FieldPath, message: str) -> None:
        super().__init__(message)
        self.subpath = subpath
        self.message = message


def dotted(path: FieldPath) -> str:
    return ".".join(str(part) for part in path)


def as_written(value: Any) -> str:
    """A value as the user wrote it in YAML, shortened for an error message."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    text = f"'{value}'" if isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def did_you_mean(word: str, candidates: List[str]) -> str:
    matches = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean '{matches[0]}'?" if matches else ""


class LineIndex:
    """Where each field stands in the YAML file, and which fields came from overrides instead."""

    def __init__(self, lines: Optional[Dict[FieldPath, int]] = None) -> None:
        self.lines: Dict[FieldPath, int] = lines or {}
        self.overridden: set = set()

    def line_of(self, path: FieldPath) -> Optional[int]:
        """The line of ``path``, else of its closest ancestor in the file; None for fields set
        by overrides (their file line would point at a value that is not the one in use)."""
        for end in range(len(path), 0, -1):
            prefix = path[:end]
            if prefix in self.overridden:
                return None
            if prefix in self.lines:
                return self.lines[prefix]
        return None

    def came_from_overrides(self, path: FieldPath) -> bool:
        return any(path[:end] in self.overridden for end in range(len(path), 0, -1))


class Reporter:
    """Builds the one :class:`ConfigError` for a problem at a field path."""

    def __init__(self, source: str, index: LineIndex) -> None:
        self.source = source
        self.index = index

    def error(self, path: FieldPath, message: str) -> ConfigError:
        if path and self.index.came_from_overrides(path):
            message += " (set by overrides)"
        return ConfigError(
            message,
            source=self.source,
            line=self.index.line_of(path),
            field=dotted(path) if path else None,
        )
