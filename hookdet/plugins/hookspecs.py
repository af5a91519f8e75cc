"""Every hook hookdet emits, in the order the loop emits them.

The loop in :mod:`hookdet.loop.core_loop` knows no feature. It calls these hooks, and plugins — built
in or third party, each found by name through the ``hookdet.plugins`` entry-point group — answer
them. The order in which the loop emits them is the map in ``docs/hooks.md`` ("Where each hook
fires"), said there once; the specs below follow it.

Every spec ends by saying what an implementation may do with what it is given (Composer's rule
for its events): **Observes** (it reads; every implementation after it sees the same objects),
**May change** (and what: the answer replaces an object, or the object is changed in place), or
**Provides** (it answers with a new object and changes nothing it is given).

Two families live here. **Lifecycle hooks** carry exactly the names and arguments of Determined's
``PyTorchCallback``, so a callback and a plugin are written the same way (the ``callbacks`` plugin
adapts each callback one to one). **Mechanism hooks** are named ``hookdet_*`` by a grammar:
``hookdet_make_<thing>`` provides a component, ``hookdet_wrap_<thing>`` wraps a user object,
``hookdet_<phase>`` performs a step that plugins may replace or wrap, and ``*_end`` notifies.

A per-batch hook nobody implements costs nothing: the loop checks, before training, which
per-batch hooks have implementations and never calls the others. It does the same for the
training epoch hooks and ``on_training_workload_end``. The plugin manager counts registrations;
when a plugin registers (or unregisters) from any hook, the loop checks again before the next
batch, so a late implementation is called from the next batch on.

**Protocols.** Besides hooks, hookdet reads a plugin object through the typed protocols at the
end of this module: :class:`StatefulPlugin` (``state_dict``/``load_state_dict``, saved in every
checkpoint under the plugin's registered name: the checkpoint plugin walks the registered
plugins), :class:`ConflictingPlugin` (``conflicts_with``), :class:`ConfigurablePlugin` (an
``__init__`` taking ``options``) and :class:`TensorBoardWriter` (what
``hookdet_make_tensorboard_writer`` returns). Nothing else of a plugin is called by name.

Why one long module: it is the whole contract between the loop and its plugins, each hook with
the docstring a plugin author needs, read top to bottom in the loop's order, as pytest's
``hookspec.py`` is.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Tuple, runtime_checkable

from hookdet.markers import hookspec

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from hookdet.trial_api.context import PyTorchTrialContext
    from hookdet.loop.run import Run


# ---------------------------------------------------------------------------------------------
# Setup and teardown
# ---------------------------------------------------------------------------------------------


@hookspec
def hookdet_configure(run: "Run") -> None:
    """The run is about to start: read ``run.config`` and your options, check preconditions.

    Fires once per process, after every plugin named in the experiment file is registered and
    before the distributed backend, storage or trial exist. Raise here to refuse a run before any
    work is done (a missing optional dependency, an invalid option).

    **Observes** the run (raise to refuse it); changes only the plugin's own state.
    """


@hookspec
def hookdet_unconfigure(run: "Run") -> None:
    """The run is over (successfully or not): release files, writers, servers and handlers.

    Fires once per process, last, even when training raised.

    **Observes**; releases only what the plugin itself holds.
    """


# ---------------------------------------------------------------------------------------------
# Providers: one plugin answers (firstresult; for the precision, a second answer is refused)
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hookdet_make_distributed(run: "Run") -> Any:
    """Return the run's :class:`hookdet.distributed.context.DistributedContext`.

    The answer decides rank, size, the collectives the loop uses to average metrics, and the
    device. hookdet's own answer (tried last) is a single process. ``ddp`` answers with
    ``torch.distributed``, ``horovod`` with Horovod. When the script passed its own context to
    ``pytorch.init(distributed=...)`` it is already ``run.distributed``, and it stays the run's
    context whatever the answer; a plugin may adopt it (``ddp`` adopts a torch one to wrap models).

    **Provides** a new object; changes nothing it is given.
    """


@hookspec
def hookdet_make_precision(run: "Run") -> Any:
    """Return the run's precision (a :class:`hookdet.plugin.Precision`), or None.

    A run has one: when two plugins answer, the run is refused naming both (asked when the
    context is made and again whenever the trial switches one on), so precision plugins need no
    list of conflicts. No answer: float32. ``amp`` answers with native mixed precision, ``apex``
    with apex's opt levels. The context calls the answer for Determined's mixed-precision
    switches (``use_amp``, ``wrap_scaler``, ``configure_apex_amp``, ``autocast_forward_pass``),
    for each model and optimizer it wraps, and per batch for the backward pass and the optimizer
    step (:mod:`hookdet.trial_api.precision`). Answer with the same object every time.

    **Provides** a new object; changes nothing it is given.
    """


# ---------------------------------------------------------------------------------------------
# What the trial API asks of plugins (firstresult; the context calls these, nothing else)
#
# Each has a built-in answer, loaded by name from selection.DEFAULT_PROVIDERS when no registered plugin
# implements the hook, so the trial can switch a feature on that the experiment file did not list.
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hookdet_set_profiler(
    context: "PyTorchTrialContext", args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> Any:
    """``context.set_profiler(*args, **kwargs)`` (and ``Trainer.fit(profiling_enabled=True)``
    with ``args=None``): profile training; return the profiler (``context.profiler``).
    Built-in answer: ``profiler``.

    **Provides** a new object; changes nothing it is given.
    """


@hookspec(firstresult=True)
def hookdet_make_tensorboard_writer(run: "Run") -> Any:
    """Return the run's shared TensorBoard writer (a ``torch.utils.tensorboard.SummaryWriter``
    or anything with its ``add_scalar``/``flush``/``close``), for
    ``context.get_tensorboard_writer()``. Whether any plugin implements this is what
    ``context.get_enable_tensorboard_logging()`` reports. Built-in answer: ``tensorboard``.

    **Provides** a new object; changes nothing it is given.
    """


@hookspec(firstresult=True)
def hookdet_resume_point(run: "Run", checkpoint: str) -> Optional[int]:
    """Return the number of batches trained in ``checkpoint`` (where a resumed run starts), for
    ``context.get_initial_batch()``; may be asked before the checkpoint is restored. The plugin
    that answers ``hookdet_load_checkpoint`` answers this too (built-in: ``checkpoint``).

    **Observes**: reads the checkpoint, changes nothing.
    """


@hookspec(firstresult=True)
def hookdet_resume_uuid(run: "Run", checkpoint: str) -> Optional[str]:
    """Return the storage id of ``checkpoint`` (a run directory, checkpoint directory or storage
    id), read before its state is loaded: the ``checkpoint_uuid`` that ``on_trial_startup``
    gets, which Determined fires before the checkpoint loads. The checkpoint plugin answers.

    **Observes**: reads the checkpoint, changes nothing.
    """


@hookspec(firstresult=True)
def hookdet_resume_run_id(run: "Run", checkpoint: str) -> Optional[str]:
    """Return the run id recorded in ``checkpoint``'s metadata: the run that wrote it (None for
    a checkpoint that records none, Determined's). Fires on the chief only, before training
    starts, so that a run directory holding one run is never continued from another run's checkpoint
    (:mod:`hookdet.runs.ownership`). The checkpoint plugin answers.

    **Observes**: reads the checkpoint, changes nothing.
    """


@hookspec(firstresult=True)
def hookdet_add_callbacks(run: "Run", callbacks: Dict[str, Any]) -> Optional[bool]:
    """Run the trial's ``build_callbacks()`` result (name -> ``PyTorchCallback``) from now on;
    return True. Fires once, before checkpoint loading, when the trial built any. With the
    built-in answer removed (``no:callbacks``) they do not run and a warning says so.
    Built-in answer: ``callbacks``.

    **Observes** the callbacks (it calls them later); changes neither them nor the run.
    """


# ---------------------------------------------------------------------------------------------
# Wrapping the user's objects
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hookdet_wrap_model(
    model: "torch.nn.Module", context: "PyTorchTrialContext", options: Dict[str, Any]
) -> "torch.nn.Module":
    """Return the model the trial trains, given the one it passed to ``context.wrap_model``.

    ``options`` are the keyword arguments the trial passed to ``wrap_model`` (DDP options, for
    example). The default answer moves the model to the run's device. A ``wrapper=True``
    implementation may post-process the answer. The run's precision converts the final answer
    (autocast, say). The checkpoint stores the unwrapped model's state, so a wrapper never
    changes the saved keys.

    **May change** the model: the answer replaces it (moved, wrapped).
    """


@hookspec(firstresult=True)
def hookdet_wrap_optimizer(
    optimizer: "torch.optim.Optimizer",
    context: "PyTorchTrialContext",
    backward_passes_per_step: int,
    options: Dict[str, Any],
) -> "torch.optim.Optimizer":
    """Return the optimizer the trial steps, given the one passed to ``context.wrap_optimizer``.

    The default answer is the optimizer itself; Horovod answers with its ``DistributedOptimizer``.

    **May change** the optimizer: the answer replaces it.
    """


# ---------------------------------------------------------------------------------------------
# Per-batch steps (called only when some plugin implements or wraps them)
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hookdet_train_batch(
    trial: Any, batch: Any, epoch_idx: int, batch_idx: int
) -> Dict[str, Any]:
    """Run one training batch and return the trial's metrics dict.

    The default answer calls ``trial.train_batch``. Plugins wrap it (``wrapper=True``) to put a
    span around the whole step: a profiler range, a timer. Per batch; with no wrapper the loop
    calls the trial directly.

    **May change** the step: a wrapper runs around it and may alter its result.
    """


@hookspec
def hookdet_prepare_gradients(
    optimizer: "torch.optim.Optimizer", context: "PyTorchTrialContext"
) -> None:
    """Make ``optimizer``'s gradients final and true-scale before they are averaged and clipped.

    Fires inside ``context.step_optimizer`` on optimizer-step batches only, before gradient
    averaging, ``clip_grads`` and ``on_before_optimizer_step``, and before the run's precision
    unscales them: Horovod synchronizes its pending allreduces here.

    **May change** ``optimizer``'s gradients, in place.
    """


@hookspec(firstresult=True)
def hookdet_step_optimizer(
    optimizer: "torch.optim.Optimizer", context: "PyTorchTrialContext", scaler: Any
) -> Optional[bool]:
    """Apply one optimizer step; return True when done.

    ``scaler`` is the ``GradScaler`` the trial passed to ``step_optimizer`` (or None). The default
    answer is the run's precision's ``step`` (through that scaler when given, else
    ``optimizer.step()`` in float32); Horovod wraps it.

    **May change** the parameters: it steps them.
    """


@hookspec
def hookdet_train_batch_end(
    context: "PyTorchTrialContext", batch_idx: int, metrics: Dict[str, Any]
) -> None:
    """A training batch finished; ``metrics`` are the trial's values, still on the device.

    Per batch: never convert the metrics to Python numbers here (that forces a device→host
    sync). Progress bars advance, profilers step, loss scalers update.

    **Observes**: ``metrics`` are read, never changed (or converted).
    """


@hookspec
def hookdet_validation_batch_end(context: "PyTorchTrialContext", batch_idx: int) -> None:
    """A validation batch finished. Per batch, during validation only.

    **Observes**.
    """


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


@hookspec
def hookdet_report_metrics(
    run: "Run", group: str, steps_completed: int, metrics: Dict[str, Any]
) -> None:
    """Record reduced metrics: ``group`` is ``"training"`` or ``"validation"``.

    Fires on the chief only, at reporting boundaries, with plain JSON-serialisable values already
    averaged across ranks. ``steps_completed`` counts batches trained so far. The host has
    already recorded the report in the run's ``metrics.jsonl`` (:mod:`hookdet.runs.metrics`);
    TensorBoard, progress bars, MLflow and the non-finite watch (``metrics_log``) listen here.

    **Observes**: every listener gets the same ``metrics``; none changes them.
    """


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hookdet_save_checkpoint(run: "Run") -> Optional[str]:
    """Write a checkpoint of everything needed to resume exactly; return its storage id.

    Called on every rank (collecting every rank's RNG state is collective). The ``checkpoint``
    plugin answers; with it disabled no checkpoints are written and this returns None.

    **Observes** the run's state (it writes a copy); changes none of it.
    """


@hookspec(firstresult=True)
def hookdet_load_checkpoint(run: "Run", checkpoint: str) -> Optional[bool]:
    """Restore all state from ``checkpoint`` (a storage id or a directory) before training.

    Called on every rank before the first batch is drawn; returns True when it restored.

    **May change** all of the run's state: it restores it.
    """


@hookspec(firstresult=True)
def hookdet_warm_start(run: "Run", checkpoint: str) -> Optional[bool]:
    """Start a new run from ``checkpoint``'s state but not its place: models, optimizers, LR
    schedulers, plugins', callbacks' and RNG state, with the loop's counters left at batch 0
    (Determined's warm start, ``searcher.source_checkpoint_uuid``).

    Called on every rank before the first batch is drawn, when the run resumes from nothing;
    returns True when it loaded.

    **May change** the run's state (not its place): it restores it.
    """


# ---------------------------------------------------------------------------------------------
# Lifecycle hooks: Determined's PyTorchCallback, name for name, each with the run
#
# Every lifecycle hook also gets ``run``; pluggy passes an implementation only the arguments it
# names, so a Determined-shaped implementation without ``run`` works unchanged.
# ---------------------------------------------------------------------------------------------


@hookspec
def on_trial_startup(run: "Run", first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
    """The trial is built; ``first_batch_idx`` is where training resumes (0 for a fresh run) and
    ``checkpoint_uuid`` the checkpoint it resumes from. As in Determined, the data loaders are
    built and the checkpoint is loaded after this hook (``run.max_batches`` is still None).

    **Observes**.
    """


@hookspec
def on_training_start(run: "Run") -> None:
    """Training is about to draw its first batch (after any step-zero validation).

    **Observes**.
    """


@hookspec
def on_training_epoch_start(run: "Run", epoch_idx: int) -> None:
    """The first batch of epoch ``epoch_idx`` is about to be trained.

    **Observes**.
    """


@hookspec
def on_training_epoch_end(run: "Run", epoch_idx: int) -> None:
    """The last batch of epoch ``epoch_idx`` has been trained.

    **Observes**.
    """


@hookspec
def on_training_workload_end(
    run: "Run", avg_metrics: Dict[str, Any], batch_metrics: List[Dict[str, Any]]
) -> None:
    """A training workload ended: ``batch_metrics`` its per-batch values (across ranks, their
    means), ``avg_metrics`` the means over its batches, in Determined's types (numpy arrays,
    Python floats; see :mod:`hookdet.metrics.callback_metrics`).

    **Observes**: ``avg_metrics`` and ``batch_metrics`` are read, never changed.
    """


@hookspec
def on_validation_start(run: "Run") -> None:
    """Validation is about to start.

    **Observes**.
    """


@hookspec
def on_validation_epoch_start(run: "Run") -> None:
    """The first validation batch is about to be evaluated.

    **Observes**.
    """


@hookspec
def on_validation_epoch_end(run: "Run", outputs: List[Any]) -> None:
    """All validation batches were evaluated; ``outputs`` are this rank's per-batch results
    (tensors as numpy arrays, as in Determined).

    As in Determined, neither this nor ``on_validation_epoch_start`` fires for a trial that
    validates with ``evaluate_full_dataset``.

    **Observes** ``outputs``.
    """


@hookspec
def on_validation_end(run: "Run", metrics: Dict[str, Any]) -> None:
    """Validation finished with the reduced ``metrics`` (numpy values, as in Determined).

    **Observes** ``metrics``.
    """


@hookspec
def on_checkpoint_load_start(run: "Run", checkpoint: Dict[str, Any]) -> None:
    """A checkpoint's state dict was loaded and is about to be applied; it may be changed.

    **May change** ``checkpoint``, the state about to be applied (as a Determined callback may).
    """


@hookspec
def on_checkpoint_save_start(run: "Run", checkpoint: Dict[str, Any]) -> None:
    """A checkpoint's state dict is about to be written; keys may be added. Chief only.

    **May change** ``checkpoint``: add keys to what is written (as a Determined callback may).
    """


@hookspec
def on_checkpoint_write_end(run: "Run", checkpoint_dir: str) -> None:
    """The checkpoint is written: ``checkpoint_dir`` is the published checkpoint directory (it
    exists during the hook and after it); files added here are sealed into its manifest. With a
    background write this fires when the write has finished. Chief only.

    **May change** the checkpoint's files: add files to ``checkpoint_dir`` before it is sealed.
    """


@hookspec
def on_checkpoint_upload_end(run: "Run", uuid: str) -> None:
    """The checkpoint is committed to storage as ``uuid``.

    **Observes**.
    """


@hookspec
def on_checkpoint_end(run: "Run", checkpoint_dir: str) -> None:
    """Checkpointing finished; ``checkpoint_dir`` is where its files were written.

    **Observes**.
    """


@hookspec
def on_before_optimizer_step(run: "Run", parameters: List["torch.nn.Parameter"]) -> None:
    """The optimizer is about to step ``parameters``; their gradients are final (averaged,
    unscaled, clipped).

    **May change** the gradients of ``parameters`` (clip them), in place.
    """


@hookspec
def on_trial_shutdown(run: "Run") -> None:
    """The trial is shutting down, whether training finished, stopped or raised.

    **Observes**; releases only what the implementation itself holds.
    """


# ---------------------------------------------------------------------------------------------
# Protocols: what hookdet reads of a plugin object besides its hook implementations
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class StatefulPlugin(Protocol):
    """A plugin with state to resume: saved in every checkpoint under the plugin's registered
    name (``plugins.<name>`` in ``state_dict.pth``) and restored before ``on_trial_startup``.
    Values must load with ``torch.load(weights_only=True)`` (tensors, numbers, strings, lists,
    dicts)."""

    def state_dict(self) -> Dict[str, Any]:
        """The plugin's state, plain values and tensors only (it loads with ``weights_only``)."""

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, before training resumes."""


@runtime_checkable
class ConflictingPlugin(Protocol):
    """A plugin that cannot run beside others: registering both is refused, naming the two."""

    conflicts_with: Tuple[str, ...]


class ConfigurablePlugin(Protocol):
    """A plugin class whose ``__init__`` takes ``options``: it receives ``plugin_config.<name>``
    (an empty dict when absent) and raises :class:`hookdet.plugin.PluginError` for a bad one."""

    def __init__(self, options: Dict[str, Any]) -> None: ...


@runtime_checkable
class TensorBoardWriter(Protocol):
    """What ``hookdet_make_tensorboard_writer`` returns and the trial may call
    (``torch.utils.tensorboard.SummaryWriter`` is one)."""

    def add_scalar(self, tag: str, scalar_value: Any, global_step: Optional[int] = None) -> Any:
        """Record one scalar under ``tag`` at ``global_step``."""

    def flush(self) -> None:
        """Write what is pending to storage."""

    def close(self) -> None:
        """Flush and release the writer."""


#: Hooks the loop may call on every batch; it calls one only when some plugin implements it.
PER_BATCH_HOOKS = (
    "hookdet_train_batch",
    "hookdet_prepare_gradients",
    "hookdet_step_optimizer",
    "hookdet_train_batch_end",
    "hookdet_validation_batch_end",
    "on_before_optimizer_step",
)

#: Lifecycle hooks that fire on the chief rank only, as in Determined.
CHIEF_ONLY_HOOKS = ("on_checkpoint_save_start", "on_checkpoint_write_end", "hookdet_resume_run_id")

#: Hooks that answer a call of the trial's own (``context.wrap_scaler(...)``, ...): an exception
#: raised in them reaches the trial as raised (it is the answer to the trial's call, as a method's
#: would be), not re-raised as a ``PluginError``.
TRIAL_API_HOOKS = (
    "hookdet_add_callbacks",
    "hookdet_set_profiler",
    "hookdet_make_tensorboard_writer",
    "hookdet_resume_point",
)
