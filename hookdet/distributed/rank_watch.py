"""Naming the rank that stops answering in a run of several processes.

A rank that stops (SIGSTOP, swapped out) or hangs (a filesystem read that never returns) makes
every other rank wait in its next collective, silently, until the process group's collective
timeout (``plugin_config.ddp.timeout_seconds``; torch's default is 30 minutes). So each rank
that ``hookdet run``'s launcher started writes a small *beat* every :data:`BEAT_SECONDS` into the
launcher's rank-status directory, from a thread of its own: the batches it has trained (and of
how many, for the launcher's terminal view: :mod:`hookdet.distributed.ranks_view`) and where its
main thread is. The launcher on each machine reads its ranks' beats and, after
``silent_after`` seconds (``plugin_config.ddp.silent_rank_seconds``, default
:data:`SILENT_AFTER_SECONDS`), says once:

- ``rank 1 has not answered for 64 s (last at batch 12)``: its beats stopped, so the whole
  process is stopped or gone;
- ``no rank has finished a batch for 64 s; rank 0 at batch 12 in graph.py:829
  (_engine_run_backward), rank 1 at batch 12 in data.py:40 (read_shard)``: every rank is alive
  but none moves, and where each stands tells the one that waits on something else from those
  that wait for it.

Nothing here runs in the per-batch path: the beat thread reads the loop's batch counter, a
plain integer, and the main thread's frame, as a sampling profiler does.
"""
from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Set

from hookdet.launch.outcome import rank_path

#: Seconds between two beats of a rank.
BEAT_SECONDS = 1.0
#: Default seconds of silence (or of no batch finished anywhere) before it is said.
SILENT_AFTER_SECONDS = 60.0


def beat_path(status_dir: Path, rank: int) -> Path:
    return Path(status_dir) / f"rank-{rank}.beat"


def where_thread_is(thread_id: int) -> str:
    """``file:line (function)`` of the innermost Python frame of thread ``thread_id``."""
    frame = sys._current_frames().get(thread_id)  # noqa: SLF001 - the standard library's only view of another thread's stack
    if frame is None:
        return "unknown"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} ({frame.f_code.co_name})"


class Beat:
    """A rank's beat thread: writes ``{time, batch, where}`` and ``extras()`` to its beat file
    until stopped."""

    def __init__(self, status_dir: Path, rank: int, batches: Callable[[], int],
                 extras: Callable[[], Dict[str, Any]] = dict) -> None:
        self.path = beat_path(status_dir, rank)
        self.batches = batches
        self.extras = extras
        self.main_thread = threading.main_thread().ident or 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="hookdet-rank-beat", daemon=True)

    def __enter__(self) -> "Beat":
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stopped.set()
        self.thread.join(timeout=BEAT_SECONDS * 2)
        self._write()  # the last word: where training ended

    def _beat(self) -> None:
        while not self.stopped.is_set() and self._write():
            self.stopped.wait(BEAT_SECONDS)

    def _write(self) -> bool:
        """Write one beat; False when the launcher's directory is gone (it ended, and so will
        this rank)."""
        partial = self.path.with_name(f".{self.path.name}.partial.{threading.get_ident()}")
        beat = {**self.extras(), "time": time.time(), "batch": self.batches(), "where": where_thread_is(self.main_thread)}
        try:
            partial.write_text(json.dumps(beat))
            partial.replace(self.path)
        except OSError:
            return False
        return True


def beating(status_dir: Optional[str], rank: Optional[int], batches: Callable[[], int],
            extras: Callable[[], Dict[str, Any]] = dict) -> Any:
    """A :class:`Beat` for this rank under ``hookdet run``'s launcher, else a context that does
    nothing."""
    if not status_dir or rank is None:
        return contextlib.nullcontext()
    return Beat(Path(status_dir), rank, batches, extras)


def read_beats(status_dir: Path, finished_too: bool = False) -> Dict[int, Dict[str, Any]]:
    """The latest beat of every rank still running (one that recorded its status is done), or
    of every rank with ``finished_too``."""
    found = {}
    for path in Path(status_dir).glob("rank-*.beat"):
        rank = path.name[len("rank-"):-len(".beat")]
        if rank.isdigit() and (finished_too or not rank_path(Path(status_dir), int(rank)).exists()):
            try:
                found[int(rank)] = json.loads(path.read_text())
            except (OSError, ValueError):  # being replaced right now: the next look reads it
                continue
    return found


class SilenceWatch:
    """The launcher's side: reads the beats of the ranks on this machine and says, once each,
    which rank went silent and when no rank moved (see the module's docstring)."""

    def __init__(self, status_dir: Path, silent_after: float, say: Callable[[str], None]) -> None:
        self.status_dir = Path(status_dir)
        self.silent_after = silent_after
        self.say = say
        self.silent_said: Set[int] = set()
        self.moved_at = time.time()
        self.furthest = -1
        self.stall_said = False

    def check(self) -> None:
        beats, now = read_beats(self.status_dir), time.time()
        for rank, beat in sorted(beats.items()):
            silent_for = now - beat["time"]
            if silent_for > self.silent_after and rank not in self.silent_said:
                self.silent_said.add(rank)
                self.say(f"hookdet: warning: rank {rank} has not answered for {silent_for:.0f} s (last at "
                         f"batch {beat['batch']}): stopped, or gone; the other ranks wait for it in their "
                         "collectives")
        furthest = max((beat["batch"] for beat in beats.values()), default=-1)
        if furthest != self.furthest:
            self.furthest, self.moved_at, self.stall_said = furthest, now, False
            return
        alive = [rank for rank in beats if rank not in self.silent_said]
        if beats and alive and not self.stall_said and now - self.moved_at > self.silent_after:
            self.stall_said = True
            where = ", ".join(f"rank {rank} at batch {beats[rank]['batch']} in {beats[rank]['where']}"
                              for rank in sorted(beats))
            self.say(f"hookdet: warning: no rank has finished a batch for {now - self.moved_at:.0f} s; {where}")


def silent_after_of(config: Any) -> float:
    """``plugin_config.ddp.silent_rank_seconds`` of the experiment ``config`` (checked by the
    ``ddp`` plugin, which declares it), else the default."""
    value = ((getattr(config, "plugin_config", None) or {}).get("ddp") or {}).get("silent_rank_seconds")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 \
        else SILENT_AFTER_SECONDS
