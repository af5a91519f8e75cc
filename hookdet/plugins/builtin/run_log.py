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

import logging
import sys
from pathlib import Path
from typing import IO, Any, List, Tuple

import pydantic

from hookdet.plugin import RankLogFile, hookimpl, options_for

logger = logging.getLogger("hookdet")

NAME = "run_log"


class RunLogPlugin:
    """Tees the process's output into its rank's log file in the run directory."""

    class Options(pydantic.BaseModel):
        """``plugin_config.run_log``."""

        model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
        max_bytes: int = pydantic.Field(10 * 2**20, ge=1024, description="bytes of one log file before it is rotated")
        backups: int = pydantic.Field(2, ge=0, description="rotated log files kept per rank (the oldest is dropped)")

    def __init__(self, options: Any = None) -> None:
        declared = options_for(RunLogPlugin, options, NAME)
        self.sink = RankLogFile(declared.max_bytes, declared.backups)
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


class _Tee:
    """A text stream that writes through to ``original`` and hands each finished line to the
    sink; everything else (``isatty``, ``fileno``, ``encoding``) is the original's."""

    def __init__(self, original: IO[str], name: str, sink: "RankLogFile") -> None:
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
