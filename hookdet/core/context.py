"""``det.core.init()``: a Core API script's contexts, over a hookdet run.

A Core API script never subclasses a trial: it trains in its own loop and talks to the run
through the contexts ``core.init()`` returns (Determined's names): ``train`` (reports),
``checkpoint`` (storage), ``preempt`` (stop signals), ``distributed`` (ranks and collectives),
``searcher`` (deprecated operations) and ``profiler``. hookdet opens the same run a trial
class's ``pytorch.init()`` opens (:func:`hookdet.loop.trainer.opened_run`): the plugins the
experiment file names, the run directory owned and recorded (``run.json``, ``config.json``,
``history.jsonl``, ``logs/``), the run's checkpoint storage. Under ``hookdet run`` the
experiment file, trial seed and run directory come from the cluster info, as on a cluster; run
bare, the script gets a run directory of its own (``runs/<name>-<time>``), as ``pytorch.init()``
gives one.

The ``with`` block is the run: when it ends the run is recorded ``completed``, ``preempted``
(the script returned after ``should_preempt()`` said true: ``hookdet run`` exits 75 and
``--resume`` continues it) or ``failed`` with the error. ``det.InvalidHP`` raised inside it ends
the trial as invalid (exit status 76, where Determined exits 0 and tells its master), and a search
replaces the trial.
"""
from __future__ import annotations

import contextlib
import enum
import logging
import sys
import types
from pathlib import Path
from typing import Any, Dict, Optional, Union

from hookdet.core.checkpoint import CheckpointContext
from hookdet.core.experimental import ExperimentalCoreContext
from hookdet.core.preempt import PreemptContext, PreemptMode
from hookdet.core.searcher import searcher_context
from hookdet.core.train import EarlyExitReason, TrainContext
from hookdet.core.profiler import ProfilerContext
from hookdet.exit_codes import INVALID_HP_EXIT_CODE, PREEMPTED_EXIT_CODE, ExitReason
from hookdet.launch import outcome
from hookdet.runs import record as run_record
from hookdet.trial_api import cluster_info

logger = logging.getLogger("hookdet")


