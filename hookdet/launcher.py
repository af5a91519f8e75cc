"""Process hygiene for ``hookdet run``'s multi-process launch: no orphans, no launcher noise.

- **No orphans.** torchrun starts each rank in a session of its own, and ``hookdet run`` starts
  torchrun in one too, so no process-group signal reaches them all. Instead each link of the
  chain asks the kernel for a *parent-death signal* (Linux ``prctl(PR_SET_PDEATHSIG)``): torchrun
  gets SIGKILL when ``hookdet run`` dies, and each rank gets SIGKILL when torchrun dies. A
  ``kill -9`` of ``hookdet run`` therefore ends torchrun and every rank within moments. A rank
  that finds its parent already gone (the race before the request) exits at once.
- **One voice.** torchrun's own log lines and its tracebacks (``ChildFailedError`` when a rank
  failed, ``SignalException`` when it was told to stop) say nothing the ranks' statuses do not,
  so :func:`filter_launcher_stderr` drops them and passes every other line through unchanged;
  the launcher then prints one line per failed rank from what the rank recorded.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Optional

logger = logging.getLogger("hookdet")

PR_SET_PDEATHSIG = 1

#: The signals a launcher passes on to what it started instead of stopping (SIGHUP as SIGTERM).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_TORCHRUN_LOG = re.compile(r"^\[?[WEIF]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ .*torch/distributed/")
_TORCHRUN_EXCEPTIONS = ("ChildFailedError", "SignalException")


def set_parent_death_signal(signum: int = signal.SIGKILL, expected_parent: Optional[int] = None) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux only).

    If the parent is already gone (``os.getppid()`` is no longer ``expected_parent``, or is 1),
    the signal is sent now. Returns whether the request could be made.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    parent = os.getppid()
    if parent == 1 or (expected_parent is not None and parent != expected_parent):
        os.kill(os.getpid(), signum)
    return True


def child_setup_for(launcher_pid: int):  # type: ignore[no-untyped-def]
    """A ``preexec_fn`` for the launcher's child: die with the launcher."""

    def setup() -> None:
        set_parent_death_signal(signal.SIGKILL, expected_parent=launcher_pid)

    return setup


def filter_launcher_stderr(lines: Iterable[str]) -> Iterator[str]:
    """The lines of torchrun's stderr (its ranks' included) without torchrun's own noise."""
    pending: List[str] = []
    in_banner = False
    for line in lines:
        stripped = line.rstrip("\n")
        if in_banner:
            if stripped.startswith("=" * 20):
                in_banner = False
            continue
        if stripped.startswith("=" * 20):
            in_banner = True
            continue
        if _TORCHRUN_LOG.match(stripped):
            continue
        if pending:
            pending.append(line)
            if stripped and not stripped[0].isspace() and not stripped.startswith("Traceback"):
                # The exception line that ends a traceback: drop torchrun's own, pass others on.
                if not any(name in stripped for name in _TORCHRUN_EXCEPTIONS):
                    yield from pending
                pending = []
            continue
        if stripped.startswith("Traceback (most recent call last):"):
            pending = [line]
            continue
        yield line
    yield from pending


def pump_filtered(source: IO[bytes], sink: IO[str]) -> threading.Thread:
    """Copy ``source`` (torchrun's stderr) to ``sink`` through the filter, in a thread."""

    def pump() -> None:
        lines = (raw.decode(errors="replace") for raw in iter(source.readline, b""))
        for line in filter_launcher_stderr(lines):
            sink.write(line)
            sink.flush()
        source.close()

    thread = threading.Thread(target=pump, name="hookdet-launcher-stderr", daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------------------------------------
# What each rank says, said once
# ---------------------------------------------------------------------------------------------


def record_rank_message(status_dir: str, rank: int, message: str) -> None:
    """A rank under the launcher leaves its one-line error for the launcher to print."""
    path = Path(status_dir) / f"rank-{rank}.message"
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(message, encoding="utf-8")
    partial.replace(path)


def failure_lines(status_dir: Path, statuses: Dict[int, int], local_ranks: int) -> List[str]:
    """One line per distinct failure: the ranks that said it, and what they said; a rank that
    ended without a status is named as having died."""
    by_message: Dict[str, List[int]] = {}
    for path in sorted(Path(status_dir).glob("rank-*.message")):
        rank = path.name[len("rank-"):-len(".message")]
        if rank.isdigit():
            by_message.setdefault(path.read_text(encoding="utf-8").strip(), []).append(int(rank))
    lines = []
    for message, ranks in by_message.items():
        who = "rank" if len(ranks) == 1 else "ranks"
        lines.append(f"hookdet: error: {who} {', '.join(map(str, sorted(ranks)))}: {message}")
    silent = [rank for rank in range(local_ranks) if rank not in statuses]
    if silent and statuses:
        who = "rank" if len(silent) == 1 else "ranks"
        lines.append(
            f"hookdet: error: {who} {', '.join(map(str, silent))} ended without a status "
            "(killed by a signal, or out of memory); the other ranks were stopped"
        )
    return lines


@contextlib.contextmanager
def stop_signals_passed_on(send: Callable[[int], None], to_whom: str) -> Iterator[None]:
    """While the block runs, SIGTERM, SIGINT and SIGHUP received here go to ``send`` (SIGHUP as
    SIGTERM) instead of stopping this process: a launcher hands them to what it started, which
    checkpoints and stops. Installed on the main thread only; the previous handlers come back."""

    def pass_on(signum: int, frame: Any) -> None:
        logger.warning("received %s: passing it on to %s", signal.Signals(signum).name, to_whom)
        send(signal.SIGTERM if signum == signal.SIGHUP else signum)

    previous: Dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, pass_on)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
