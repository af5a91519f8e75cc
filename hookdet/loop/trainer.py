"""Determined's Trainer API: ``init()`` builds a run and its context, ``Trainer.fit`` trains.

``hookdet run`` uses the same two calls, so the experiment file and the Python API share one
engine. ``init`` loads the plugins the experiment file names, seeds every RNG from the trial seed,
asks the plugins for the distributed backend and checkpoint storage, and yields the trial context.
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Sequence, Union

from hookdet.trial_api import cluster_info
from hookdet.loop import active_run
from hookdet.checkpoints.registry import make_storage
from hookdet.trial_api.context import PyTorchTrialContext, run_of
from hookdet.loop.core_loop import TrainingLoop
from hookdet.distributed.context import DistributedContext, rank_device
from hookdet.plugins.selection import DISTRIBUTED_PLUGINS, Launch, PluginSelection, select_plugins, unused_plugin_config
from hookdet.plugins.manager import PluginError, PluginManager
from hookdet.runs import ownership as ownership
from hookdet.runs import record as run_record
from hookdet.runs.metrics import ReportLog
from hookdet.trial_api.rng import seed_everything
from hookdet.loop.run import Run
from hookdet.trial_api.trial import Batch, PyTorchTrial, TrainUnit
from hookdet.errors import UsageError
from hookdet.launch import outcome

if TYPE_CHECKING:
    from hookdet.config import ExperimentConfig

logger = logging.getLogger("hookdet")


#: Characters of the experiment's name that go into a default run directory's name.
MAX_NAME_IN_PATH = 64


def default_run_dir(config: ExperimentConfig) -> Path:
    """``runs/<experiment name>-<timestamp>`` under the working directory (or ``$HOOKDET_RUN_DIR``)."""
    if os.environ.get("HOOKDET_RUN_DIR"):
        return Path(os.environ["HOOKDET_RUN_DIR"])
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", config.name or "experiment").strip("-") or "experiment"
    name = name[:MAX_NAME_IN_PATH]  # a file name has at most 255 bytes; a name may be longer
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path("runs") / f"{name}-{stamp}"


def plugin_selection_for(config: ExperimentConfig, enable_tensorboard_logging: bool = True) -> PluginSelection:
    """The plugins a run of ``config`` loads, in this process's launch (:mod:`hookdet.plugins.selection`)."""
    return select_plugins(config.plugins, Launch.from_environment(), enable_tensorboard_logging)


@contextlib.contextmanager
def init(
    *,
    hparams: Optional[Dict[str, Any]] = None,
    exp_conf: Union[Dict[str, Any], ExperimentConfig, None] = None,
    distributed: Optional[DistributedContext] = None,
    aggregation_frequency: int = 1,
    enable_tensorboard_logging: bool = True,
    run_dir: Union[str, Path, None] = None,
    model_dir: Union[str, Path, None] = None,
    plugins: Sequence[Any] = (),
) -> Iterator[PyTorchTrialContext]:
    """Build a run and yield its :class:`PyTorchTrialContext` (Determined's ``pytorch.init``).

    ``exp_conf`` is an experiment file as a dict (or already loaded); ``hparams`` override its
    hyperparameters; ``distributed`` replaces the plugins' distributed backend. ``run_dir`` is
    where metrics, checkpoints and TensorBoard files go (default ``runs/<name>-<time>``).
    ``plugins`` are extra plugin objects registered after the named ones (as pytest's
    ``pytest.main(plugins=...)``), each under its class name.

    Under ``hookdet run`` (:func:`hookdet.get_cluster_info` is not None) the run's experiment
    file, trial seed and run directory come from the cluster info, as Determined's ``init``
    takes them from the cluster.
    """
    with opened_run(hparams=hparams, exp_conf=exp_conf, distributed=distributed,
                    aggregation_frequency=aggregation_frequency, enable_tensorboard_logging=enable_tensorboard_logging,
                    run_dir=run_dir, model_dir=model_dir, plugins=plugins, trial_context=True) as run:
        yield run.context


