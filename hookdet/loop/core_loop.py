"""The one training loop: draw batches, call the trial, emit hooks. It knows no feature.

:mod:`hookdet.plugins.hookspecs` has the map of where each hook fires. Everything optional — devices,
distribution, mixed precision, checkpoints, metrics sinks, progress — lives in plugins; this
module counts batches, decides workload boundaries, reduces metrics and asks the hooks.

Why one long module: the loop is one class whose per-batch path (``_train``) stays in a single
function on purpose, with no call or hook it does not need (the bytecode budget test guards it);
its helpers sit beside it so the whole order of a run reads in one place.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from hookdet.loop.loop_schedule import (
    as_metrics_dict,
    batches_at_next_boundary,
    chief_validation_length,
    reached,
)
from hookdet.exit_codes import ExitReason
from hookdet.loop.run import TRIAL_CALLBACKS, WORKLOAD_METRICS
from hookdet.data import loader_adapters
from hookdet.data.batch_moving import batch_mover
from hookdet.data.loader import DataLoader
from hookdet.metrics import callback_metrics
from hookdet.metrics import workload_metrics
from hookdet.checkpoints.format import CheckpointError, check_weights_only
from hookdet.metrics.metric_values import MetricError, check_metrics_serialisable
from hookdet.trial_api.trial import (
    Batch,
    Epoch,
    PyTorchTrial,
    ShouldExit,
    TrainUnit,
    TrialError,
    evaluate_batch_takes_index,
    overridden_evaluation_method,
)

logger = logging.getLogger("hookdet")

CHECKPOINT_POLICIES = ("best", "all", "none")


class TrainingLoop:
    """Runs ``Trainer.fit`` for one :class:`hookdet.loop.run.Run` whose trial and context exist."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.trial = run.trial
        self.context = run.context
        self.hook = run.hook
        self.state = run.state
        self.distributed = run.distributed
        # Whether a plugin reads on_training_workload_end's per-batch metrics (set by _train).
        self.call_workload_end = True

    # ------------------------------------------------------------------ entry point

    def fit(
        self,
        max_length: TrainUnit,
        validation_period: Optional[TrainUnit],
        checkpoint_period: Optional[TrainUnit],
        reporting_period: TrainUnit,
        checkpoint_policy: str,
        step_zero_validation: bool,
        test_mode: bool,
    ) -> None:
        """Train until ``max_length``, a stop request, or ``ShouldExit``; validate, report and
        checkpoint at their periods; finish with a validation and checkpoint unless current."""
        if checkpoint_policy not in CHECKPOINT_POLICIES:
            raise ValueError(
                f"checkpoint_policy must be one of {CHECKPOINT_POLICIES}, got {checkpoint_policy!r}"
            )
        self.checkpoint_policy = checkpoint_policy
        self.warned_no_searcher_metric = False
        self.test_mode = test_mode
        self.evaluation_method = overridden_evaluation_method(self.trial)
        self._register_callbacks()
        self.context._bind_hooks()
        # One mover for the run's batches, training and validation: device resolved, unknown
        # types warned about once.
        self.move_batch = batch_mover(self.run.device)
        try:
            # As Determined: on_trial_startup sees where training will start and the checkpoint
            # it will resume from before that checkpoint is loaded (callbacks' load_state_dict).
            self.hook.on_trial_startup(
                run=self.run, first_batch_idx=self.context.get_initial_batch(),
                checkpoint_uuid=self._resume_uuid() or self.run.warm_start_from,
            )
            train_loader = self._build_loaders(max_length)  # after startup, as in Determined
            if self.run.resume_from is not None:
                self.hook.hookdet_load_checkpoint(run=self.run, checkpoint=self.run.resume_from)
            elif self.run.warm_start_from is not None:
                self._warm_start(self.run.warm_start_from)
            batches = loader_adapters.adapt_training_loader(
                train_loader,
                disable_checks=self._checks_disabled,
                repeat=True,
                skip=self.state.batches_trained,
                num_replicas=self.distributed.size,
                rank=self.distributed.rank,
                seed=self.run.trial_seed,
            )
            self.run.first_batch = self.state.batches_trained
            self.hook.on_training_start(run=self.run)  # before a step-zero validation, as in Determined
            if step_zero_validation and self.state.batches_trained == 0 and not test_mode:
                self._validate()
            self._train(iter(batches), validation_period, checkpoint_period, reporting_period)
        finally:
            self.hook.on_trial_shutdown(run=self.run)

    def _warm_start(self, checkpoint: str) -> None:
        if not self.hook.hookdet_warm_start(run=self.run, checkpoint=checkpoint):
            raise TrialError(
                f"searcher.source_checkpoint_uuid is {checkpoint!r}, but no plugin loads checkpoints "
                "(the experiment file removes the checkpoint plugin)"
            )

    def _build_loaders(self, max_length: TrainUnit) -> Any:
        """Build both loaders; set the epoch length and the run's length; return the training one."""
        train_loader = self.trial.build_training_data_loader()
        self.validation_loader = self.trial.build_validation_data_loader()
        self.run.validation_length = chief_validation_length(self.validation_loader, self.distributed.size)
        self.state.epoch_length = self._epoch_length(train_loader)
        if self.state.epoch_length < 1:
            raise TrialError("build_training_data_loader returned a loader with no batches")
        self.max_batches = self._length_in_batches(max_length, "max_length")
        self.run.max_batches = self.max_batches
        return train_loader

    def _resume_uuid(self) -> Optional[str]:
        """The storage id of the checkpoint this run resumes from (None for a fresh run)."""
        if self.run.resume_from is None:
            return None
        storage_id = self.hook.hookdet_resume_uuid(run=self.run, checkpoint=self.run.resume_from)
        return storage_id if storage_id is not None else self.run.resume_from

    @property
    def _checks_disabled(self) -> bool:
        return not self.context.experimental._data_repro_checks

    def _epoch_length(self, train_loader: Any) -> int:
        """Batches per epoch on each rank: the chief's, so every rank agrees on epoch ends."""
        if isinstance(train_loader, DataLoader):
            length = train_loader.epoch_length(self.distributed.size)
        else:
            loader_adapters.adapt_training_loader(train_loader, disable_checks=self._checks_disabled)
            length = len(train_loader)
        return int(self.distributed.broadcast(length))

    def _register_callbacks(self) -> None:
        callbacks = self.trial.build_callbacks()
        if not isinstance(callbacks, dict):
            raise TrialError(
                f"{type(self.trial).__qualname__}.build_callbacks must return a dict of "
                f"name -> PyTorchCallback, got {type(callbacks).__name__}"
            )
        if not callbacks:
            return
        if self.run.plugins.provide("hookdet_add_callbacks", optional=True, run=self.run, callbacks=callbacks):
            self.run.stash[TRIAL_CALLBACKS] = dict(callbacks)
        else:
            logger.warning(
                "the trial's callbacks (%s) will not run: the experiment file removes the plugin "
                "that runs them (no:callbacks)",
                ", ".join(callbacks),
            )

    def _length_in_batches(self, length: TrainUnit, what: str) -> int:
        if not isinstance(length, (Batch, Epoch)) or not isinstance(length.value, int):
            raise TypeError(f"{what} must be Batch(n) or Epoch(n) with an int n, got {length!r}")
        if isinstance(length, Epoch):
            return length.value * self.state.epoch_length
        return length.value

    # ------------------------------------------------------------------ training

    def _train(
        self,
        batches: Iterator[Any],
        validation_period: Optional[TrainUnit],
        checkpoint_period: Optional[TrainUnit],
        reporting_period: TrainUnit,
    ) -> None:
        state, context, trial, hook = self.state, self.context, self.trial, self.hook
        plugins = self.run.plugins
        # Which batch hooks have implementations is read again whenever the plugin manager's
        # registration count moved: before the first batch, and from the batch after a plugin
        # registered (from any hook). Between, the check is one comparison per batch.
        bound_generation = -1
        call_train_hook = call_batch_end = call_epoch_start = call_epoch_end = precision_steps = False
        train_batch = trial.train_batch
        move_batch = self.move_batch if context.experimental._auto_to_device else None
        lr_schedulers = context.lr_schedulers  # the context's own list: later additions show
        epoch_length = state.epoch_length
        any_rank, stop_agreed = self._stop_agreements()
        periods = (validation_period, checkpoint_period, reporting_period)
        # Batches trained at which the next Batch-period boundary (or the end) falls. The batches
        # before it, within one epoch, run as one stretch with no boundary checks at all.
        next_boundary = batches_at_next_boundary(periods, state.batches_trained, self.max_batches)
        # The run shares the list, so an observer (the live view) reads the latest batch's
        # metrics without a per-batch hook.
        # A run preempted between two reports left its workload's batches in the checkpoint:
        # they join this workload, so the next report averages what it would have without a stop.
        workload: List[Dict[str, Any]] = list(self.run.carried_workload or [])
        self.run.carried_workload = None
        self.run.stash[WORKLOAD_METRICS] = workload
        context.experimental.reset_reducers()
        self._set_train_mode(True)
        # A run a plugin ended before its first batch (a signal while the trial was built, a
        # search segment resumed where it had already ended) stops here, not one batch later.
        if state.batches_trained < self.max_batches and any_rank(self.run.exit_reason is not None):
            self._at_boundary(workload, periods, epoch_ended=False, stopping=True)
            return

        while state.batches_trained < self.max_batches:
            if plugins.generation != bound_generation:
                bound_generation = plugins.generation
                call_train_hook, call_batch_end, call_epoch_start, call_epoch_end = self._bind_batch_hooks()
                precision_steps = context._precision_steps
            first = state.batches_trained
            epoch_idx, position = divmod(first, epoch_length)
            if position == 0 and call_epoch_start:
                hook.on_training_epoch_start(run=self.run, epoch_idx=epoch_idx)
            stretch_end = first + 1 if self.test_mode else min(next_boundary, first - position + epoch_length)
            stopping = False
            for batch_idx in range(first, stretch_end):
                batch = next(batches)
                if move_batch is not None:
                    batch = move_batch(batch)
                context._current_batch_idx = batch_idx
                # ``returned`` keeps the previous batch's result, and so its autograd graph,
                # alive until this batch's forward has run, as a plain loop's ``loss = ...``
                # does: the parameters' gradient accumulators, which a live graph holds, are
                # then reused instead of being destroyed and rebuilt every batch.
                try:
                    if call_train_hook:
                        returned = hook.hookdet_train_batch(
                            trial=trial, batch=batch, epoch_idx=epoch_idx, batch_idx=batch_idx
                        )
                    else:
                        returned = train_batch(batch, epoch_idx, batch_idx)
                except ShouldExit as should_exit:
                    self._exit_early(workload, should_exit)
                    return
                metrics = as_metrics_dict(returned)
                workload.append(metrics)
                state.batches_trained = batch_idx + 1
                if lr_schedulers or precision_steps:
                    context._end_batch(batch_idx, (batch_idx + 1) % epoch_length == 0, epoch_idx)
                if call_batch_end:
                    hook.hookdet_train_batch_end(context=context, batch_idx=batch_idx, metrics=metrics)
                if stop_agreed(context._stop_requested):
                    stopping = True
                    break
                if plugins.generation != bound_generation:
                    break  # a plugin registered: bind its batch hooks before the next batch
            returned = None  # no graph held through hooks, validation and checkpoints
            epoch_ended = state.batches_trained % epoch_length == 0
            if epoch_ended:
                if call_epoch_end:
                    hook.on_training_epoch_end(run=self.run, epoch_idx=epoch_idx)
                # Every rank ends the same epochs, so every rank joins this collective alike
                # (whatever hooks each rank has); an epoch-end hook may have asked for a stop.
                stopping = stopping or any_rank(context._stop_requested)

            next_boundary = batches_at_next_boundary(periods, state.batches_trained, self.max_batches)
            ended = self._at_boundary(workload, periods, epoch_ended, stopping)
            if ended is None:
                continue  # no boundary here: the workload goes on
            if ended:
                return
            workload = self.run.stash[WORKLOAD_METRICS] = []
            context.experimental.reset_reducers()
        self.run.exit_reason = ExitReason.COMPLETED  # nothing was left to train

    def _stop_agreements(self) -> Tuple[Callable[[bool], bool], Callable[[bool], bool]]:
        """(at a boundary, per batch): how ranks agree that any of them wants to stop. One
        process needs no collective; per batch the ranks agree asynchronously (a little late,
        never waiting), at boundaries they wait."""
        if self.distributed.size == 1:
            return bool, bool
        any_rank = self.distributed.any_rank
        return any_rank, getattr(self.distributed, "any_rank_soon", any_rank)

    def _at_boundary(
        self, workload: List[Dict[str, Any]], periods: Tuple[Optional[TrainUnit], ...], epoch_ended: bool, stopping: bool
    ) -> Optional[bool]:
        """After a stretch of batches: report, validate and checkpoint as the periods say.

        None when no boundary falls here (the workload goes on); True when training ended
        (completed or stopped, ``run.exit_reason`` set); False when training goes on with a new
        workload."""
        state, context = self.state, self.context
        validation_period, checkpoint_period, reporting_period = periods
        trained, epoch_length = state.batches_trained, state.epoch_length
        done = trained >= self.max_batches or self.test_mode
        validate = reached(validation_period, trained, epoch_ended, epoch_length)
        checkpoint = stopping or reached(checkpoint_period, trained, epoch_ended, epoch_length)
        report = reached(reporting_period, trained, epoch_ended, epoch_length)
        if not (validate or checkpoint or report or stopping or done):
            return None
        if self._carries(workload, validate or report or done):
            self.run.carried_workload = workload  # into the checkpoint below, not into a report
        else:
            self._finish_workload(workload)
        # A validation due at this batch runs even when stopping (as Determined validates at a
        # boundary before it checks for a stop), so a stopped-and-resumed run reports the same
        # validations as one that never stopped.
        if validate:
            self._validate_unless_current()
        stopping = stopping or self.distributed.any_rank(context._stop_requested)
        if checkpoint or stopping:
            self._checkpoint_unless_current()
        if stopping and not done:
            self.run.exit_reason = self.run.exit_reason or ExitReason.STOPPED
            return True
        if done:
            # As Determined finishes: the period's checkpoint (above) comes before the final
            # validation, then a final checkpoint unless one is current.
            self._validate_unless_current()
            self._checkpoint_unless_current()
            self.run.exit_reason = ExitReason.COMPLETED
            return True
        return False

    def _carries(self, workload: List[Dict[str, Any]], reports_here: bool) -> bool:
        """Whether a preemption between two reports carries the workload in the checkpoint
        instead of reporting it, so the resumed run's reports equal an uninterrupted run's.

        Only what a checkpoint can hold is carried: plain values and tensors, and no custom
        training reducer (whose state is the user's object); otherwise the workload is
        reported at the stop, as Determined reports it."""
        if reports_here or self.run.exit_reason != ExitReason.PREEMPTED or not workload:
            return False
        if self.context._reducers.has_training_reducers():
            return False
        try:
            check_weights_only(workload, "the workload's metrics")
        except CheckpointError:
            return False
        return True

    def _bind_batch_hooks(self) -> Tuple[bool, bool, bool, bool]:
        """Whether the train-batch, batch-end and epoch start/end hooks have implementations
        (also decides ``on_training_workload_end``, and the context's step hooks)."""
        implemented = self.run.plugins.implemented
        self.call_workload_end = implemented("on_training_workload_end")
        self.context._bind_hooks()
        return (
            implemented("hookdet_train_batch"),
            implemented("hookdet_train_batch_end"),
            implemented("on_training_epoch_start"),
            implemented("on_training_epoch_end"),
        )

    def _exit_early(self, workload: List[Dict[str, Any]], should_exit: ShouldExit) -> None:
        """``train_batch`` raised ``ShouldExit``: report what the workload has, then checkpoint
        unless the trial asked not to (or the current batch count has one already)."""
        self._finish_workload(workload)
        self.run.exit_reason = ExitReason.EXITED
        state = self.state
        if not should_exit.skip_exit_checkpoint and state.last_checkpoint_batch != state.batches_trained:
            self._checkpoint()

    def _finish_workload(self, workload: List[Dict[str, Any]]) -> None:
        """Average the workload's metrics (across ranks too) and report them."""
        if not workload:
            return
        allgather = self.distributed.allgather
        first_batch = self.state.batches_trained - len(workload)
        averages = workload_metrics.average_training_metrics(workload, allgather, first_batch_idx=first_batch)
        reducer_results = self.context._reducers.reduce(True, allgather, plain=False)
        avg_metrics = check_metrics_serialisable({**averages, **reducer_results}, "train_batch")
        if self.call_workload_end:
            state = self.state
            hook_avg_metrics, hook_batch_metrics = callback_metrics.training_workload(
                workload, reducer_results, state.batches_trained, state.epoch_idx,
                allgather, self.distributed.size,
            )
            self.hook.on_training_workload_end(
                run=self.run, avg_metrics=hook_avg_metrics, batch_metrics=hook_batch_metrics
            )
        if self.run.is_chief:
            self._report("training", avg_metrics)

    def _report(self, group: str, metrics: Dict[str, Any]) -> None:
        """Record a report in the run's history (chief), then tell the plugins."""
        steps = self.state.batches_trained
        self.run.report_log.append(group, steps, metrics, continues_from=self.run.first_batch or 0)
        self.hook.hookdet_report_metrics(run=self.run, group=group, steps_completed=steps, metrics=metrics)

    def _validate_unless_current(self) -> None:
        """Validate unless this batch count has been; checkpoint after it as the policy says."""
        if self.state.last_validation_batch == self.state.batches_trained:
            return
        is_best = self._validate()
        if self.checkpoint_policy == "all" or (self.checkpoint_policy == "best" and is_best):
            self._checkpoint_unless_current()

    def _checkpoint_unless_current(self) -> None:
        if self.state.last_checkpoint_batch != self.state.batches_trained:
            self._checkpoint()

    def _checkpoint(self) -> None:
        self.hook.hookdet_save_checkpoint(run=self.run)
        self.state.last_checkpoint_batch = self.state.batches_trained

    def _set_train_mode(self, training: bool) -> None:
        for model in self.context.models:
            model.train(training)

    # ------------------------------------------------------------------ validation

    def _validate(self) -> bool:
        """Run validation; return whether its searcher metric is the best so far."""
        hook = self.hook
        hook.on_validation_start(run=self.run)
        self._set_train_mode(False)
        self.context._reducers.reset_all(for_training=False)
        try:
            with torch.no_grad():
                if self.evaluation_method == "evaluate_full_dataset":
                    metrics, hook_metrics = self._evaluate_full_dataset()
                else:
                    metrics, hook_metrics = self._evaluate_batches()
        finally:
            self._set_train_mode(True)
        hook.on_validation_end(run=self.run, metrics=hook_metrics)
        self.state.last_validation_batch = self.state.batches_trained
        if self.run.is_chief:  # reported first: a validation that stops the run is kept
            self._report("validation", metrics)
        return self._record_validation(metrics)

    def _evaluate_batches(self) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Validate batch by batch; the metrics plain (for the reports) and as
        ``on_validation_end`` gets them (:mod:`hookdet.metrics.callback_metrics`)."""
        trial, hook, context = self.trial, self.hook, self.context
        call_batch_end = self.run.plugins.implemented("hookdet_validation_batch_end")
        takes_index = evaluate_batch_takes_index(trial)
        loader = loader_adapters.adapt_validation_loader(
            self.validation_loader,
            disable_checks=self._checks_disabled,
            num_replicas=self.distributed.size,
            rank=self.distributed.rank,
            seed=self.run.trial_seed,
        )
        outputs: List[Any] = []
        records = 0
        started = time.monotonic()
        hook.on_validation_epoch_start(run=self.run)
        for batch_idx, batch in enumerate(loader):
            if context.experimental._auto_to_device:
                batch = self.move_batch(batch)
            records += trial.get_batch_length(batch)  # where Determined counts it: before the call
            output = trial.evaluate_batch(batch, batch_idx) if takes_index else trial.evaluate_batch(batch)
            if not isinstance(output, dict):
                raise TrialError(
                    f"{type(trial).__qualname__}.evaluate_batch must return a dict of metrics, "
                    f"got {type(output).__name__}"
                )
            if outputs and output.keys() != outputs[0].keys():
                # Determined refuses here, before on_validation_epoch_end.
                raise MetricError(
                    f"{type(trial).__qualname__}.evaluate_batch must return the same metric names "
                    f"for every batch: batch {batch_idx} returned {sorted(output)}, batch 0 "
                    f"{sorted(outputs[0])}"
                )
            outputs.append(output)
            if call_batch_end:
                hook.hookdet_validation_batch_end(context=context, batch_idx=batch_idx)
            if self.test_mode:
                break
        numpy_outputs = callback_metrics.batches_as_numpy(outputs)
        hook.on_validation_epoch_end(run=self.run, outputs=numpy_outputs)
        logger.debug("validated %d records in %d batches in %.3f s on rank %d",
                     records, len(outputs), time.monotonic() - started, self.distributed.rank)
        allgather, reducer = self.distributed.allgather, trial.evaluation_reducer()
        metrics = workload_metrics.reduce_validation_metrics(outputs, len(outputs), reducer, allgather)
        reducer_results = context._reducers.reduce(False, allgather, plain=False)
        hook_metrics = callback_metrics.validation_metrics(
            numpy_outputs,
            workload_metrics.reducer_for_each_metric(reducer, list(metrics)),
            reducer_results,
            allgather,
            self.distributed.size,
        )
        plain = check_metrics_serialisable({**metrics, **reducer_results}, "evaluate_batch")
        return plain, hook_metrics

    def _evaluate_full_dataset(self) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """The chief evaluates the whole validation set; the other ranks receive its metrics.
        Returns them plain (for the reports) and as ``on_validation_end`` gets them.

        No validation-epoch hooks: Determined fires them only around ``evaluate_batch``."""
        trial = self.trial
        metrics: Optional[Dict[str, Any]] = None
        if self.distributed.is_chief:
            loader = loader_adapters.adapt_validation_loader(
                self.validation_loader,
                disable_checks=self._checks_disabled,
                num_replicas=1,
                rank=0,
                seed=self.run.trial_seed,
            )
            metrics = trial.evaluate_full_dataset(loader)
            if not isinstance(metrics, dict):
                raise TrialError(
                    f"{type(trial).__qualname__}.evaluate_full_dataset must return a dict of "
                    f"metrics, got {type(metrics).__name__}"
                )
            check_metrics_serialisable(metrics, "evaluate_full_dataset")
            metrics = {name: callback_metrics.as_numpy(value) for name, value in metrics.items()}
        metrics = self.distributed.broadcast(metrics)
        return check_metrics_serialisable(metrics, "evaluate_full_dataset"), metrics

    def _record_validation(self, metrics: Dict[str, Any]) -> bool:
        searcher = self.run.config.searcher
        if self.checkpoint_policy == "best" and searcher.metric not in metrics:
            raise TrialError(missing_searcher_metric(searcher.metric, metrics))
        value = metrics.get(searcher.metric)
        self.state.validation_history.append(
            {"batches": self.state.batches_trained, "metric": value}
        )
        if not isinstance(value, (int, float)):
            if self.checkpoint_policy == "best" and not self.warned_no_searcher_metric:
                self.warned_no_searcher_metric = True
                logger.warning(
                    "checkpoint_policy 'best' ranks validations by searcher.metric %r, which the "
                    "validation metrics %s do not hold; checkpointing after every validation",
                    searcher.metric, sorted(metrics),
                )
            return True  # nothing to rank by: checkpoint, as Determined does
        best = self.state.best_validation
        improved = best is None or (value < best if searcher.smaller_is_better else value > best)
        if improved:
            self.state.best_validation = float(value)
        return improved


def missing_searcher_metric(metric: str, metrics: Dict[str, Any]) -> str:
    """Why a validation without the searcher metric stops the run (as Determined's harness stops
    it when it ranks validations), naming what was reported and the closest name."""
    from hookdet.config.problems import did_you_mean

    reported = sorted(metrics)
    # Determined lists the trial's metrics in their order, then the batches and epochs it adds
    as_determined_saw = list(metrics) + [key for key in ("batches", "epochs") if key not in metrics]
    return (f"searcher.metric {metric!r} is not among the validation metrics the trial reported "
            f"({', '.join(reported) or 'none'}){did_you_mean(metric, reported)} Set searcher.metric to one of them. "
            f"(Determined's words: Search method is configured to use metric '{metric}' but model "
            f"definition returned validation metrics {as_determined_saw}. The metric used by the search "
            "method must be one of the validation metrics returned by the model definition.)")


PyTorchTrial.trial_controller_class = TrainingLoop  # Determined's attribute, set from above (see trial.py)
