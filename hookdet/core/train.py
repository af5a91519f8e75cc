"""``core_context.train``: the script's reports, into the run's records.

Determined sends them to its master; hookdet writes them where a trial class's reports go, by
the same path: each report is appended to the run's ``metrics.jsonl`` with its group (the
host's record, :mod:`hookdet.runs.metrics`), then ``hookdet_report_metrics`` tells the plugins
(TensorBoard under Determined's tags, the progress view, MLflow). Only the chief reports, as on
a cluster. A validation that holds ``searcher.metric`` is ranked for ``best_validation`` and
checkpoint retention. ``report_progress``, ``set_status`` and ``set_metadata`` go into the run's
``run.json`` (:func:`hookdet.runs.record.note_fields`), where ``hookdet ui`` and ``hookdet show``
read them.
"""
from __future__ import annotations

import enum
import logging
import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from hookdet.loop.run import REPORTED_PROGRESS
from hookdet.runs import record as run_record
from hookdet.metrics.metric_values import check_metrics_serialisable

logger = logging.getLogger("hookdet")

#: The group names Determined maps to its built-in time series.
TRAINING, VALIDATION = "training", "validation"


class EarlyExitReason(enum.Enum):
    """Why a trial exits early (Determined's names and values)."""

    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


class TrainContext:
    """Determined's ``TrainContext`` over a hookdet run (``core_context.train``)."""

    def __init__(self, run: Any, tensorboard: bool = True) -> None:
        self._run = run
        self._tensorboard = tensorboard
        #: The reason ``report_early_exit`` was given, if any.
        self.early_exit: Optional[EarlyExitReason] = None

    def set_status(self, status: str) -> None:
        """A short line saying what the script is doing, shown on the run's page."""
        logger.info("status: %s", status)
        self._note(status=str(status))

    def set_metadata(self, metadata: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """Replace the run's metadata (kept in ``run.json``); returns what was set."""
        if not isinstance(metadata, dict):
            raise TypeError(f"set_metadata takes a dict, not {type(metadata).__name__}")
        check_metrics_serialisable(metadata, "set_metadata")
        self._note(metadata=metadata)
        return dict(metadata)

    def get_metadata(self) -> Optional[Dict[str, Any]]:
        """The run's metadata as last set (None before any)."""
        record = run_record.read_record(self._run.run_dir, check_alive=False) or {}
        return record.get("metadata")

    def report_training_metrics(self, steps_completed: int, metrics: Dict[str, Any],
                                batch_metrics: Optional[List[Dict[str, Any]]] = None) -> None:
        """Report training metrics at ``steps_completed`` batches."""
        logger.info("report_training_metrics(steps_completed=%s, metrics=%s)", steps_completed, metrics)
        self._report(TRAINING, steps_completed, metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: Dict[str, Any]) -> None:
        """Report validation metrics at ``steps_completed`` batches; a value of None fails the
        trial, as on a cluster."""
        logger.info("report_validation_metrics(steps_completed=%s, metrics=%s)", steps_completed, metrics)
        for name, value in metrics.items():
            if value is None:
                raise RuntimeError(f"Validation metric '{name}' returned an invalid scalar value: {value}")
        self._report(VALIDATION, steps_completed, metrics)

    def report_metrics(self, group: str, steps_completed: int, metrics: Dict[str, Any]) -> None:
        """Report ``metrics`` in a group of the script's own (``training`` and ``validation``
        are the built-in ones); a group name may not contain ``.``."""
        logger.info("report_metrics(group=%s, steps_completed=%s, metrics=%s)", group, steps_completed, metrics)
        if not isinstance(group, str) or not group or "." in group:
            raise ValueError(f"report_metrics: group {group!r} must be a non-empty name without '.'")
        if group == VALIDATION:
            self.report_validation_metrics(steps_completed, metrics)
            return
        self._report(group, steps_completed, metrics)

    def report_progress(self, progress: float) -> None:
        """How far training is, between 0 and 1 (shown by ``hookdet ui``)."""
        if not isinstance(progress, (int, float)) or math.isnan(progress) or progress < 0 or progress > 1:
            raise ValueError(f"Progress should be between 0 and 1, not {progress}")
        self._note(progress=float(progress))

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        """Say why the trial exits early (``INVALID_HP``: a search replaces it)."""
        self.early_exit = EarlyExitReason(reason)
        logger.info("report_early_exit(%s)", self.early_exit)

    def get_tensorboard_path(self) -> Path:
        """The run's TensorBoard directory (``<run dir>/tensorboard``)."""
        return Path(self._run.tensorboard_dir).absolute()

    def upload_tensorboard_files(self, selector: Callable[[Path], bool] = lambda _: True,
                                 mangler: Callable[[Path, int], Path] = lambda p, __: p) -> None:
        """TensorBoard files stay in the run's directory: there is nothing to upload locally."""
        logger.info("upload_tensorboard_files(): the TensorBoard files stay in %s", self.get_tensorboard_path())

    def get_experiment_best_validation(self) -> Optional[float]:
        """The best ``searcher.metric`` reported so far by this run (a search's trials do not
        see each other's; Determined's master answers across the experiment)."""
        return self._run.state.best_validation

    # ------------------------------------------------------------------ the records

    def _report(self, group: str, steps_completed: int, metrics: Dict[str, Any]) -> None:
        run = self._run
        if not isinstance(steps_completed, int) or isinstance(steps_completed, bool) or steps_completed < 0:
            raise TypeError(f"steps_completed must be a whole number of batches, not {steps_completed!r}")
        if not isinstance(metrics, dict):
            raise TypeError(f"metrics must be a dict, not {type(metrics).__name__}")
        metrics = check_metrics_serialisable(metrics, f"report of {group} metrics")
        if not run.is_chief:
            raise RuntimeError(f"only the chief (rank 0) reports metrics; rank {run.distributed.rank} reported "
                               f"{group} metrics (report from 'if core_context.distributed.rank == 0:')")
        state = run.state
        state.batches_trained = max(state.batches_trained, steps_completed)
        if group == VALIDATION:
            self._rank_validation(steps_completed, metrics)
        run.report_log.append(group, steps_completed, metrics, continues_from=run.first_batch or 0)
        run.hook.hookdet_report_metrics(run=run, group=group, steps_completed=steps_completed, metrics=metrics)

    def _rank_validation(self, steps_completed: int, metrics: Dict[str, Any]) -> None:
        """Keep the validation's searcher metric for retention and the run's best."""
        searcher = self._run.config.searcher
        state = self._run.state
        value = metrics.get(searcher.metric)
        state.last_validation_batch = steps_completed
        state.validation_history.append({"batches": steps_completed, "metric": value})
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            best = state.best_validation
            if best is None or (value < best if searcher.smaller_is_better else value > best):
                state.best_validation = float(value)

    def _note(self, **fields: Any) -> None:
        """Into ``run.json``; progress and status also to the progress view (``REPORTED_PROGRESS``)."""
        if not self._run.is_chief:
            return
        run_record.note_fields(self._run.run_dir, **fields)
        shown = {name: value for name, value in fields.items() if name in ("progress", "status")}
        if shown:
            self._run.stash[REPORTED_PROGRESS] = {**self._run.stash.get(REPORTED_PROGRESS, {}), **shown}