@contextlib.contextmanager
def opened_run(
    *,
    hparams: Optional[Dict[str, Any]] = None,
    exp_conf: Union[Dict[str, Any], ExperimentConfig, None] = None,
    distributed: Optional[DistributedContext] = None,
    aggregation_frequency: int = 1,
    enable_tensorboard_logging: bool = True,
    run_dir: Union[str, Path, None] = None,
    model_dir: Union[str, Path, None] = None,
    plugins: Sequence[Any] = (),
    trial_context: bool = True,
    resume_from: Optional[str] = None,
) -> Iterator[Run]:
    """The run :func:`init` trains, opened for the ``with`` block (its plugins loaded, its ranks
    agreed, its directory owned and recorded as running) and recorded as ended after it. With
    ``trial_context`` it gets a :class:`PyTorchTrialContext`; the Core API
    (:mod:`hookdet.core`) opens one without, and reports through its own contexts; it names the
    checkpoint it continues from (``resume_from``) before the start is recorded, where
    ``Trainer.fit`` names it later."""
    info = cluster_info.get_cluster_info()
    cluster_info.report_hookdet_errors_in_one_line()
    config = _experiment_config(exp_conf, info)
    if config is not exp_conf and info is not None and info.task_type == "TRIAL" and run_dir is None:
        run_dir = info.run_dir  # hookdet run's: the script gave no experiment of its own
    if aggregation_frequency != 1:
        config.optimizations.aggregation_frequency = aggregation_frequency
    selection = plugin_selection_for(config, enable_tensorboard_logging)
    _refuse_one_process_for_several_slots(info, distributed, selection)
    manager = _plugin_manager_for(config, selection, plugins)
    trial_seed = info.trial.trial_seed if info is not None else config.trial_seed()
    seed_everything(trial_seed)
    run = Run(
        config=config,
        run_dir=Path(run_dir) if run_dir is not None else default_run_dir(config),
        plugins=manager,
        model_dir=Path(model_dir) if model_dir is not None else Path.cwd(),
        hparams=dict(hparams if hparams is not None else config.hyperparameters),
        trial_seed=trial_seed,
        plugin_names=tuple(manager.named_plugins()),
        removed_plugins=manager.removed,
        launch=selection.launch,
        resume_from=resume_from,
    )
    with _opened(run, distributed, selection, trial_context):
        yield run


def _refuse_one_process_for_several_slots(info: Any, distributed: Optional[DistributedContext],
                                          selection: PluginSelection) -> None:
    """A trial of several slots run as one process (an entrypoint without a launch layer, as
    Determined runs it) needs the script to form the group itself: refused before the run opens
    when it passed no ``distributed`` context, as Determined's ``core.init`` refuses it."""
    if info is None or info.task_type != "TRIAL" or distributed is not None or selection.launch.multi_process:
        return
    slots = sum(info.container_slot_counts)
    if slots > 1:
        raise UsageError(
            f"you must provide a valid DistributedContext for a multi-slot task: the trial has {slots} slots "
            "(resources.slots_per_trial) and this process is one of them; wrap the entrypoint in a launch layer "
            "('python3 -m determined.launch.torch_distributed python3 SCRIPT'), or start one worker per slot "
            "and pass each its own distributed=det.core.DistributedContext(rank=..., size=..., ...)"
        )


def _experiment_config(exp_conf: Any, info: Any) -> ExperimentConfig:
    """``exp_conf`` checked into an :class:`ExperimentConfig`; under ``hookdet run`` (a TRIAL
    cluster info) the experiment file it ran, unless the script passed a loaded config."""
    from hookdet.config import ExperimentConfig, parse_experiment_config  # pydantic: on first use

    if isinstance(exp_conf, ExperimentConfig):
        return exp_conf
    if info is not None and info.task_type == "TRIAL":
        return parse_experiment_config(info.trial.experiment_config, source="hookdet run's experiment file")
    return parse_experiment_config(exp_conf or {}, source="exp_conf")


@contextlib.contextmanager
def _opened(run: Run, distributed: Optional[DistributedContext], selection: PluginSelection,
            trial_context: bool) -> Iterator[None]:
    """The run configured, opened and (``trial_context``) given its context for the ``with``
    block; recorded as ended (or failed) and closed after it, whatever happened."""
    failed = False
    try:
        active_run.enter(run)
        run.plugins.start(run)
        try:
            _open(run, distributed, selection)
            if trial_context:
                run.context = PyTorchTrialContext(run)
            yield
        except BaseException as error:
            failed = True
            if run.prior_records is not None:  # the chief, once it recorded the start
                run_record.record_end(run, error)
            raise
        if run.is_chief:
            run_record.record_end(run, None)
    finally:
        try:
            run.hook.hookdet_unconfigure(run=run)
        finally:
            active_run.leave(run)
            if run.report_log is not None:
                run.report_log.close()
            if run.distributed is not None and distributed is None:
                run.distributed.close()
            ownership.give_up(run, discard=failed and not run_record.trained(run))