class TensorboardMode(enum.Enum):
    """Whether reports also go to TensorBoard (Determined's names and values): ``AUTO``, the
    chief writes every report into the run's ``tensorboard/``; ``MANUAL``, none is written."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"


class Context:
    """What ``core.init()`` returns: ``.train``, ``.checkpoint``, ``.preempt``, ``.distributed``,
    ``.searcher``, ``.profiler``, ``.experimental`` and ``.info`` (the cluster info; None run bare)."""

    def __init__(self, run: Any, opened: contextlib.ExitStack, preempt_mode: Any, tensorboard: bool) -> None:
        self._run = run
        self._opened = opened
        self.info = cluster_info.get_cluster_info()
        self.distributed = run.distributed
        self.train = TrainContext(run, tensorboard)
        self.checkpoint = CheckpointContext(run)
        self.preempt = PreemptContext(run, preempt_mode)
        self.searcher = searcher_context(run.config.to_dict(), run.distributed, self.train)
        self.profiler = ProfilerContext(run)
        self.experimental = ExperimentalCoreContext(run)
        self._closed = False

    def start(self) -> None:
        """Start the contexts that answer while the block runs (``with`` calls it)."""
        self.preempt.start()

    def __enter__(self) -> "Context":
        self.start()
        return self

    def __exit__(self, exc_type: Optional[type], exc_val: Optional[BaseException],
                 exc_tb: Optional[types.TracebackType]) -> None:
        from hookdet.errors import InvalidHP

        self.close(exc_type, exc_val, exc_tb)
        if self.preempt.interrupted and isinstance(exc_val, KeyboardInterrupt):
            sys.exit(PREEMPTED_EXIT_CODE)  # stopped by the signal, at its latest checkpoint
        if isinstance(exc_val, InvalidHP):
            # Determined converts it to exit(0) and tells its master; hookdet run learns it from
            # the status, as it does from a trial class (a search then replaces the trial).
            print(f"hookdet: the trial raised InvalidHP: {exc_val}", file=sys.stderr, flush=True)
            sys.exit(INVALID_HP_EXIT_CODE)

    def alert(self, title: Optional[str] = None, description: Optional[str] = None, level: str = "info") -> None:
        """Determined sends a webhook; locally the alert is logged at its level."""
        log = {"debug": logger.debug, "info": logger.info, "error": logger.error}.get(level, logger.warning)
        log("alert: %s%s", title or "", f": {description}" if description else "")

    def close(self, exc_type: Optional[type] = None, exc_val: Optional[BaseException] = None,
              exc_tb: Optional[types.TracebackType] = None) -> None:
        """End the run: record how it ended and release its directory."""
        if self._closed:
            return
        self._closed = True
        from hookdet.errors import InvalidHP

        run = self._run
        self.preempt.close()
        self.profiler.off()
        if isinstance(exc_val, InvalidHP):
            self.train.report_early_exit(EarlyExitReason.INVALID_HP)
            if run.is_chief:
                run_record.note_fields(run.run_dir, early_exit=EarlyExitReason.INVALID_HP.value)
            run.exit_reason = ExitReason.EXITED
            exc_type = exc_val = exc_tb = None  # the trial ends as invalid, not failed
        elif self.preempt.interrupted and isinstance(exc_val, KeyboardInterrupt):
            run.exit_reason = ExitReason.PREEMPTED  # interrupted for not asking: preempted, not failed
            exc_type = exc_val = exc_tb = None
        elif exc_val is None and run.exit_reason != ExitReason.STOPPED:  # stopped: by the search
            run.exit_reason = ExitReason.PREEMPTED if self.preempt.told_to_stop else ExitReason.COMPLETED
            if run.exit_reason == ExitReason.COMPLETED:
                self.checkpoint.apply_retention(final=True)
        outcome.note_training("failed" if exc_val is not None else run_record.final_state(run),
                              run.state.latest_checkpoint, run.state.batches_trained)
        cluster_info.record_outcome(run)
        try:
            run.hook.on_trial_shutdown(run=run)
        finally:
            self._opened.__exit__(exc_type, exc_val, exc_tb)


def init(
    *,
    distributed: Any = None,
    checkpoint_storage: Union[str, Dict[str, Any], None] = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: Any = TensorboardMode.AUTO,
) -> Context:
    """Open a run for a Core API script and return its :class:`Context`; use it as ``with
    det.core.init() as core_context:``. ``distributed`` is the script's
    :class:`~hookdet.core.DistributedContext` (needed when it runs on several slots);
    ``checkpoint_storage`` a directory, ``s3://bucket/prefix``, ``gs://bucket/prefix`` or a
    ``checkpoint_storage`` block, in place of the experiment file's; ``tensorboard_mode``
    ``MANUAL`` keeps reports out of TensorBoard."""
    from hookdet.loop.trainer import opened_run

    info = cluster_info.get_cluster_info()
    config = _experiment_config(info, checkpoint_storage)
    tensorboard = TensorboardMode(tensorboard_mode) != TensorboardMode.MANUAL
    opened = contextlib.ExitStack()
    run = opened.enter_context(opened_run(
        exp_conf=config, distributed=distributed, enable_tensorboard_logging=tensorboard,
        run_dir=info.run_dir if info is not None and info.task_type == "TRIAL" else None, trial_context=False,
        resume_from=None if info is None else info.latest_checkpoint,
    ))
    try:
        run.first_batch = _resumed_steps(info)
        run.state.batches_trained = run.first_batch
        context = Context(run, opened, preempt_mode, tensorboard)
        if run.is_chief:  # a search reads it: this trial reports live, and is never paused at a rung
            run_record.note_fields(run.run_dir, core_api=True)
        run.hook.on_trial_startup(run=run, first_batch_idx=run.first_batch,
                                  checkpoint_uuid=None if info is None else info.latest_checkpoint)
        return context
    except BaseException:
        opened.__exit__(*sys.exc_info())
        raise


def _experiment_config(info: Any, checkpoint_storage: Union[str, Dict[str, Any], None]) -> Any:
    """The experiment the run trains: ``hookdet run``'s (from the cluster info), else none, with
    ``checkpoint_storage`` in place of its storage when given."""
    from hookdet.config import parse_experiment_config

    raw = dict(info.trial.experiment_config) if info is not None and info.task_type == "TRIAL" else {}
    if checkpoint_storage is not None:
        raw["checkpoint_storage"] = storage_block(checkpoint_storage)
    source = "hookdet run's experiment file" if raw and info is not None else "det.core.init()"
    return parse_experiment_config(raw, source=source)


def storage_block(checkpoint_storage: Union[str, Dict[str, Any]]) -> Dict[str, Any]:
    """``core.init(checkpoint_storage=...)`` as a ``checkpoint_storage`` block: a dict as it is;
    ``s3://bucket/prefix`` and ``gs://bucket/prefix`` as those stores; a path as a directory."""
    if isinstance(checkpoint_storage, dict):
        return dict(checkpoint_storage)
    if not isinstance(checkpoint_storage, (str, Path)):
        raise TypeError("checkpoint_storage must be a string, dictionary, or None")
    text = str(checkpoint_storage)
    for scheme, kind in (("s3://", "s3"), ("gs://", "gcs")):
        if text.startswith(scheme):
            bucket, _, prefix = text[len(scheme):].partition("/")
            return {"type": kind, "bucket": bucket, **({"prefix": prefix} if prefix else {})}
    return {"type": "directory", "container_path": str(Path(text).absolute())}


def _resumed_steps(info: Any) -> int:
    """The batches the checkpoint a resumed trial continues from had trained (0 fresh), read
    from its metadata (an object store's state is not fetched for it)."""
    latest = None if info is None else info.latest_checkpoint
    if latest is None:
        return 0
    from hookdet.checkpoints import format as fmt
    from hookdet.checkpoints.resolver import locate

    try:
        where, storage_id = locate(str(latest), None, "read")
        metadata = fmt.read_metadata(where) if storage_id is None else where.read_metadata(storage_id)
    except Exception:  # noqa: BLE001 - the script reads the checkpoint itself and says what is wrong
        return 0
    steps = metadata.get("steps_completed")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else 0
