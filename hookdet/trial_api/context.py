"""``PyTorchTrialContext``: what a trial uses to register models, step optimizers, read settings.

Every feature-specific call (``set_profiler``, ``get_tensorboard_writer``, ``get_initial_batch``)
is a provider hook in :mod:`hookdet.plugins.hookspecs`; its built-in answer is loaded when no
running plugin implements it. The mixed-precision calls (``experimental.use_amp``,
``wrap_scaler``, ``configure_apex_amp``, ``autocast_forward_pass``) go to the run's one precision
(:mod:`hookdet.trial_api.precision`), which also makes the backward pass and the optimizer step.

Why one long module: Determined's ``PyTorchTrialContext`` is one class of some forty public
methods a trial calls (each short), and its name and shape are Determined's to keep.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Union

import torch

from hookdet.data.batch_moving import to_device as _to_device
from hookdet.errors import ArgumentTypeError
from hookdet.trial_api.lr_scheduler import LRScheduler
from hookdet.trial_api.precision import Precision, precision_for_call, precision_of
from hookdet.metrics.reducers import MetricReducer, ReducerRegistry
# up: the run's stash key for set_enable_tensorboard_logging, which the loop reads
from hookdet.loop.run import TENSORBOARD_METRICS

if TYPE_CHECKING:  # pragma: no cover
    from hookdet.loop.run import Run

logger = logging.getLogger("hookdet")


class PyTorchExperimentalContext:
    """``context.experimental``: switches that Determined marks experimental."""

    def __init__(self, context: "PyTorchTrialContext") -> None:
        self._context = context
        self._auto_to_device = True
        self._data_repro_checks = True

    def use_amp(self) -> None:
        """Train with automatic mixed precision: the ``amp`` plugin autocasts forward passes,
        scales the loss in ``backward`` and steps optimizers through its ``GradScaler``."""
        context = self._context
        precision_for_call(context._run, "use_amp").use_amp(context)
        context._bind_hooks()

    def use_plugin(self, name: str) -> Any:
        """Switch on the installed plugin ``name`` from the trial (as ``use_amp`` does for
        ``amp``) when the experiment file did not list it; returns the plugin object."""
        return self._context._run.plugins.load(name)

    def disable_dataset_reproducibility_checks(self) -> None:
        """Allow plain ``torch.utils.data.DataLoader``s (resume is then not exact for them)."""
        self._data_repro_checks = False

    def disable_auto_to_device(self) -> None:
        """Leave batches where the loader put them; the trial moves them itself."""
        self._auto_to_device = False

    def reset_reducers(self) -> None:
        """Reset the training reducers (the loop does this before each training workload)."""
        self._context._reducers.reset_all(for_training=True)


class PyTorchTrialContext:
    """Determined's trial context, backed by a :class:`hookdet.loop.run.Run`."""

    def __init__(self, run: "Run") -> None:
        self._run = run
        self.distributed = run.distributed
        self.device = run.device
        self.experimental = PyTorchExperimentalContext(self)
        self.models: List[torch.nn.Module] = []
        self.unwrapped_models: List[torch.nn.Module] = []
        self.optimizers: List[torch.optim.Optimizer] = []
        self._original_optimizers: Dict[int, torch.optim.Optimizer] = {}
        self.lr_schedulers: List[LRScheduler] = []
        self.scalers: List[Any] = []
        self.profiler: Any = None  # the torch.profiler.profile of set_profiler (Determined's attribute)
        self._reducers = ReducerRegistry()
        self._stop_requested = False
        self._current_batch_idx = 0  # the batch being trained: the loop sets it before train_batch
        # id(wrapped optimizer) -> the batch it last stepped in (-1: none yet), for the
        # once-per-batch rule; only wrap_optimizer adds keys, so it also spots an unwrapped one.
        self._last_step_batch: Dict[int, int] = {}
        # id(wrapped optimizer) -> whether its aggregated gradients are averaged (wrap_optimizer).
        self._averages_gradients: Dict[int, bool] = {}
        optimizations = run.config.optimizations
        self._aggregation_frequency = int(optimizations.aggregation_frequency)
        self._average_aggregated_gradients = bool(optimizations.average_aggregated_gradients)
        self._bind_hooks()

    def _bind_hooks(self) -> None:
        """Decide once which per-step hooks have implementations, and whether the run's precision
        takes part in its steps; the others are never called.

        Called again after every mixed-precision switch and wrap, and by the loop before
        training, after the trial may have loaded plugins.
        """
        implemented = self._run.plugins.implemented
        self._precision = precision_of(self._run)
        self._precision_steps = self._precision.changes_steps
        self._call_prepare_gradients = implemented("hookdet_prepare_gradients")
        self._call_step_hook = implemented("hookdet_step_optimizer")
        self._call_before_step = implemented("on_before_optimizer_step")
        # Every batch steps, and nothing takes part: step_optimizer can call optimizer.step() as is.
        self._plain_steps = self._aggregation_frequency == 1 and not (
            self._call_prepare_gradients or self._call_step_hook or self._call_before_step
            or self._precision_steps
        )

    @property
    def precision(self) -> Precision:
        """The run's precision (hookdet's; Determined has no such attribute): what makes this
        context's backward passes and optimizer steps, and converts what it wraps."""
        return self._precision

    # ------------------------------------------------------------------ settings and identity

    def get_hparams(self) -> Dict[str, Any]:
        """All hyperparameters."""
        return dict(self._run.hparams)

    def get_hparam(self, name: str) -> Any:
        """One hyperparameter; a missing name is an error that lists the known ones."""
        if name not in self._run.hparams:
            raise ValueError(
                f"get_hparam: no hyperparameter {name!r}; the experiment defines "
                f"{sorted(self._run.hparams)}"
            )
        return self._run.hparams[name]

    def get_experiment_config(self) -> Dict[str, Any]:
        """The experiment file as a plain dict."""
        return self._run.config.to_dict()

    def get_data_config(self) -> Dict[str, Any]:
        """The experiment file's ``data`` block."""
        return dict(self._run.config.data or {})

    def get_experiment_id(self) -> int:
        """Locally there is one experiment: 1 (the CLI and checkpoints record the run instead)."""
        return 1

    def get_trial_id(self) -> int:
        """The trial's number in the search that runs it; 1 for a local run (its one trial)."""
        from hookdet.config import current_trial_id

        return current_trial_id()

    def get_trial_seed(self) -> int:
        """The seed derived from ``reproducibility.experiment_seed`` (applied before the trial)."""
        return self._run.trial_seed

    def get_global_batch_size(self) -> int:
        """The ``global_batch_size`` hyperparameter: records per step across all ranks."""
        if "global_batch_size" not in self._run.hparams:
            raise ValueError(
                "get_global_batch_size: the experiment's hyperparameters have no "
                "'global_batch_size'"
            )
        return int(self._run.hparams["global_batch_size"])

    def get_per_slot_batch_size(self) -> int:
        """The batch size one rank loads: global batch size divided by the number of ranks."""
        global_size, ranks = self.get_global_batch_size(), self.distributed.size
        if global_size % ranks:
            raise ValueError(
                f"global_batch_size {global_size} is not divisible by the {ranks} slots"
            )
        return global_size // ranks

    def get_initial_batch(self) -> int:
        """The batch training starts from: 0, or the resume point.

        Known as soon as the run has a checkpoint to resume (``hookdet run --resume``, or
        ``Trainer.fit(latest_checkpoint=...)`` before the data loaders are built); the
        checkpoint plugin reads it from the checkpoint's metadata until the checkpoint is loaded.
        """
        run = self._run
        if not run.resume_from:
            return 0
        return int(run.hook.hookdet_resume_point(run=run, checkpoint=run.resume_from) or 0)

    def set_enable_tensorboard_logging(self, enable_tensorboard_logging: bool) -> None:
        """Whether reported metrics go to TensorBoard: True switches a TensorBoard writer
        provider on (the built-in ``tensorboard`` when the experiment did not list one), False
        stops reported metrics being written (``get_tensorboard_writer()`` still works)."""
        if not isinstance(enable_tensorboard_logging, bool):
            raise ArgumentTypeError(
                "set_enable_tensorboard_logging takes a bool, got "
                f"{enable_tensorboard_logging!r}"
            )
        if enable_tensorboard_logging:
            self._run.plugins.ensure_provider("hookdet_make_tensorboard_writer")
        self._run.stash[TENSORBOARD_METRICS] = enable_tensorboard_logging

    def get_enable_tensorboard_logging(self) -> bool:
        """Whether reported metrics are written to TensorBoard: a running plugin provides a
        TensorBoard writer and ``set_enable_tensorboard_logging(False)`` was not called."""
        return self._run.stash.get(TENSORBOARD_METRICS, True) and self._run.plugins.implemented("hookdet_make_tensorboard_writer")

    def get_tensorboard_path(self) -> Any:
        """The directory TensorBoard files go to (inside the run directory; never None)."""
        return self._run.tensorboard_dir

    def get_tensorboard_writer(self) -> Any:
        """A ``SummaryWriter`` writing into :meth:`get_tensorboard_path` (the tensorboard plugin's)."""
        return self._run.plugins.provide("hookdet_make_tensorboard_writer", run=self._run)

    def set_profiler(self, *args: Any, **kwargs: Any) -> None:
        """Profile training with ``torch.profiler.profile(*args, **kwargs)`` (the profiler plugin)."""
        self.profiler = self._run.plugins.provide(
            "hookdet_set_profiler", context=self, args=args, kwargs=kwargs
        )

    # ------------------------------------------------------------------ stopping

    def get_stop_requested(self) -> bool:
        """Whether training will stop after the current batch."""
        return self._stop_requested

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask training to checkpoint and stop after the current batch."""
        if not isinstance(stop_requested, bool):
            raise ArgumentTypeError(f"set_stop_requested takes a bool, got {stop_requested!r}")
        self._stop_requested = stop_requested

    # ------------------------------------------------------------------ position in training

    def current_train_batch(self) -> int:
        """The index of the batch being trained (after training: the last batch's index)."""
        return self._current_batch_idx

    def current_train_epoch(self) -> int:
        """The epoch of the batch being trained."""
        length = self._run.state.epoch_length
        return self._current_batch_idx // length if length else 0

    def is_epoch_start(self) -> bool:
        """Whether the current batch is the first of its epoch."""
        length = self._run.state.epoch_length
        return bool(length) and self._current_batch_idx % length == 0

    def is_epoch_end(self) -> bool:
        """Whether the current batch is the last of its epoch."""
        length = self._run.state.epoch_length
        return bool(length) and (self._current_batch_idx + 1) % length == 0

    # ------------------------------------------------------------------ wrapping

    def wrap_model(self, model: torch.nn.Module, **options: Any) -> torch.nn.Module:
        """Register ``model`` for device placement, distribution and checkpoints; use the result.

        Keyword arguments go to the plugin that wraps the model (DDP's ``find_unused_parameters``,
        for example).
        """
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"wrap_model takes a torch.nn.Module, got {type(model).__name__}")
        wrapped = self._run.hook.hookdet_wrap_model(model=model, context=self, options=options)
        wrapped = precision_of(self._run).convert_model(wrapped, self)
        self.unwrapped_models.append(model)
        self.models.append(wrapped)
        self._bind_hooks()
        return wrapped

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        backward_passes_per_step: int = 1,
        fp16_compression: Optional[bool] = None,
        average_aggregated_gradients: Optional[bool] = None,
        **options: Any,
    ) -> torch.optim.Optimizer:
        """Register ``optimizer`` for stepping and checkpoints; use the result.

        ``average_aggregated_gradients`` (default: the experiment's
        ``optimizations.average_aggregated_gradients``) says whether this optimizer's gradients,
        summed over an ``aggregation_frequency`` window, are divided by the window before it
        steps. ``fp16_compression`` (default: ``optimizations.gradient_compression``) compresses
        Horovod's all-reduce; without Horovod it has no effect, as in Determined.
        """
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"wrap_optimizer takes a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        for name, value in (
            ("fp16_compression", fp16_compression),
            ("average_aggregated_gradients", average_aggregated_gradients),
        ):
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"wrap_optimizer: {name} must be True, False or None, got {value!r}")
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step < 1:
            raise ValueError(
                "wrap_optimizer: backward_passes_per_step for local gradient aggregation must be "
                f"an int >= 1; got {backward_passes_per_step!r}"
            )
        if fp16_compression is not None:
            options = {**options, "fp16_compression": fp16_compression}
        wrapped = self._run.hook.hookdet_wrap_optimizer(
            optimizer=optimizer,
            context=self,
            backward_passes_per_step=backward_passes_per_step,
            options=options,
        )
        wrapped = precision_of(self._run).convert_optimizer(wrapped, self)
        self.optimizers.append(wrapped)
        self._original_optimizers[id(wrapped)] = optimizer
        self._last_step_batch[id(wrapped)] = -1
        self._averages_gradients[id(wrapped)] = (
            self._average_aggregated_gradients
            if average_aggregated_gradients is None
            else average_aggregated_gradients
        )
        return wrapped

    def wrap_lr_scheduler(
        self,
        lr_scheduler: Any,
        step_mode: LRScheduler.StepMode,
        frequency: int = 1,
    ) -> Any:
        """Register ``lr_scheduler`` to be stepped by the loop per ``step_mode``; returns it.

        Its optimizer must be one :meth:`wrap_optimizer` returned (or was given), as Determined
        requires: the loop steps only those."""
        wrapped = LRScheduler(lr_scheduler, step_mode, frequency)
        optimizer = getattr(lr_scheduler, "optimizer", None)
        known = [*self.optimizers, *self._original_optimizers.values()]
        if optimizer is not None and not any(optimizer is candidate for candidate in known):
            raise ValueError(
                f"wrap_lr_scheduler: {type(lr_scheduler).__name__}'s optimizer was not wrapped; "
                "must use an optimizer that is returned by wrap_optimizer()"
            )
        self.lr_schedulers.append(wrapped)
        return lr_scheduler

    def wrap_scaler(self, scaler: Any) -> Any:
        """Register a ``torch.amp.GradScaler`` (the amp plugin); returns it."""
        registered = precision_for_call(self._run, "wrap_scaler").wrap_scaler(self, scaler)
        self._bind_hooks()
        return registered

    def configure_apex_amp(
        self,
        models: Union[torch.nn.Module, List[torch.nn.Module]],
        optimizers: Union[torch.optim.Optimizer, List[torch.optim.Optimizer]],
        enabled: Optional[bool] = True,
        opt_level: Optional[str] = "O1",
        cast_model_type: Optional[torch.dtype] = None,
        patch_torch_functions: Optional[bool] = None,
        keep_batchnorm_fp32: Optional[Union[bool, str]] = None,
        master_weights: Optional[bool] = None,
        loss_scale: Optional[Union[float, str]] = None,
        cast_model_outputs: Optional[torch.dtype] = None,
        num_losses: Optional[int] = 1,
        verbosity: Optional[int] = 1,
        min_loss_scale: Optional[float] = None,
        max_loss_scale: Optional[float] = 2.0**24,
    ) -> Any:
        """Determined's apex configuration (the apex plugin; torch.amp when apex is absent)."""
        named = dict(
            enabled=enabled,
            opt_level=opt_level,
            cast_model_type=cast_model_type,
            patch_torch_functions=patch_torch_functions,
            keep_batchnorm_fp32=keep_batchnorm_fp32,
            master_weights=master_weights,
            loss_scale=loss_scale,
            cast_model_outputs=cast_model_outputs,
            num_losses=num_losses,
            verbosity=verbosity,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
        )
        precision = precision_for_call(self._run, "configure_apex_amp")
        configured = precision.configure_apex_amp(self, models, optimizers, **named)
        self._bind_hooks()
        return configured

    def autocast_forward_pass(self, to_wrap: torch.nn.Module) -> torch.nn.Module:
        """Run ``to_wrap``'s forward under autocast and return its half-precision outputs as
        float32 (what ``experimental.use_amp()`` does to wrapped models); the amp plugin's dtype
        and device. Unlike Determined's, the module itself is patched and returned, not a copy."""
        return precision_for_call(self._run, "autocast_forward_pass").autocast_forward_pass(self, to_wrap)

    def wrap_reducer(
        self,
        reducer: Union[Callable, MetricReducer],
        name: Optional[str] = None,
        for_training: bool = True,
        for_validation: bool = True,
    ) -> Any:
        """Register a custom metric reducer; see :class:`hookdet.metrics.reducers.ReducerRegistry`."""
        return self._reducers.wrap(reducer, name, for_training, for_validation)

    def reset_reducers(self) -> None:
        """Reset every reducer registered with :meth:`wrap_reducer` (the loop does this before
        each workload)."""
        self._reducers.reset_all()

    def reduce_metrics(self, for_training: bool) -> Dict[str, Any]:
        """Reduce the reducers of training (True) or validation (False) across ranks, as the loop
        does at a reporting boundary: ``{metric: value}``, each value as ``cross_slot_reduce``
        returned it (as in Determined); does not reset them."""
        return self._reducers.reduce(for_training, allgather=self.distributed.allgather, plain=False)

    def run_cross_slot_reduction(
        self, reducables: List[MetricReducer], gathered: List[Any]
    ) -> Dict[str, Any]:
        """Combine per-rank values into metrics: ``gathered[rank][i]`` is rank ``rank``'s
        ``per_slot_reduce()`` of ``reducables[i]`` (reducers returned by :meth:`wrap_reducer`).
        :meth:`reduce_metrics` gathers and calls this; Determined exposes the step too."""
        return self._reducers.cross_slot_reduce(reducables, gathered)

    def to_device(self, data: Any) -> Any:
        """Move ``data`` (any nesting of tensors) to this rank's device."""
        return _to_device(data, self.device)

    # ------------------------------------------------------------------ the training step

    def backward(
        self,
        loss: torch.Tensor,
        gradient: Optional[torch.Tensor] = None,
        retain_graph: bool = False,
        create_graph: bool = False,
    ) -> None:
        """Compute gradients of ``loss``; use this instead of ``loss.backward()``."""
        if self._precision_steps:
            kwargs = {"gradient": gradient, "retain_graph": retain_graph, "create_graph": create_graph}
            self._precision.backward(loss, self, kwargs)
        else:
            loss.backward(gradient=gradient, retain_graph=retain_graph, create_graph=create_graph)

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        clip_grads: Optional[Callable[[Iterator[torch.nn.Parameter]], None]] = None,
        auto_zero_grads: bool = True,
        scaler: Optional[Any] = None,
    ) -> None:
        """Step ``optimizer`` on batches that end an aggregation window; call it every batch.

        Gradients are averaged over the window (``average_aggregated_gradients``), passed to
        ``clip_grads`` as a list of parameters, then the optimizer steps and (by default) zeroes
        them. Call once per optimizer per batch.
        """
        key, batch_idx = id(optimizer), self._current_batch_idx
        last_step_batch = self._last_step_batch.get(key)
        if last_step_batch is None or last_step_batch == batch_idx:
            self._refuse_step(last_step_batch)
        self._last_step_batch[key] = batch_idx
        if self._plain_steps and clip_grads is None and scaler is None:
            optimizer.step()
        elif not self._step_with_extras(optimizer, batch_idx, clip_grads, scaler):
            return  # inside an aggregation window: the gradients keep accumulating
        if auto_zero_grads:
            optimizer.zero_grad()

    @staticmethod
    def _refuse_step(last_step_batch: Optional[int]) -> None:
        """Raise for an optimizer never wrapped (no last step recorded) or stepped twice in a batch."""
        if last_step_batch is None:
            raise ValueError("step_optimizer: the optimizer was not passed through wrap_optimizer")
        raise RuntimeError(
            "step_optimizer was called twice for the same optimizer in one batch; "
            "call it once per optimizer per batch"
        )

    def _step_with_extras(
        self,
        optimizer: torch.optim.Optimizer,
        batch_idx: int,
        clip_grads: Optional[Callable[[Iterator[torch.nn.Parameter]], None]],
        scaler: Optional[Any],
    ) -> bool:
        """``step_optimizer`` with aggregation, clipping, a scaler or step hooks; returns whether
        the optimizer stepped (not inside an aggregation window)."""
        if (batch_idx + 1) % self._aggregation_frequency:
            return False
        if self._call_prepare_gradients:
            self._run.hook.hookdet_prepare_gradients(optimizer=optimizer, context=self)
        if self._precision_steps:
            self._precision.unscale_gradients(optimizer, self)
        averaging = self._aggregation_frequency > 1 and self._averages_gradients[id(optimizer)]
        if clip_grads is not None or averaging or self._call_before_step:
            parameters = [p for group in optimizer.param_groups for p in group["params"]]
            if averaging:
                grads = [p.grad for p in parameters if p.grad is not None]
                if grads:
                    torch._foreach_div_(grads, float(self._aggregation_frequency))
            if clip_grads is not None:
                clip_grads(parameters)
            if self._call_before_step:
                self._run.hook.on_before_optimizer_step(run=self._run, parameters=parameters)
        if self._call_step_hook:
            self._run.hook.hookdet_step_optimizer(optimizer=optimizer, context=self, scaler=scaler)
        elif self._precision_steps:
            self._precision.step(optimizer, self, scaler)
        elif scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()
        return True

    def _end_batch(self, batch_idx: int, epoch_ended: bool, epoch_idx: int) -> None:
        """Loop bookkeeping after ``train_batch``: step the schedulers, in the order they were
        wrapped, as Determined does.

        Only on a batch whose optimizer step ran (the last of an aggregation window): then a
        ``STEP_EVERY_BATCH`` scheduler steps once for each batch of the window its frequency
        counts, a ``STEP_EVERY_EPOCH`` one once for each epoch that ends before the next
        optimizer step, and a ``STEP_EVERY_OPTIMIZER_STEP`` one, if its optimizer stepped, every
        ``frequency`` optimizer steps (Determined counts batches there, its bug). The counts
        derive from the batch index, so they need no state of their own to resume exactly.

        First, on every batch, the run's precision ends the batch when it takes part in steps.
        """
        if self._precision_steps:
            self._precision.batch_end(self)
        aggregation = self._aggregation_frequency
        if (batch_idx + 1) % aggregation:
            return
        epoch_length = self._run.state.epoch_length
        for wrapped in self.lr_schedulers:
            mode, frequency = wrapped.step_mode, wrapped.frequency
            if mode is LRScheduler.StepMode.STEP_EVERY_BATCH:
                window = range(batch_idx - aggregation + 1, batch_idx + 1)
                steps = sum(1 for index in window if (index + 1) % frequency == 0)
            elif mode is LRScheduler.StepMode.STEP_EVERY_EPOCH:
                if aggregation == 1:
                    steps = int(epoch_ended and (epoch_idx + 1) % frequency == 0)
                else:
                    epochs = range(batch_idx // epoch_length, (batch_idx + aggregation) // epoch_length)
                    steps = sum(1 for epoch in epochs if (epoch + 1) % frequency == 0)
            elif mode is LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP:
                optimizer_steps = (batch_idx + 1) // aggregation
                steps = int(self._optimizer_stepped(wrapped, batch_idx) and optimizer_steps % frequency == 0)
            else:
                steps = 0
            for _ in range(steps):
                wrapped.step()

    def _optimizer_stepped(self, wrapped: Any, batch_idx: int) -> bool:
        """Whether the optimizer ``wrapped`` schedules went through ``step_optimizer`` this batch."""
        scheduled = getattr(wrapped.scheduler, "optimizer", None)
        for optimizer in self.optimizers:
            if scheduled is optimizer or scheduled is self._original_optimizers.get(id(optimizer)):
                return self._last_step_batch.get(id(optimizer)) == batch_idx
        return False


def run_of(context: PyTorchTrialContext) -> "Run":
    """The :class:`hookdet.loop.run.Run` behind a trial context: the documented way for trial code,
    the host and tests to reach the run (``hookdet.plugin.run_of(self.context)``)."""
    return context._run
