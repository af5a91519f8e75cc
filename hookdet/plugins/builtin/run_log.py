"""Every run keeps what its processes printed, as Determined kept each trial's logs.

Each process of a run (each rank) writes ``<run dir>/logs/rank-<N>.log``: every line its Python
code printed to stdout or stderr, and every log record, stamped with the time and marked with
the rank and the stream::

    [2026-11-27T10:40:01.123456+00:00] [rank=0] [stderr] 2026-... hookdet INFO training: batch 45/450 ...

A file is bounded: past ``plugin_config.run_log.max_bytes`` (default 10 MiB) it is rotated,
keeping ``backups`` older files (default 2, ``rank-0.log.1``, ``.2``; the oldest dropped), with
the standard library's ``RotatingFileHandler``. A resumed run appends to the same files.
``hookdet logs RUN [--follow] [--rank N]`` prints them (:mod:`hookdet.runs.logs`).

The streams are wrapped at the Python level (``sys.stdout``/``sys.stderr``, and the handlers of
the root logger that wrote to them), so a terminal stays a terminal: the live progress view's
redraws (terminal control sequences) are shown and not logged. Output of C code straight to the
file descriptors (a warning of torch's C++ side) is not captured. Lines printed before the run
directory is known (imports, the trial's ``__init__``) are kept in memory and written when it is.

A log never stops a run: when the file cannot be written (``logs`` is a file, ``rank-0.log`` a
folder, no permission, a full disk) one warning says so and the run trains on without it. It is
written only inside the run: a ``logs`` folder or a rank's file that leads outside the run
directory (a symlink) is not followed, and is reported the same way.
"""
from __future__ import annotations

import datetime
import logging
import logging.handlers
import sys
import threading
from pathlib import Path
from typing import IO, Any, List, Optional, Tuple

import pydantic

from hookdet.plugin import LOGS_DIR, hookimpl, options_for

logger = logging.getLogger("hookdet")

NAME = "run_log"
#: Lines kept in memory before the run directory is known (the rest are dropped).
EARLY_LINES = 10_000


class RunLogPlugin:
    """Tees the process's output into its rank's log file in the run directory."""

    class Options(pydantic.BaseModel):
        """``plugin_config.run_log``."""

        model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
        max_bytes: int = pydantic.Field(10 * 2**20, ge=1024, description="bytes of one log file before it is rotated")
        backups: int = pydantic.Field(2, ge=0, description="rotated log files kept per rank (the oldest is dropped)")

    def __init__(self, options: Any = None) -> None:
        declared = options_for(RunLogPlugin, options, NAME)
        self.sink = _Sink(declared.max_bytes, declared.backups)
        self._restore: List[Tuple[Any, str, Any]] = []

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Start capturing: lines are kept until the run directory and rank are known."""
        for name in ("stdout", "stderr"):
            original = getattr(sys, name)
            tee = _Tee(original, name, self.sink)
            self._restore.append((sys, name, original))
            setattr(sys, name, tee)
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is original:
                    self._restore.append((handler, "stream", original))
                    handler.setStream(tee)

    @hookimpl(tryfirst=True)
    def on_trial_startup(self, run: Any) -> None:
        """Open this rank's file (where the run directory is on this machine) and write what was kept."""
        if run.run_dir is not None and Path(run.run_dir).is_dir():
            self.sink.open(Path(run.run_dir), run.distributed.rank)

    @hookimpl(trylast=True)
    def hookdet_unconfigure(self, run: Any) -> None:
        """Put the streams back and close the file."""
        for owner, attribute, original in reversed(self._restore):
            if attribute == "stream":
                owner.setStream(original)
            else:
                setattr(owner, attribute, original)
        self._restore.clear()
        self.sink.close()


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


class _Tee:
    """A text stream that writes through to ``original`` and hands each finished line to the
    sink; everything else (``isatty``, ``fileno``, ``encoding``) is the original's."""

    def __init__(self, original: IO[str], name: str, sink: "_Sink") -> None:
        self._original, self._name, self._sink = original, name, sink
        self._partial = ""

    def write(self, text: str) -> int:
        written = self._original.write(text)
        if "\x1b[" in text:  # a terminal redraw (the live view): on the screen, not in the log
            return written
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._sink.add(self._name, line.rsplit("\r", 1)[-1])
        return written

    def flush(self) -> None:
        self._original.flush()

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._original, attribute)


class _Sink:
    """Stamps lines and writes them to a rotating file, kept in memory until it is open."""

    def __init__(self, max_bytes: int, backups: int) -> None:
        self.max_bytes, self.backups = max_bytes, backups
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
        written (see the module's docstring), say so once and keep no lines from now on."""
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
            logger.warning("run_log: %s cannot be written (%s); the run trains on without its log", path, problem)
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
        self.handler.emit(logging.LogRecord(NAME, logging.INFO, "", 0, text, None, None))

    def close(self) -> None:
        with self.lock:
            if self.handler is not None:
                self.handler.close()
                self.handler = None
