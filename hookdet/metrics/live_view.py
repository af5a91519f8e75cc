"""The terminal view of a training run, drawn with rich: a few lines that redraw in place.

::

    epoch 2/5  ━━━━━━━━━━━━━━━━━━━━━╺━━━━━━━━━━━━━━━━━━ 59/100 batches  59% 7.83 batch/s  ETA 0:00:05 loss=0.1791
    validation ━━━━━━━━━━━━━━━━━━━━━━━━━╸━━━━━━━━━━━━━━ 12/25 batches  48%
      training  @ batch 50  loss=0.1807  g_loss=1.066  d_loss=0.3365
    validation  @ batch 40  validation_loss=0.1234  accuracy=0.972

The bar line ends with the latest batch's loss; below it each metric group of the latest report
has its own labelled row, the searcher metric first in validation; a long list of metrics wraps
onto more lines of its row instead of squeezing the bar. Log messages (checkpoints, warnings)
print above the view as ordinary lines.

The view never asks the training loop for anything per batch: rich's own refresh thread redraws
it a few times a second (:data:`REFRESHES_PER_SECOND`), reading what already lives on the host —
the loop's ``batches_trained``, a validation batch count, the reported metrics (plain numbers by
then) — through the callables it was given. The latest batch's loss comes from the run's
``workload_metrics`` list without a device synchronisation (see :class:`LatestBatchValue`).

The frame is assembled as plain :class:`rich.text.Text` lines rather than with rich's
``Progress`` table, because a redraw holds the interpreter lock while the training thread waits
for it: the table layout took 1.5–2 ms a redraw, these lines take about a third of that, and at
:data:`REFRESHES_PER_SECOND` the view costs the loop well under 0.1 % of its time.
"""
from __future__ import annotations

import collections
import logging
import math
import numbers
import time
from typing import IO, Any, Callable, Deque, Dict, List, Optional, Tuple

import torch
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

#: Redraws per second: several a second to watch a fast run, at least one a batch once batches
#: take longer than a quarter of a second; each redraw runs on rich's thread, not the loop's.
REFRESHES_PER_SECOND = 4
#: Seconds of recent progress the rate and ETA are estimated from.
RATE_WINDOW_S = 10.0
#: The widest bar, in characters (narrower in a narrow terminal, never under 10).
BAR_WIDTH = 40
#: Set (to 1) in the environment of ranks whose launcher draws the run's view in its terminal
#: (:mod:`hookdet.distributed.ranks_view`): the chief then draws and prints no progress itself.
LAUNCHER_DRAWS_ENV = "HOOKDET_LAUNCHER_DRAWS_PROGRESS"