def _plugin_manager_for(config: ExperimentConfig, selection: PluginSelection, plugins: Sequence[Any]) -> PluginManager:
    """The selected plugins, loaded, and ``plugins`` registered after them under their class
    names; a ``plugin_config`` block for a plugin that will not run is refused first."""
    extra_names = [type(plugin).__name__ for plugin in plugins]
    problem = unused_plugin_config(config.plugin_config, [*selection.names, *extra_names], selection.may_join())
    if problem:
        raise PluginError(f"{config.source}: {problem}")
    manager = PluginManager(config.plugin_config, locate=config.plugin_config_location)
    manager.removed = selection.removed
    manager.load_all(selection.names)
    for name, plugin in zip(extra_names, plugins):
        manager.register(name, plugin)
    return manager


def _open(run: Run, distributed: Optional[DistributedContext], selection: PluginSelection) -> None:
    """Give the run its ranks, device, run directory (owned, recorded) and storage, every rank
    agreeing with the chief."""
    # A context the script made itself is offered to the plugins (ddp adopts a torch one).
    run.distributed = distributed
    made = run.hook.hookdet_make_distributed(run=run)
    run.distributed = distributed or made
    if selection.launch.multi_process and run.distributed.size == 1:
        raise PluginError(
            f"{run.config.source}: this process is one of {selection.launch.world_size} ranks, but "
            f"no plugin makes the run distributed: {selection.not_distributed_reason()}; add "
            "'ddp' (or another distributed plugin) to plugins, or train in one process"
        )
    run.run_dir = Path(run.distributed.broadcast(str(run.run_dir)))
    run.device = rank_device(run.distributed.local_rank)
    unusable = run.distributed.broadcast(run_record.unusable_records(run.run_dir) if run.is_chief else None)
    if unusable:
        raise UsageError(unusable)
    claim = ownership.take(run) if run.is_chief else None
    run.run_id = ownership.accept(run.distributed.broadcast(claim))
    if run.is_chief:
        run_record.record_start(run)
        run.report_log = ReportLog(run.run_dir)
    run.distributed.barrier()
    run.storage = make_storage(run.config.checkpoint_storage, run.run_dir)  # a type from the entry points
    problem = ownership.record(run) if run.is_chief else None
    ownership.raise_problem(run.distributed.broadcast(problem))


