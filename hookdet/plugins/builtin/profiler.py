"""``torch.profiler`` traces of training batches, written where TensorBoard's profiler tab reads.

Two ways to switch it on:

* the trial calls ``context.set_profiler(*args, **kwargs)`` (Determined's API): the arguments go
  to ``torch.profiler.profile`` as they are; traces go to the run's TensorBoard directory unless
  the trial passed its own ``on_trace_ready``;
* the experiment file lists ``profiler`` in ``plugins`` (or ``Trainer.fit(profiling_enabled=True)``),
  with optional options::

      plugin_config:
        profiler:
          begin_on_batch: 1        # first profiled batch index (default 1; the batch before warms up)
          end_after_batch: 3       # last profiled batch index (default begin_on_batch + 2)
          activities: [cpu, cuda]  # default: cpu, plus cuda when a GPU is present
          record_shapes: false
          profile_memory: false
          with_stack: false

Batch indices are the loop's (counted from the start of training, so a resumed run profiles the
same batches a fresh one would). The profiler starts when training starts, steps once at the end
of every training batch (no device sync) and stops when the trial shuts down, which writes any
trace still being recorded. Every rank profiles; trace files are named by host and rank.
"""
from __future__ import annotations

import logging
import socket
from typing import Any, Callable, Dict, List, Literal, Optional

import pydantic
import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from hookdet.plugin import hookimpl, options_for

logger = logging.getLogger("hookdet")

ACTIVITIES = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}
DEFAULT_BEGIN_ON_BATCH = 1
DEFAULT_PROFILED_BATCHES = 3


