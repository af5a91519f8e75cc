"""The live view of a run of several processes, drawn by ``hookdet run``'s launcher in the
terminal the user started it from.

Every rank's output passes through the launcher, so only the launcher can keep a view on the
screen that the ranks' lines do not break. It draws the chief's view as a single process draws
its own (:class:`hookdet.metrics.live_view.LiveView`: the epoch's bar of the chief's batches with
rate and ETA, the latest training and validation metrics), and under it a row per rank of this
machine with that rank's batch: the batches come from the beats each rank writes every second
(:mod:`hookdet.distributed.rank_watch`), the metrics from the run's ``metrics.jsonl`` read as it
grows. The ranks' lines print above the view. The ranks are told (:data:`LAUNCHER_DRAWS_ENV`), so
the chief draws nothing and prints no progress lines of its own. Off a terminal nothing changes:
the chief prints its progress lines, as it does alone.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import IO, Any, Dict, List, Optional

from rich.text import Text

from hookdet.distributed.rank_watch import read_beats
from hookdet.metrics.live_view import LAUNCHER_DRAWS_ENV, LiveView, bar
from hookdet.runs.files import METRICS_FILE
from hookdet.runs.tail import JsonLinesTail

__all__ = ["LAUNCHER_DRAWS_ENV", "RanksView"]

#: The widest bar of a rank's row.
RANK_BAR_WIDTH = 30
#: Seconds a reading of the beats serves the redraws (the ranks beat once a second).
BEATS_READ_EVERY_S = 0.5


class RanksView:
    """The chief's view and a row per rank, fed from the ranks' beats and the run's reports."""

    def __init__(self, status_dir: Path, run_dir: Optional[Path], searcher_metric: Optional[str], stream: IO[str]) -> None:
        self.status_dir = Path(status_dir)
        self._beats: Dict[int, Dict[str, Any]] = {}
        self._beats_read_at = 0.0
        self._training_shown = False
        self.view = LiveView(stream, batches_trained=self._chief_batches, validation_batches=lambda: 0,
                             searcher_metric=searcher_metric, extra_rows=self._rank_rows)
        self._reports = None if run_dir is None else JsonLinesTail(Path(run_dir) / METRICS_FILE, self._report, lambda: None)

    def open(self) -> None:
        """Start drawing; lines written to stderr from now on print above the view."""
        self.view.open()

    def close(self) -> None:
        """Draw the last frame (every rank's last beat) and leave it on the screen."""
        self._beats_read_at = 0.0
        self.poll()
        self.view.close()

    def poll(self) -> None:
        """Read the ranks' beats and the run's new reports (the launcher's watch calls it)."""
        chief = self._chief()
        if not self._training_shown and chief.get("total"):
            self._training_shown = True
            self.view.training_started(int(chief["total"]), int(chief.get("epoch_length") or 0))
        if self._reports is not None:
            self._reports.catch_up()

    def _fresh_beats(self) -> Dict[int, Dict[str, Any]]:
        """The ranks' latest beats, finished ranks' last ones included (read again at most every
        :data:`BEATS_READ_EVERY_S`)."""
        if time.monotonic() - self._beats_read_at > BEATS_READ_EVERY_S:
            self._beats = read_beats(self.status_dir, finished_too=True) or self._beats
            self._beats_read_at = time.monotonic()
        return self._beats

    def _chief(self) -> Dict[str, Any]:
        """The beat of the lowest rank here (the chief's, on the machine that has it)."""
        beats = self._fresh_beats()
        return beats[min(beats)] if beats else {}

    def _chief_batches(self) -> int:
        return int(self._chief().get("batch") or 0)

    def _report(self, report: Dict[str, Any]) -> None:
        metrics, steps = report.get("metrics"), report.get("steps_completed")
        if isinstance(metrics, dict) and isinstance(steps, int):
            self.view.show_metrics("validation" if report.get("group") == "validation" else "training", steps, metrics)

    def _rank_rows(self) -> List[Text]:
        """``    rank 1 ━━━━━━━━━╸━━━━━━━━━━━  118/400 batches``, one per rank, lowest first."""
        rows = []
        for rank, beat in sorted(self._fresh_beats().items()):
            done, total = int(beat.get("batch") or 0), beat.get("total")
            row = Text.assemble(f"{'rank ' + str(rank):>10}  ", bar(done, total, RANK_BAR_WIDTH),
                                f" {done}/{total or '?'} batches")
            row.no_wrap, row.overflow = True, "ellipsis"
            rows.append(row)
        return rows
