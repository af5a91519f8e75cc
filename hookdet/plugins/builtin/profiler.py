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
from typing import Any, Callable, Dict, List, Optional

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from hookdet.markers import hookimpl

logger = logging.getLogger("hookdet")

ACTIVITIES = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}
FLAG_OPTIONS = ("record_shapes", "profile_memory", "with_stack")
KNOWN_OPTIONS = ("begin_on_batch", "end_after_batch", "activities") + FLAG_OPTIONS
DEFAULT_BEGIN_ON_BATCH = 1
DEFAULT_PROFILED_BATCHES = 3


class ProfilerOptions:
    """``plugin_config.profiler``, checked: which batches to record and what to record."""

    def __init__(self, options: Dict[str, Any]) -> None:
        unknown = sorted(set(options) - set(KNOWN_OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; known: {list(KNOWN_OPTIONS)}")
        self.begin_on_batch = _non_negative_int(options, "begin_on_batch", DEFAULT_BEGIN_ON_BATCH)
        self.end_after_batch = _non_negative_int(
            options, "end_after_batch", self.begin_on_batch + DEFAULT_PROFILED_BATCHES - 1
        )
        if self.end_after_batch < self.begin_on_batch:
            raise ValueError(
                f"end_after_batch ({self.end_after_batch}) is before begin_on_batch "
                f"({self.begin_on_batch})"
            )
        self.activities = _activities(options.get("activities"))
        self.flags = {}
        for name in FLAG_OPTIONS:
            value = options.get(name, False)
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")
            self.flags[name] = value

    def schedule(self, first_batch: int) -> Callable[[int], ProfilerAction]:
        """A ``torch.profiler`` schedule for a profiler started before batch ``first_batch``.

        The profiler counts steps from its start; this maps step ``k`` to batch
        ``first_batch + k``. The batch before ``begin_on_batch`` warms up.
        """
        begin, end = self.begin_on_batch, self.end_after_batch

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


def _non_negative_int(options: Dict[str, Any], name: str, default: int) -> int:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a batch index (an int >= 0), got {value!r}")
    return value


def _activities(names: Any) -> List[ProfilerActivity]:
    if names is None:
        chosen = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            chosen.append(ProfilerActivity.CUDA)
        return chosen
    if not isinstance(names, list) or not names:
        raise ValueError(f"activities must be a non-empty list like [cpu, cuda], got {names!r}")
    chosen = []
    for name in names:
        if name not in ACTIVITIES:
            raise ValueError(f"activities: unknown activity {name!r}; known: {sorted(ACTIVITIES)}")
        if name == "cuda" and not torch.cuda.is_available():
            logger.warning("profiler: no CUDA device here; profiling %s without 'cuda'", names)
            continue
        chosen.append(ACTIVITIES[name])
    if not chosen:
        chosen.append(ProfilerActivity.CPU)
    return chosen


class ProfilerPlugin:
    """Owns one ``torch.profiler.profile`` for the run: built, started, stepped and stopped."""

    def __init__(self, options: Optional[Dict[str, Any]] = None) -> None:
        self.options = ProfilerOptions(dict(options or {}))
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
            if first_batch > options.end_after_batch:
                logger.info(
                    "profiler: training starts at batch %d, after the profiled batches %d-%d",
                    first_batch, options.begin_on_batch, options.end_after_batch,
                )
                return
            self.profiler = torch.profiler.profile(
                activities=options.activities,
                schedule=options.schedule(first_batch),
                on_trace_ready=self.trace_handler(),
                **options.flags,
            )
            self._last_batch = options.end_after_batch
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