class ProfilerOptions(pydantic.BaseModel):
    """``plugin_config.profiler``, declared (checked with the experiment file): which batches to
    record and what to record."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    begin_on_batch: int = pydantic.Field(
        DEFAULT_BEGIN_ON_BATCH, ge=0, description="first profiled batch index (the batch before warms up)"
    )
    end_after_batch: Optional[int] = pydantic.Field(
        None, ge=0, description=f"last profiled batch index (default begin_on_batch + {DEFAULT_PROFILED_BATCHES - 1})"
    )
    activities: Optional[List[Literal["cpu", "cuda"]]] = pydantic.Field(
        None, min_length=1, description="what to record (default: cpu, plus cuda when a GPU is present)"
    )
    record_shapes: bool = pydantic.Field(False, description="torch.profiler's record_shapes")
    profile_memory: bool = pydantic.Field(False, description="torch.profiler's profile_memory")
    with_stack: bool = pydantic.Field(False, description="torch.profiler's with_stack")

    @pydantic.model_validator(mode="after")
    def _end_after_begin(self) -> "ProfilerOptions":
        if self.last_batch < self.begin_on_batch:
            raise ValueError(f"end_after_batch ({self.last_batch}) is before begin_on_batch ({self.begin_on_batch})")
        return self

    @property
    def last_batch(self) -> int:
        """The last profiled batch index."""
        if self.end_after_batch is not None:
            return self.end_after_batch
        return self.begin_on_batch + DEFAULT_PROFILED_BATCHES - 1

    @property
    def flags(self) -> Dict[str, bool]:
        """The keyword flags for ``torch.profiler.profile``."""
        return {"record_shapes": self.record_shapes, "profile_memory": self.profile_memory, "with_stack": self.with_stack}

    def torch_activities(self) -> List[ProfilerActivity]:
        """The activities to record, without ``cuda`` where there is no GPU (a warning says so)."""
        if self.activities is None:
            return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
        chosen = []
        for name in self.activities:
            if name == "cuda" and not torch.cuda.is_available():
                logger.warning("profiler: no CUDA device here; profiling %s without 'cuda'", self.activities)
                continue
            chosen.append(ACTIVITIES[name])
        return chosen or [ProfilerActivity.CPU]

    def schedule(self, first_batch: int) -> Callable[[int], ProfilerAction]:
        """A ``torch.profiler`` schedule for a profiler started before batch ``first_batch``.

        The profiler counts steps from its start; this maps step ``k`` to batch
        ``first_batch + k``. The batch before ``begin_on_batch`` warms up.
        """
        begin, end = self.begin_on_batch, self.last_batch

        def action(step: int) -> ProfilerAction:
            batch = first_batch + step
            if batch == begin - 1:
                return ProfilerAction.WARMUP
            if begin <= batch < end:
                return ProfilerAction.RECORD
            if batch == end:
                return ProfilerAction.RECORD_AND_SAVE
            return ProfilerAction.NONE

        return action


class ProfilerPlugin:
    """Owns one ``torch.profiler.profile`` for the run: built, started, stepped and stopped."""

    Options = ProfilerOptions

    def __init__(self, options: Any = None) -> None:
        self.options: ProfilerOptions = options_for(ProfilerPlugin, options, "profiler")
        self.profiler: Optional[torch.profiler.profile] = None
        self._last_batch: Optional[int] = None
        self._running = False
        self._run: Any = None

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Remember the run (its TensorBoard directory and rank)."""
        self._run = run

    def trace_handler(self) -> Callable[[Any], None]:
        """``tensorboard_trace_handler`` into the run's TensorBoard directory, named by rank."""
        rank = self._run.distributed.rank if self._run.distributed is not None else 0
        return torch.profiler.tensorboard_trace_handler(
            str(self._run.tensorboard_dir), worker_name=f"{socket.gethostname()}_rank{rank}"
        )

    @hookimpl
    def hookdet_set_profiler(self, context: Any, args: Any, kwargs: Dict[str, Any]) -> Any:
        """``context.set_profiler``: profile with ``torch.profiler.profile(*args, **kwargs)``.

        The trial's arguments replace the experiment file's schedule. Traces go to the run's
        TensorBoard directory unless ``on_trace_ready`` is given.
        """
        self.set_profiler(*args, **kwargs)
        return self.profiler

    def set_profiler(self, *args: Any, **kwargs: Any) -> None:
        """Profile with ``torch.profiler.profile(*args, **kwargs)`` (see :meth:`hookdet_set_profiler`)."""
        if self._running:
            raise RuntimeError("set_profiler must be called before training starts (in the trial's __init__)")
        kwargs.setdefault("on_trace_ready", self.trace_handler())
        self.profiler = torch.profiler.profile(*args, **kwargs)
        self._last_batch = None

    @hookimpl
    def on_training_start(self) -> None:
        """Start profiling; without ``set_profiler``, on the experiment file's schedule."""
        if self.profiler is None:
            options = self.options
            first_batch = self._run.state.batches_trained
            if first_batch > options.last_batch:
                logger.info(
                    "profiler: training starts at batch %d, after the profiled batches %d-%d",
                    first_batch, options.begin_on_batch, options.last_batch,
                )
                return
            self.profiler = torch.profiler.profile(
                activities=options.torch_activities(),
                schedule=options.schedule(first_batch),
                on_trace_ready=self.trace_handler(),
                **options.flags,
            )
            self._last_batch = options.last_batch
        self.profiler.start()
        self._running = True

    @hookimpl
    def hookdet_train_batch_end(self, context: Any, batch_idx: int, metrics: Dict[str, Any]) -> None:
        """Advance the profiler's schedule; stop once the last scheduled batch is saved."""
        if not self._running:
            return
        self.profiler.step()
        if self._last_batch is not None and batch_idx >= self._last_batch:
            self._stop()

    def _stop(self) -> None:
        if self._running:
            self._running = False
            self.profiler.stop()

    @hookimpl
    def on_trial_shutdown(self) -> None:
        """Stop profiling; a trace still being recorded is written now."""
        self._stop()

    @hookimpl
    def hookdet_unconfigure(self, run: Any) -> None:
        """Stop profiling if the trial never shut down (training raised before it started)."""
        self._stop()
