"""What a command prints: shown as it comes, and kept as its run's log.

A command ``hookdet run`` runs (an entrypoint that is not a trial class) may never call hookdet:
Determined's stage-0 tutorial script, a shell script. Its run still keeps its logs, as a
cluster kept every task's: the command's standard output and error pass through ``hookdet
run``, which shows them at once and writes each line as rank 0's log (``logs/rank-0.log``,
:mod:`hookdet.runs.logs`' format and rotation) when the command has ended, unless the command
wrote logs of its own (a script whose ``pytorch.init()`` or ``core.init()`` opened the run: its
``run_log`` plugin keeps every rank's lines, with their streams, from inside).

A terminal stays a terminal: where this process's stream is a terminal, the command's is a
pseudo-terminal of the same size (resized with it), so colours, progress bars and line
buffering are what they are without hookdet; else a pipe, as the command would have had. Where
both streams go to the same place (a terminal, ``2>&1``) the command gets one channel for both,
so its lines keep the order it wrote them in (logged as the stream ``output``). The log keeps
each line as last drawn (a ``\\r`` redraw replaces it), without terminal control sequences.

While the command runs, the lines go to the launch's own directory, not the run directory: that
is the command's until it ends (its ``pytorch.init()`` makes it). A command killed with ``hookdet
run`` (SIGKILL) leaves no log; ``hookdet logs --follow`` shows a command's log once it ended.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import sys
import termios
import threading
import tty
from pathlib import Path
from typing import IO, Any, List, Optional, Tuple

from hookdet.runs.files import LOGS_DIR
from hookdet.runs.logs import RankLogFile, log_files, why_not_writable

#: As the ``run_log`` plugin's defaults: bytes of one log file, older files kept.
MAX_BYTES, BACKUPS = 10 * 2**20, 2
#: A terminal's control sequences (colours, cursor moves), left out of the log.
_CONTROL = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
#: Bytes of a line kept before its end comes.
LONGEST_LINE = 65536
#: How long the output still arriving after the command ended is waited for, in seconds.
DRAIN_SECONDS = 5.0


class CommandOutput:
    """The command's two streams while it runs (``with CommandOutput(directory) as output:``).

    :meth:`child_ends` are what the command is given as its standard output and error; once it
    has started, :meth:`started` closes this process's copies; at the block's end what it printed
    has been shown and logged under ``directory``; :meth:`keep_in` moves the log into the run.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.log = RankLogFile(MAX_BYTES, BACKUPS, writer="hookdet run")
        if _same_file(sys.stdout, sys.stderr):  # one channel keeps the order the command wrote in
            self.streams = [_Stream("output", sys.stdout, self.log)]
        else:
            self.streams = [_Stream("stdout", sys.stdout, self.log), _Stream("stderr", sys.stderr, self.log)]
        self._previous_winch: Any = None

    def __enter__(self) -> "CommandOutput":
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log.open(self.directory, 0)
        for stream in self.streams:
            stream.open()
        if any(stream.terminal for stream in self.streams) and threading.current_thread() is threading.main_thread():
            self._previous_winch = signal.signal(signal.SIGWINCH, self._resized)
        return self

    def child_ends(self) -> Tuple[int, int]:
        """The file descriptors of the command's standard output and error."""
        out, err = self.streams[0], self.streams[-1]
        assert out.child is not None and err.child is not None, "inside the with block"
        return out.child, err.child

    def started(self) -> None:
        """The command has its ends: this process's copies are closed, so the command's end is
        seen when it (and whatever it started) has closed them."""
        for stream in self.streams:
            stream.close_child_end()

    def __exit__(self, *exc: Any) -> None:
        if self._previous_winch is not None:
            signal.signal(signal.SIGWINCH, self._previous_winch)
        for stream in self.streams:
            stream.close_child_end()
        for stream in self.streams:
            stream.finish()
        self.log.close()

    def keep_in(self, run_dir: Path) -> bool:
        """Move the command's log into ``run_dir`` unless the run has logs of its own (or its
        ``logs`` folder cannot be written, which one warning says); whether it moved."""
        kept = log_files(self.directory).get(0, [])
        run_dir = Path(run_dir)
        if not kept or not run_dir.is_dir() or log_files(run_dir):
            return False
        target = run_dir / LOGS_DIR
        problem = why_not_writable(run_dir, target / kept[-1].name)
        if problem is not None:
            print(f"hookdet: warning: the command's log is not kept: {target} cannot be written ({problem})",
                  file=sys.stderr, flush=True)
            return False
        target.mkdir(exist_ok=True)
        for path in kept:
            shutil.move(str(path), str(target / path.name))
        return True

    def _resized(self, signum: int, frame: Any) -> None:
        for stream in self.streams:
            stream.copy_size()


class _Stream:
    """One of the command's streams: a pseudo-terminal where ``shown`` is a terminal, else a
    pipe, read in a thread that shows and logs what comes."""

    def __init__(self, name: str, shown: IO[str], log: RankLogFile) -> None:
        self.name, self.shown, self.log = name, shown, log
        self.terminal = _is_terminal(shown)
        self.child: Optional[int] = None
        self.ours: Optional[int] = None
        self.thread: Optional[threading.Thread] = None
        self.partial = b""

    def open(self) -> None:
        if self.terminal:
            self.ours, self.child = os.openpty()
            tty.setraw(self.child)  # bytes pass unchanged: this terminal translates them
            self.copy_size()
        else:
            self.ours, self.child = os.pipe()
        self.thread = threading.Thread(target=self._pump, name=f"hookdet-command-{self.name}", daemon=True)
        self.thread.start()

    def copy_size(self) -> None:
        """This terminal's size on the command's pseudo-terminal."""
        if self.terminal and self.ours is not None:
            try:
                size = fcntl.ioctl(self.shown.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
                fcntl.ioctl(self.ours, termios.TIOCSWINSZ, size)
            except OSError:
                pass

    def close_child_end(self) -> None:
        if self.child is not None:
            os.close(self.child)
            self.child = None

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join(DRAIN_SECONDS)
        if self.partial:
            self._log_lines(b"\n")

    def _pump(self) -> None:
        assert self.ours is not None
        while True:
            try:
                data = os.read(self.ours, 65536)
            except OSError:  # EIO: a pseudo-terminal whose every writer has closed it
                data = b""
            if not data:
                break
            self._show(data)
            self._log_lines(data)
        os.close(self.ours)
        self.ours = None

    def _show(self, data: bytes) -> None:
        try:
            buffer = getattr(self.shown, "buffer", None)
            self.shown.flush()
            if buffer is not None:
                buffer.write(data)
                buffer.flush()
            else:
                self.shown.write(data.decode(errors="replace"))
                self.shown.flush()
        except (OSError, ValueError):  # this terminal is gone: the log still keeps the lines
            pass

    def _log_lines(self, data: bytes) -> None:
        lines: List[bytes] = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > LONGEST_LINE:  # redrawn for ever, never ended: keep its last drawing
            self.partial = self.partial.rsplit(b"\r", 1)[-1][-LONGEST_LINE:]
        for line in lines:
            drawn = _CONTROL.sub(b"", line.rstrip(b"\r")).rsplit(b"\r", 1)[-1]
            self.log.add(self.name, drawn.decode(errors="replace"))


def _same_file(one: IO[str], other: IO[str]) -> bool:
    """Whether two streams write to the same file (a terminal, ``2>&1``)."""
    try:
        first, second = os.fstat(one.fileno()), os.fstat(other.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
