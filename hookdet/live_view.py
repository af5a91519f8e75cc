"""The terminal view of a training run, drawn with rich: a few lines that redraw in place.

::

    epoch 2/5 ━━━━━━━━━━━━━━━━━━━━━╺━━━━━━━━━━━━━━━━━━ 59/100 batches 7.83 batch/s  ETA 0:00:05 loss=0.1791
    validation ━━━━━━━━━━━━━━━━━━━━━━━━━╸━━━━━━━━━━━━━━ 12/25 batches
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
"""
from __future__ import annotations

import logging
import math
import numbers
from typing import IO, Any, Callable, Dict, List, Optional

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn
from rich.table import Table
from rich.text import Text

#: Redraws per second: often enough to watch every batch of a slow run, rarely enough to cost
#: nothing measurable (the redraw runs on rich's thread, not the loop's).
REFRESHES_PER_SECOND = 5


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


class _RateAndEta(ProgressColumn):
    """``7.83 batch/s  ETA 0:00:05`` (``4.2 s/batch`` when slower than one batch a second)."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        if not speed:
            return Text("")
        rate = f"{speed:.3g} batch/s" if speed >= 1 else f"{1 / speed:.3g} s/batch"
        remaining = task.time_remaining
        if task.total is None or remaining is None:
            return Text(rate)
        minutes, seconds = divmod(int(math.ceil(remaining)), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"{rate}  ETA {hours}:{minutes:02d}:{seconds:02d}")


class LiveView(Progress):
    """The bars and the metrics table of one run, redrawn by rich's refresh thread."""

    def __init__(
        self,
        stream: IO[str],
        batches_trained: Callable[[], int],
        validation_batches: Callable[[], int],
        searcher_metric: Optional[str],
        workload: Callable[[], Optional[list]] = lambda: None,
    ) -> None:
        self._latest_batch = LatestBatchValue(workload)
        self._batches_trained = batches_trained
        self._validation_batches = validation_batches
        self._searcher_metric = searcher_metric
        self._metrics: Dict[str, tuple] = {}
        self._training: Any = None
        self._validation: Any = None
        self._epoch_length = 0
        self._max_batches: Optional[int] = None
        self._redirected: List[logging.StreamHandler] = []
        console = Console(file=stream, highlight=False)
        super().__init__(
            TextColumn("{task.description}", justify="left"),
            # Room for the counts, rate, ETA and loss on the same line, however wide the terminal.
            BarColumn(bar_width=max(10, min(40, console.width - 75))),
            MofNCompleteColumn(),
            TextColumn("batches"),
            _RateAndEta(),
            TextColumn("{task.fields[latest]}"),
            console=console,
            refresh_per_second=REFRESHES_PER_SECOND,
            speed_estimate_period=10.0,
        )

    # ---------------------------------------------------------------- what the plugin tells it

    def open(self) -> None:
        """Start drawing; log messages to the terminal go above the view from now on."""
        self.start()
        self._route_logging_above()

    def close(self) -> None:
        """Draw the last frame and leave it on the screen; give logging its stream back."""
        for handler in self._redirected:
            handler.setStream(self.console.file)
        self._redirected = []
        self.stop()

    def training_started(self, max_batches: Optional[int], epoch_length: int) -> None:
        """Show the training bar, starting at the batch training starts from."""
        self._epoch_length, self._max_batches = epoch_length, max_batches
        if self._training is None:
            self._training = self.add_task(
                self._epoch_text(), total=max_batches, completed=self._batches_trained(), latest=""
            )

    def validation_started(self, total: Optional[int]) -> None:
        """Show a validation bar below the training bar (``total`` None: not yet known)."""
        if self._validation is None:
            self._validation = self.add_task("validation", total=total, latest="")

    def validation_ended(self) -> None:
        """Take the validation bar away."""
        validation, self._validation = self._validation, None
        if validation is not None:
            self.remove_task(validation)

    def show_metrics(self, group: str, steps_completed: int, metrics: Dict[str, Any]) -> None:
        """Show a report's metrics in the row of its group."""
        first = self._searcher_metric if group == "validation" else None
        self._metrics[group] = (steps_completed, ordered_metrics(metrics, first))
        self.refresh()

    # ---------------------------------------------------------------- drawing (rich's thread)

    def get_renderables(self) -> Any:
        """The frame: the bars, brought up to the counters, then a row per metric group."""
        training, validation = self._training, self._validation
        if training is not None:
            self.update(
                training,
                completed=self._batches_trained(),
                description=self._epoch_text(),
                latest=self._latest_batch.poll(),
            )
        if validation is not None:
            try:
                self.update(validation, completed=self._validation_batches())
            except KeyError:  # the validation ended while this frame was being drawn
                pass
        yield self.make_tasks_table(self.tasks)
        if self._metrics:
            yield self._metrics_table()

    def _epoch_text(self) -> str:
        if not self._epoch_length:
            return "training"
        epoch = min(self._batches_trained(), max((self._max_batches or 1) - 1, 0)) // self._epoch_length
        text = f"epoch {epoch + 1}"
        if self._max_batches:
            text += f"/{math.ceil(self._max_batches / self._epoch_length)}"
        return text

    def _metrics_table(self) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(justify="right", no_wrap=True)
        table.add_column(no_wrap=True)
        table.add_column(ratio=1)
        for group in ("training", "validation"):
            if group in self._metrics:
                steps, shown = self._metrics[group]
                table.add_row(Text(group, style="bold"), f"@ batch {steps}", Text("  ".join(shown)))
        return table

    def _route_logging_above(self) -> None:
        """Point console log handlers at rich's stream proxy, which prints above the view."""
        import sys

        proxy = sys.stderr  # rich's FileProxy while the view is live
        for logger in (logging.getLogger(), logging.getLogger("hookdet")):
            for handler in logger.handlers:
                if type(handler) is logging.StreamHandler and handler.stream is self.console.file:
                    handler.setStream(proxy)
                    self._redirected.append(handler)