class Trainer:
    """Determined's ``pytorch.Trainer``: ``Trainer(trial, context).fit(...)``."""

    def __init__(self, trial: PyTorchTrial, context: PyTorchTrialContext) -> None:
        if not isinstance(trial, PyTorchTrial):
            raise TypeError(f"Trainer takes a PyTorchTrial, got {type(trial).__name__}")
        self.trial = trial
        self.context = context
        self.run: Run = run_of(context)
        self.run.trial = trial

    def configure_profiler(
        self,
        sync_timings: bool = True,
        enabled: bool = False,
        begin_on_batch: int = 0,
        end_after_batch: Optional[int] = None,
    ) -> None:
        """Determined's deprecated system-profiler switch (cluster-only; a no-op in Determined's
        local mode too): logs an error pointing at ``fit(..., profiling_enabled=True)``."""
        logger.error(
            "Trainer.configure_profiler has no effect (Determined replaced it with "
            "fit(..., profiling_enabled=True), which turns hookdet's profiler plugin on)"
        )

    def fit(
        self,
        checkpoint_period: Optional[TrainUnit] = None,
        validation_period: Optional[TrainUnit] = None,
        max_length: Optional[TrainUnit] = None,
        reporting_period: TrainUnit = Batch(100),
        checkpoint_policy: str = "best",
        latest_checkpoint: Optional[str] = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        profiling_enabled: bool = False,
    ) -> None:
        """Train; see Determined's ``Trainer.fit``.

        ``max_length`` defaults to the experiment file's ``searcher.max_length``.
        ``latest_checkpoint`` (a checkpoint directory, storage id or run directory) resumes
        exactly from it. ``profiling_enabled`` turns the profiler plugin on.

        Run bare (no :func:`hookdet.get_cluster_info`), ``checkpoint_policy="best"`` falls back
        to ``"all"`` with Determined's warning, as Determined's local training does; under
        ``hookdet run`` it checkpoints the best validations of ``searcher.metric``.
        """
        info = cluster_info.get_cluster_info()
        checkpoint_policy = _checkpoint_policy_here(checkpoint_policy, info)
        if info is not None and latest_checkpoint is None and info.latest_checkpoint is not None:
            logger.warning(
                "latest_checkpoint has not been configured. Pause/resume training will not be "
                "able to continue from latest checkpoint. Did you mean to set "
                "`fit(latest_checkpoint=info.latest_checkpoint)'?"
            )
        test_mode = test_mode or (info is not None and info.test_mode)  # hookdet run --test-mode
        max_length = max_length if max_length is not None else self._max_length_from_the_experiment()
        if profiling_enabled:
            self.run.plugins.ensure_provider("hookdet_set_profiler")
        if latest_checkpoint is not None:
            self.run.resume_from = str(latest_checkpoint)
        resuming = latest_checkpoint is not None  # what this call continues, not what it was offered
        if not resuming:  # Determined's warm start: a checkpoint's state, training from batch 0
            self.run.warm_start_from = self.run.config.searcher.source_checkpoint_uuid
        ownership.refuse_second_history(self.run, resuming)
        self._refuse_options_of_plugins_that_never_ran()
        try:
            TrainingLoop(self.run).fit(
                max_length=max_length,
                validation_period=validation_period,
                checkpoint_period=checkpoint_period,
                reporting_period=reporting_period,
                checkpoint_policy=checkpoint_policy,
                step_zero_validation=step_zero_validation,
                test_mode=test_mode,
            )
        except BaseException:
            self._note_how_training_ended("failed")
            raise
        self._note_how_training_ended(run_record.final_state(self.run))
        cluster_info.record_outcome(self.run)

    def _note_how_training_ended(self, state: str) -> None:
        """This process's outcome record tells how its training ended, and the checkpoint it left."""
        state_now = self.run.state
        outcome.note_training(state, state_now.latest_checkpoint, state_now.batches_trained)

    def _max_length_from_the_experiment(self) -> TrainUnit:
        max_length = fit_arguments(self.run.config, self.context)["max_length"]
        if max_length is None:
            raise ValueError(
                "Trainer.fit: max_length must be defined: pass max_length=Batch(n) or "
                "Epoch(n), or set searcher.max_length in the experiment file"
            )
        return max_length

    def _refuse_options_of_plugins_that_never_ran(self) -> None:
        """The trial's switches are known now: a ``plugin_config`` block for a plugin that is
        still not loaded would be ignored (a launch-dependent plugin's options may sit in a file
        that also runs single-process)."""
        loaded = [*self.run.plugins.named_plugins(), *DISTRIBUTED_PLUGINS]
        problem = unused_plugin_config(self.run.config.plugin_config, loaded)
        if problem:
            raise PluginError(f"{self.run.config.source}: {problem} (nor did the trial switch it on)")


def _checkpoint_policy_here(checkpoint_policy: str, info: Any) -> str:
    """Run bare, ``"best"`` falls back to ``"all"`` with Determined's own warning."""
    if info is None and checkpoint_policy == "best":
        logger.warning(
            "checkpoint_policy='best' is not supported in local training mode. "
            "Falling back to 'all'."
        )
        return "all"
    return checkpoint_policy


def fit_arguments(config: ExperimentConfig, context: PyTorchTrialContext) -> Dict[str, Any]:
    """``Trainer.fit`` arguments from an experiment file, as Determined's legacy harness maps them.

    ``searcher.max_length``, ``min_validation_period`` and ``min_checkpoint_period`` become
    ``Batch``/``Epoch`` lengths (records divide by the global batch size, rounding down as
    Determined does; an epoch is a pass over the training loader: like Determined 0.38's PyTorch
    harness, this ignores ``records_per_epoch``), ``scheduling_unit`` the reporting period,
    ``perform_initial_validation`` step-zero validation. The parity suite compares the mapping
    with Determined's (``tests/parity/test_parity_experiment_file.py``).
    """

    from hookdet.config import length_in_batches

    def as_unit(length: Any) -> Optional[TrainUnit]:
        if length is None:
            return None
        if length.unit == "batches":
            return Batch(length.value)
        global_batch_size = run_of(context).hparams.get("global_batch_size")
        if length.unit == "records":
            if not global_batch_size:
                raise ValueError("a length in records needs the 'global_batch_size' hyperparameter")
            return Batch(max(1, length_in_batches(length, global_batch_size=int(global_batch_size))))
        from hookdet.trial_api.trial import Epoch

        return Epoch(length.value)

    return {
        "max_length": as_unit(config.searcher.max_length),
        "validation_period": as_unit(config.min_validation_period),
        "checkpoint_period": as_unit(config.min_checkpoint_period),
        "reporting_period": Batch(config.scheduling_unit),
        "checkpoint_policy": config.checkpoint_policy,
        "step_zero_validation": config.perform_initial_validation,
    }
