"""``DetCallback``: a Hugging Face ``Trainer`` as a Core API trial (Determined's callback).

Passed in the ``callbacks`` of a ``transformers.Trainer`` with the ``core.init()`` context, it
does what Determined's does: resumes from ``info.latest_checkpoint`` (downloaded into
``args.output_dir``, ``args.resume_from_checkpoint`` set to its ``checkpoint-N``), reports each
``on_log`` as training or validation metrics (with ``batches`` and ``epochs``, without the
speed metrics, only the ``filter_metrics`` named ones when given, never without the searcher's
metrics), reports progress, uploads each ``checkpoint-N/`` the Trainer saves (with ``runs/``,
the Trainer's TensorBoard files, and ``user_data`` as ``my_data.json``), and stops training
when ``should_preempt()`` turns true (a stop signal, or a search's stop at a rung), saving
first. A run of the Trainer ends with a validation and a checkpoint unless both are current.

Where hookdet differs from Determined 0.38.1, on purpose: run bare (no ``hookdet run``) it
works, in the run directory ``core.init()`` made (Determined refuses to run off a cluster);
under ``adaptive_asha``/``async_halving`` it checks ``time_metric``/``max_time`` against the
Trainer's length and asks the validations for a ``time_metric`` that is not batches or epochs
(Determined's check raises ``AttributeError`` there, on an attribute it never sets).
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Optional, Tuple

try:
    import transformers
    from transformers import trainer_utils
except ImportError as error:  # pragma: no cover - said in one line, naming the extra
    raise ImportError(f"hookdet.transformers needs Hugging Face transformers: pip install 'hookdet[transformers]' "
                      f"({error})") from None

from hookdet.trial_api.cluster_info import get_cluster_info

logger = logging.getLogger("hookdet")

#: How ``on_log``'s keys say what a log holds (Determined's prefixes).
EVAL, TEST, TRAIN = "eval_", "test_", "train_"
#: Logged metrics that measure speed, not the model: never reported.
SPEED_SUFFIXES = ("_runtime", "_per_second", "_compilation_time")


def metric_type(logs: Dict[str, Any]) -> str:
    """``eval_`` for an evaluation's logs, ``test_`` for a prediction's, else ``train_``."""
    if any(key.startswith(EVAL) for key in logs):
        return EVAL
    if any(key.startswith(TEST) for key in logs):
        return TEST
    return TRAIN


class DetCallback(transformers.TrainerCallback):
    """Determined's ``det.transformers.DetCallback(core_context, args, filter_metrics=None, user_data=None)``."""

    def __init__(self, core_context: Any, args: "transformers.TrainingArguments",
                 filter_metrics: Optional[List[str]] = None, user_data: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        self.core_context = core_context
        self.filter_metrics = list(filter_metrics) if filter_metrics else None
        self.user_data = user_data
        self.last_train_metrics = self.last_eval_metrics = self.last_save = -1
        self.last_progress = 0
        self.info = get_cluster_info()
        self.searcher_metric: Optional[str] = None
        self.time_metric: Optional[str] = None
        self.required_metrics: List[str] = []
        self.load_last_checkpoint(args)
        if self.info is not None and self.info.task_type == "TRIAL":
            searcher = self.info.trial.experiment_config.get("searcher") or {}
            self._check_searcher_config(searcher, args)
            self.searcher_metric = searcher.get("metric")
            self.time_metric = searcher.get("time_metric")
            if self.filter_metrics:  # the searcher's own metrics are never filtered out
                self.filter_metrics += [name for name in (self.searcher_metric, self.time_metric) if name]

    # ------------------------------------------------------------------ setup

    def load_last_checkpoint(self, args: "transformers.TrainingArguments") -> None:
        """Download ``info.latest_checkpoint`` into ``args.output_dir`` and resume the Trainer from it."""
        latest = None if self.info is None else self.info.latest_checkpoint
        if latest is None:
            return
        if getattr(args, "overwrite_output_dir", False) is True:  # transformers 5 removed the argument
            logger.info("Skipping downloading last checkpoint due to overwrite_output_dir=True.")
            return
        self.core_context.checkpoint.download(latest, args.output_dir)
        args.resume_from_checkpoint = trainer_utils.get_last_checkpoint(args.output_dir)
        logger.info("Latest checkpoint downloaded to %s.", args.resume_from_checkpoint)

    def _check_searcher_config(self, searcher: Dict[str, Any], args: "transformers.TrainingArguments") -> None:
        """The Trainer's length must be the searcher's, in the same unit (Determined's checks)."""
        if args.max_steps > -1:
            unit, length, flag = "batches", args.max_steps, "--max_steps"
        else:
            unit, length, flag = "epochs", args.num_train_epochs, "--num_train_epochs"
        max_length = searcher.get("max_length")
        if isinstance(max_length, int):
            raise ValueError("HF trainer no longer respects the deprecated searcher.max_length field.  "
                             "searcher.max_length is deprecated; please remove it and rely on "
                             f"{flag} instead to avoid ambiguous training specifications.")
        if isinstance(max_length, dict) and max_length:
            configured = next(iter(max_length.items()))
            if configured != (unit, length):
                raise ValueError(f"HF trainer units does not match configured searcher.max_length ({unit}={length} "
                                 f"!= {configured[0]}={configured[1]}).  The searcher.max_length field is deprecated; "
                                 "please remove it and avoid ambiguous training specifications.")
        elif searcher.get("name") in ("adaptive_asha", "async_halving"):
            time_metric, max_time = searcher.get("time_metric"), searcher.get("max_time")
            if time_metric not in ("batches", "epochs"):
                self.required_metrics.append(time_metric)
            elif (time_metric, max_time) != (unit, length):
                raise ValueError(f"HF trainer units does not match the max_time configured for {searcher['name']} "
                                 f"searcher ({unit}={length} != {time_metric}={max_time}).  Please update one of "
                                 f"the searcher.max_time config field or the {flag} to match the other.")

    # ------------------------------------------------------------------ metrics

    def _metrics(self, logs: Dict[str, Any]) -> Tuple[Dict[str, Any], str]:
        kind = metric_type(logs)
        metrics = dict(logs) if not self.filter_metrics else {
            key: value for key, value in logs.items() if any(name in key for name in self.filter_metrics)}
        metrics.pop("epoch", None)  # the Trainer's rounded epoch: ``epochs`` is exact
        for name in [name for name in metrics if name.endswith(SPEED_SUFFIXES)]:
            metrics.pop(name)
        return metrics, kind

    def _check_eval_metrics(self, metrics: Dict[str, Any]) -> None:
        """A validation must hold the searcher metric and the time metric: one line naming each missing."""
        missing = [f"{what} '{name}' set by {field}" for what, name, field in (
            ("Searcher metric", self.searcher_metric, "searcher.metric config field"),
            ("Time metric", self.time_metric, "searcher.time_metric config field"),
            *(("Required metric", name, "the searcher") for name in self.required_metrics))
            if name is not None and name not in metrics]
        if missing:
            raise ValueError(" and ".join(missing) + " missing; you must emit those metrics for the "
                             "hyperparameter search to work.")

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        if logs is None:
            logger.warning("on_log called with empty logs")
            return
        metrics, kind = self._metrics(logs)
        metrics.setdefault("batches", state.global_step)
        metrics.setdefault("epochs", state.epoch)
        if kind == TRAIN and self.last_train_metrics != state.global_step:
            self.last_train_metrics = state.global_step
            if state.is_world_process_zero:
                self.core_context.train.report_metrics(group="training", steps_completed=state.global_step,
                                                       metrics=metrics)
        elif kind == EVAL and self.last_eval_metrics != state.global_step:
            self.last_eval_metrics = state.global_step
            if state.is_world_process_zero:
                self._check_eval_metrics(metrics)
                self.core_context.train.report_metrics(group="validation", steps_completed=state.global_step,
                                                       metrics=metrics)
        if self.core_context.preempt.should_preempt():
            control.should_training_stop = True  # the save at the end (on_epoch_end) follows

    # ------------------------------------------------------------------ checkpoints, progress, the end

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.last_save = state.global_step
        local_path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if state.is_world_process_zero and self.user_data is not None:
            with open(os.path.join(local_path, "my_data.json"), "w") as handle:
                json.dump(self.user_data, handle)
        metadata: Dict[str, Any] = {"steps_completed": state.global_step}
        if self.info is not None and self.info.task_type == "TRIAL":
            metadata["trial_id"] = self.info.trial.trial_id

        def selector(path: str) -> bool:
            return path.startswith((f"checkpoint-{state.global_step}/", "runs/"))

        self.core_context.checkpoint.upload(args.output_dir, metadata=metadata, shard=True, selector=selector)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and args.max_steps > -1:
            progress = state.global_step / args.max_steps
            if int(progress * 100) > self.last_progress:  # at most one report per percent
                self.last_progress = int(progress * 100)
                self.core_context.train.report_progress(min(progress, 1.0))

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_training_stop:
            ending = True
        elif args.max_steps > -1:
            ending = state.global_step >= args.max_steps
        else:
            ending = state.epoch >= args.num_train_epochs
        if ending:
            preempted = self.core_context.preempt.should_preempt()
            if state.global_step > self.last_eval_metrics and not preempted:
                control.should_evaluate = True
            if state.global_step > self.last_save:
                control.should_save = True
        if state.is_world_process_zero and args.max_steps == -1:
            self.core_context.train.report_progress(min(state.epoch / args.num_train_epochs, 1.0))
