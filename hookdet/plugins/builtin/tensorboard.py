"""Reported metrics → TensorBoard event files in the run's ``tensorboard`` directory.

Every training report is written as ``training/<metric>`` and every validation as
``validation/<metric>``, at step = batches trained so far, so curves from the experiment file and
from ``metrics.jsonl`` line up. One ``SummaryWriter`` stays open for the whole run and is closed
when the run ends. The trial gets the same writer from ``context.get_tensorboard_writer()``, or
through Determined's legacy :class:`TorchWriter`.

A report costs the training thread almost nothing: its scalars are kept, and every
``write_every_s`` seconds (``plugin_config.tensorboard.write_every_s``, default 5; TensorBoard
itself reloads every 30 s) the kept reports are handed to TensorBoard's writer thread, one event
per report holding all its metrics. Every validation report and every checkpoint writes and
flushes at once, so whatever a checkpoint covers is on disk, and the writer is closed when the run
ends. An exception loses nothing reported; a ``SIGKILL`` can lose the training reports of the last
``write_every_s`` seconds (``metrics.jsonl`` is the synchronous record).

Only the chief writes. Other ranks get a :class:`DiscardingWriter`, so trial code that logs from
every rank runs unchanged without several processes fighting over one directory.

A resumed run marks its first step in the event file (a ``SessionLog.START`` at the resume
point), so TensorBoard hides whatever the interrupted run wrote after its last checkpoint instead
of drawing two curves over the same steps.

Each run also records its hyperparameters for TensorBoard's HParams tab (nested ones by dotted
name, values that are not numbers, strings or booleans as JSON) with the searcher metric as the
metric: TensorBoard pointed at a search directory shows every trial's hyperparameters beside its
``validation/<searcher metric>``.
"""
from __future__ import annotations

import json
import logging
import numbers
import time
from typing import Any, Dict, List, Optional, Tuple

import pydantic

from hookdet.plugin import TENSORBOARD_METRICS, PluginError, hookimpl, options_for

logger = logging.getLogger("hookdet")

INSTALL_HINT = (
    "plugin 'tensorboard' needs the tensorboard package, which is not installed: run "
    "`pip install tensorboard` (or drop the plugin: add 'no:tensorboard' to the experiment "
    "file's plugins, or pass enable_tensorboard_logging=False to pytorch.init)"
)

NAME = "tensorboard"
#: Default seconds between hand-overs of kept training reports to TensorBoard's writer.
WRITE_EVERY_S = 5.0


def metric_tag(group: str, name: str) -> str:
    """The TensorBoard tag of metric ``name`` reported in ``group`` (``training/loss``)."""
    return f"{group}/{name}"