def format_number(value: Any) -> Optional[str]:
    """A metric value as shown: integers whole, other numbers to 4 significant digits; None
    for what is not a number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return str(value) if isinstance(value, numbers.Integral) else f"{value:.4g}"


def ordered_metrics(metrics: Dict[str, Any], first: Optional[str] = None) -> List[str]:
    """``name=value`` for each number in ``metrics``, the metric ``first`` (the searcher's) first."""
    names = sorted(metrics, key=lambda name: name != first)
    shown = []
    for name in names:
        text = format_number(metrics[name])
        if text is not None:
            shown.append(f"{name}={text}")
    return shown


class LatestBatchValue:
    """The latest batch's loss (or first metric) as ``loss=0.1234``, read without a device sync:
    a value on the CPU is read at once; one on a CUDA device is copied to pinned host memory
    asynchronously, behind the work already queued, and shown at the first redraw after the
    copy finished."""

    def __init__(self, workload: Callable[[], Optional[list]]) -> None:
        self._workload = workload
        self._pending: Optional[tuple] = None
        self.text = ""

    def poll(self) -> str:
        """The text to show now; starts the next copy when none is in flight."""
        if self._pending is not None:
            name, host, done = self._pending
            if not done.query():
                return self.text
            self.text, self._pending = f"{name}={format_number(host.item())}", None
        try:
            metrics = (self._workload() or [])[-1]
        except IndexError:
            return self.text
        name = "loss" if "loss" in metrics else next(iter(metrics), None)
        value = metrics.get(name)
        if not isinstance(value, torch.Tensor):
            shown = format_number(value)
            self.text = self.text if shown is None else f"{name}={shown}"
        elif value.numel() == 1 and value.device.type == "cpu":
            self.text = f"{name}={format_number(value.item())}"
        elif value.numel() == 1 and value.device.type == "cuda":
            with torch.cuda.device(value.device):
                host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                host.copy_(value, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
            self._pending = (name, host, done)
        return self.text


def format_duration(seconds: float) -> str:
    """``H:MM:SS``, rounded up."""
    minutes, whole = divmod(int(math.ceil(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{whole:02d}"


class RateMeter:
    """Batches per second over the last :data:`RATE_WINDOW_S` seconds of samples."""

    def __init__(self) -> None:
        self._samples: Deque[Tuple[float, int]] = collections.deque()

    def sample(self, completed: int) -> Optional[float]:
        """Record ``completed`` now; the rate since the oldest sample in the window, or None."""
        now = time.monotonic()
        samples = self._samples
        samples.append((now, completed))
        while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW_S:
            samples.popleft()
        seconds, batches = now - samples[0][0], completed - samples[0][1]
        return batches / seconds if seconds > 0 and batches > 0 else None


def rate_and_eta(rate: Optional[float], remaining: Optional[int]) -> str:
    """``7.83 batch/s  ETA 0:00:05`` (``4.2 s/batch`` when slower than one batch a second)."""
    if not rate:
        return ""
    text = f"{rate:.3g} batch/s" if rate >= 1 else f"{1 / rate:.3g} s/batch"
    return text if remaining is None else f"{text}  ETA {format_duration(remaining / rate)}"


def bar(completed: int, total: Optional[int], width: int) -> Text:
    """A bar of ``width`` characters, filled to ``completed`` of ``total`` (empty when unknown)."""
    filled = min(width, int(width * completed / total)) if total else 0
    style = "bar.finished" if total and completed >= total else "bar.complete"
    return Text.assemble(("━" * filled, style), ("━" * (width - filled), "bar.back"))


class LiveView:
    """The bars and the metric rows of one run, redrawn by rich's refresh thread."""

    def __init__(
        self,
        stream: IO[str],
        batches_trained: Callable[[], int],
        validation_batches: Callable[[], int],
        searcher_metric: Optional[str],
        workload: Callable[[], Optional[list]] = lambda: None,
        extra_rows: Callable[[], List[Text]] = list,
        reported: Callable[[], Dict[str, Any]] = dict,
    ) -> None:
        """``extra_rows``: lines drawn under the metric rows at each redraw (a launcher's rows,
        one per rank). ``reported``: the ``progress`` (0..1) and ``status`` a script reports
        itself (a Core API script, which names no length: its own bar, with no counts)."""
        self._extra_rows = extra_rows
        self._reported = reported
        self._latest_batch = LatestBatchValue(workload)
        self._batches_trained = batches_trained
        self._validation_batches = validation_batches
        self._searcher_metric = searcher_metric
        self._metrics: Dict[str, Tuple[int, List[str]]] = {}
        self._training_shown = False
        self._validation: Optional[Tuple[Optional[int], RateMeter]] = None
        self._training_rate = RateMeter()
        self._epoch_length = 0
        self._max_batches: Optional[int] = None
        self._redirected: List[logging.StreamHandler] = []
        self.console = Console(file=stream, highlight=False)
        self._live = Live(
            _Frame(self), console=self.console, refresh_per_second=REFRESHES_PER_SECOND
        )

    # ---------------------------------------------------------------- what the plugin tells it

    def open(self) -> None:
        """Start drawing; log messages to the terminal go above the view from now on."""
        self._live.start()
        self._route_logging_above()

    def close(self) -> None:
        """Draw the last frame and leave it on the screen; give logging its stream back."""
        for handler in self._redirected:
            handler.setStream(self.console.file)
        self._redirected = []
        self._live.stop()

    def training_started(self, max_batches: Optional[int], epoch_length: int) -> None:
        """Show the training bar, starting at the batch training starts from."""
        self._epoch_length, self._max_batches = epoch_length, max_batches
        self._training_shown = True
        self._live.refresh()

    def validation_started(self, total: Optional[int]) -> None:
        """Show a validation bar below the training bar (``total`` None: not yet known)."""
        self._validation = (total, RateMeter())
        self._live.refresh()

    def validation_ended(self) -> None:
        """Take the validation bar away."""
        self._validation = None

    def show_metrics(self, group: str, steps_completed: int, metrics: Dict[str, Any]) -> None:
        """Show a report's metrics in the row of its group."""
        first = self._searcher_metric if group == "validation" else None
        self._metrics[group] = (steps_completed, ordered_metrics(metrics, first))
        self._live.refresh()

    # ---------------------------------------------------------------- drawing (rich's thread)

    def lines(self) -> List[Text]:
        """The frame: the bars, brought up to the counters, then a row per metric group."""
        width = self.console.width
        bar_width = max(10, min(BAR_WIDTH, width - 75))
        bars = []
        if self._training_shown:
            done, total = self._batches_trained(), self._max_batches
            rate = self._training_rate.sample(done)
            remaining = None if total is None else max(total - done, 0)
            bars.append((self._epoch_text(done), done, total, rate_and_eta(rate, remaining),
                         self._latest_batch.poll()))
        validation = self._validation
        if validation is not None:
            total, meter = validation
            done = self._validation_batches()
            remaining = None if total is None else max(total - done, 0)
            bars.append(("validation", done, total, rate_and_eta(meter.sample(done), remaining), ""))
        label_width = max((len(row[0]) for row in bars), default=0)
        count_width = max((len(str(row[2] or "?")) for row in bars), default=0)
        frame = [self._bar_line(row, label_width, count_width, bar_width) for row in bars]
        return self._reported_line(bar_width) + frame + self._metric_rows(width) + self._extra_rows()

    def _reported_line(self, bar_width: int) -> List[Text]:
        """``progress ━━━━━━━━━━━━━━━ 50% · evaluating``: what the script says of itself, if anything."""
        reported = self._reported()
        progress, status = reported.get("progress"), reported.get("status")
        if progress is None and not status:
            return []
        line = Text("progress ")
        if progress is not None:
            line.append_text(bar(int(1000 * progress), 1000, bar_width))
            line.append(f" {int(100 * progress):>3}%")
        if status:
            line.append(f" · {status}")
        line.no_wrap, line.overflow = True, "ellipsis"
        return [line]

    @staticmethod
    def _bar_line(row: tuple, label_width: int, count_width: int, bar_width: int) -> Text:
        label, done, total, speed, latest = row
        counts = f"{done:>{count_width}}/{total if total is not None else '?'}"
        percent = f" {min(100 * done // total, 100):>3}%" if total else ""
        line = Text.assemble(f"{label:<{label_width}} ", bar(done, total, bar_width), f" {counts} batches{percent}")
        for part in (speed, latest):
            if part:
                line.append(" " + part)
        line.no_wrap, line.overflow = True, "ellipsis"
        return line

    def _epoch_text(self, done: int) -> str:
        if not self._epoch_length:
            return "training"
        epoch = min(done, max((self._max_batches or 1) - 1, 0)) // self._epoch_length
        text = f"epoch {epoch + 1}"
        if self._max_batches:
            text += f"/{math.ceil(self._max_batches / self._epoch_length)}"
        return text

    def _metric_rows(self, width: int) -> List[Text]:
        """``  training  @ batch 50  loss=0.18  …``, the metrics wrapped under themselves."""
        groups = [group for group in ("training", "validation") if group in self._metrics]
        where = {group: f"@ batch {self._metrics[group][0]}" for group in groups}
        where_width = max((len(text) for text in where.values()), default=0)
        rows = []
        for group in groups:
            prefix = f"{group:>10}  {where[group]:<{where_width}}  "
            room = max(width - len(prefix), 20)
            lines, current = [], ""
            for item in self._metrics[group][1]:
                candidate = f"{current}  {item}" if current else item
                if current and len(candidate) > room:
                    lines.append(current)
                    candidate = item
                current = candidate
            lines.append(current)
            row = Text.assemble((f"{group:>10}", "bold"), prefix[10:] + lines[0])
            for more in lines[1:]:
                row.append("\n" + " " * len(prefix) + more)
            rows.append(row)
        return rows

    def _route_logging_above(self) -> None:
        """Point console log handlers at rich's stream proxy, which prints above the view."""
        import sys

        proxy = sys.stderr  # rich's FileProxy while the view is live
        for logger in (logging.getLogger(), logging.getLogger("hookdet")):
            for handler in logger.handlers:
                if type(handler) is logging.StreamHandler and handler.stream is self.console.file:
                    handler.setStream(proxy)
                    self._redirected.append(handler)


class _Frame:
    """What rich's Live draws: the view's lines, built afresh at each redraw."""

    def __init__(self, view: LiveView) -> None:
        self._view = view

    def __rich__(self) -> Group:
        return Group(*self._view.lines())