def flat_hparams(hparams: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested hyperparameters by dotted name; a value that is not a number, string or boolean
    (a list, None) as its JSON text, the kinds the HParams tab shows."""
    flat: Dict[str, Any] = {}
    for name, value in hparams.items():
        if isinstance(value, dict):
            flat.update(flat_hparams(value, f"{prefix}{name}."))
        elif isinstance(value, (bool, str)):
            flat[f"{prefix}{name}"] = value
        elif isinstance(value, numbers.Real):  # a NumPy number too, as Python's
            flat[f"{prefix}{name}"] = int(value) if isinstance(value, numbers.Integral) else float(value)
        else:
            flat[f"{prefix}{name}"] = json.dumps(value, default=str)
    return flat


def _is_scalar(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class DiscardingWriter:
    """What non-chief ranks get instead of a ``SummaryWriter``: every ``add_*`` call is dropped.

    Only the chief's files are the run's record; this keeps trial code rank-agnostic.
    """

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def get_logdir(self) -> str:
        """The directory the chief writes to."""
        return self.log_dir

    def flush(self) -> None:
        """Nothing to flush."""

    def close(self) -> None:
        """Nothing to close."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("add_"):
            return _discard
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


def _discard(*args: Any, **kwargs: Any) -> None:
    return None


class TensorBoardPlugin:
    """Writes reported metrics to ``run.tensorboard_dir`` and owns the run's ``SummaryWriter``."""

    class Options(pydantic.BaseModel):
        """``plugin_config.tensorboard``."""

        model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
        write_every_s: float = pydantic.Field(
            WRITE_EVERY_S, ge=0, description="seconds between writes of the kept reports to the event file"
        )

    def __init__(self, options: Any = None) -> None:
        self.write_every_s = options_for(TensorBoardPlugin, options, NAME).write_every_s
        self._run: Any = None
        self._writer: Any = None
        # Reports not yet handed to the writer: (step, wall time, [(tag, value), ...]).
        self._kept: List[Tuple[int, float, List[Tuple[str, float]]]] = []
        self._next_write = 0.0

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Refuse the run at once when TensorBoard is missing (not at the first report)."""
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as error:
            raise PluginError(f"{INSTALL_HINT} [{error}]") from error
        self._run = run

    @hookimpl
    def hookdet_make_tensorboard_writer(self, run: Any) -> Any:
        """``context.get_tensorboard_writer()``: the run's shared writer."""
        return self.get_writer()

    def get_writer(self) -> Any:
        """The run's ``SummaryWriter`` (created on first use), or a discarding one off the chief."""
        if self._writer is None:
            if self._run is None or self._run.distributed is None:
                raise RuntimeError(
                    "the TensorBoard writer exists only inside a run: call it from the trial "
                    "(context.get_tensorboard_writer()) after pytorch.init(...) started"
                )
            log_dir = str(self._run.tensorboard_dir)
            if self._run.is_chief:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(log_dir=log_dir)
            else:
                self._writer = DiscardingWriter(log_dir)
        return self._writer

    @hookimpl
    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
        """Record the hyperparameters for the HParams tab; on resume, tell TensorBoard to drop
        what an earlier attempt wrote past the checkpoint."""
        if not self._run.is_chief:
            return
        self.write_hparams()
        if first_batch_idx <= 0:
            return
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        # TensorBoard purges earlier events whose step is >= a START marker's step. Step
        # first_batch_idx itself (the checkpoint's own validation) stays.
        self.get_writer().file_writer.add_event(
            Event(step=first_batch_idx + 1, session_log=SessionLog(status=SessionLog.START))
        )

    def write_hparams(self) -> None:
        """The run's hyperparameters and searcher metric, as TensorBoard's HParams plugin reads
        them (an experiment summary and a session start, written by torch's own helper)."""
        from torch.utils.tensorboard.summary import hparams

        metric = metric_tag("validation", self._run.config.searcher.metric)
        experiment, session_start, _ = hparams(flat_hparams(self._run.hparams), {metric: 0.0})
        file_writer = self.get_writer()._get_file_writer()
        for summary in (experiment, session_start):
            file_writer.add_summary(summary)

    @hookimpl
    def hookdet_report_metrics(
        self, run: Any, group: str, steps_completed: int, metrics: Dict[str, Any]
    ) -> None:
        """Keep the numeric metrics under ``<group>/<name>``; write when due (fires on the chief)."""
        if not run.stash.get(TENSORBOARD_METRICS, True):
            return
        scalars = [(metric_tag(group, name), value) for name, value in metrics.items() if _is_scalar(value)]
        if scalars:
            self._kept.append((steps_completed, time.time(), scalars))
        if group != "training":
            self.write_kept(flush=True)
        elif time.monotonic() >= self._next_write:
            self.write_kept(flush=False)

    @hookimpl
    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """Everything reported up to a checkpoint is on disk with it."""
        self.write_kept(flush=True)

    def write_kept(self, flush: bool) -> None:
        """Hand the kept reports to the writer, one event each (``simple_value``s, as
        ``SummaryWriter.add_scalar`` writes them); with ``flush``, wait until they are on disk."""
        self._next_write = time.monotonic() + self.write_every_s
        if not self._run.is_chief:
            return
        if self._kept:
            from tensorboard.compat.proto.summary_pb2 import Summary

            # What add_scalar itself calls; it reopens the file writer if the trial closed it.
            file_writer = self.get_writer()._get_file_writer()
            for step, wall_time, scalars in self._kept:
                values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars]
                file_writer.add_summary(Summary(value=values), step, wall_time)
            self._kept = []
        if flush and self._writer is not None:
            self._writer.flush()

    @hookimpl
    def hookdet_unconfigure(self, run: Any) -> None:
        """Write what is kept, flush and close the writer."""
        if self._kept:
            self.write_kept(flush=False)
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# Determined's legacy writer lives at its Determined path; kept importable from here too.
from hookdet.plugin import TorchWriter  # noqa: E402,F401
