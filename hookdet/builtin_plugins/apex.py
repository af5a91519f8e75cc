"""``context.configure_apex_amp``: apex's opt levels, on NVIDIA apex when it runs, else on torch.amp.

Determined hands ``configure_apex_amp`` straight to ``apex.amp.initialize`` and refuses to run
without CUDA. hookdet uses NVIDIA apex when it imports and CUDA is present; everywhere else
(every CPU machine, any box without apex) it runs the same opt levels on PyTorch's own mixed
precision, so a Determined trial calling ``configure_apex_amp`` runs unmodified:

* **O0** — float32: the model is checked/cast to float32, inputs cast to float32.
* **O1** — the forward runs under ``torch.autocast`` (apex patches torch functions instead);
  outputs in reduced precision come back as float32, so the loss runs in float32 as apex's
  float32 function list would make it. Dynamic loss scaling.
* **O2** — the model is cast to half precision except batch norm (kept float32), inputs are cast
  to half and outputs to float32; each optimizer holds float32 master weights, and the model is
  refreshed from them after every step. Dynamic loss scaling.
* **O3** — the whole model in half precision; loss scale 1.

Half precision is float16 on CUDA and bfloat16 elsewhere (``plugin_config.apex.dtype`` chooses;
an explicit ``cast_model_type`` is honoured as given). The keyword overrides behave as apex's:
the opt level sets defaults, any argument that is not None overrides it, and the combinations
apex refuses are refused here with one error naming the argument.

Loss scaling follows apex's ``LossScaler``: dynamic scales start at ``min(2**16,
max_loss_scale)``, halve on an overflow (never below ``min_loss_scale``) and skip that step, and
double after 2000 clean backward passes (never above ``max_loss_scale``); a fixed ``loss_scale``
never changes and never skips. Gradients are unscaled after each backward pass, so with
``num_losses > 1`` each loss keeps its own scale. As in Determined, the n-th distinct loss passed
to ``context.backward`` within a batch is loss id n; with ``num_losses=1`` every loss shares one
scale (apex's documented behaviour; Determined 0.38 raises on a second backward instead).

Deciding whether to skip a step reads one flag from the device per optimizer step, as apex and
``GradScaler`` do; nothing else here waits on the device per batch. Scales, growth counters and
master weights are checkpointed through the plugin's state, so resuming is bitwise exact.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from hookdet.mixed_precision import (
    autocast_forward,
    cast_tensors,
    dtype_name,
    patch_forward,
    read_dtype_option,
    resolve_half_dtype,
)
from hookdet.markers import hookimpl
from hookdet.plugin_manager import PluginError, check_known_options, option_error
from hookdet.trial import TrialError

logger = logging.getLogger("hookdet")

NAME = "apex"
STEPS_NAME = "apex:steps"

#: Placeholder in the opt-level table for the device's half precision.
HALF = "half"

#: apex's opt levels: the properties each sets before the caller's overrides.
OPT_LEVELS: Dict[str, Dict[str, Any]] = {
    "O0": dict(cast_model_type=torch.float32, patch_torch_functions=False,
               keep_batchnorm_fp32=None, master_weights=False, loss_scale=1.0),
    "O1": dict(cast_model_type=None, patch_torch_functions=True,
               keep_batchnorm_fp32=None, master_weights=None, loss_scale="dynamic"),
    "O2": dict(cast_model_type=HALF, patch_torch_functions=False,
               keep_batchnorm_fp32=True, master_weights=True, loss_scale="dynamic"),
    "O3": dict(cast_model_type=HALF, patch_torch_functions=False,
               keep_batchnorm_fp32=False, master_weights=False, loss_scale=1.0),
}

#: apex's dynamic loss scaler: first scale, growth and backoff factors, clean passes to grow.
INIT_SCALE = 2.0**16
SCALE_FACTOR = 2.0
SCALE_WINDOW = 2000

BACKENDS = ("auto", "torch", "apex")


@dataclasses.dataclass(frozen=True)
class ApexSettings:
    """``plugin_config.apex``: ``backend`` (auto, torch or apex) and ``dtype`` (the half precision
    of the torch backend: auto, float16 or bfloat16)."""

    backend: str = "auto"
    dtype: str = "auto"

    @classmethod
    def from_options(cls, options: Dict[str, Any]) -> "ApexSettings":
        """Read ``options``; one :class:`PluginError` naming ``plugin_config.apex.<field>``."""
        check_known_options(NAME, options, tuple(f.name for f in dataclasses.fields(cls)))
        values = dict(options)
        if "backend" in values and values["backend"] not in BACKENDS:
            raise option_error(NAME, "backend", "one of " + ", ".join(BACKENDS), values["backend"])
        if "dtype" in values:
            values["dtype"] = read_dtype_option(NAME, values["dtype"])
        return cls(**values)


@dataclasses.dataclass
class Properties:
    """apex's properties after the opt level's defaults and the caller's overrides."""

    opt_level: str
    cast_model_type: Any
    patch_torch_functions: bool
    keep_batchnorm_fp32: Optional[bool]
    master_weights: Optional[bool]
    loss_scale: Union[str, float]


def resolve_properties(opt_level: Any, overrides: Dict[str, Any]) -> Properties:
    """The opt level's defaults with every non-None override applied, refusing what apex refuses."""
    if opt_level not in OPT_LEVELS:
        raise ValueError(
            f"configure_apex_amp: unexpected opt_level {opt_level!r}; options are "
            "'O0', 'O1', 'O2', 'O3'"
        )
    props = dict(OPT_LEVELS[opt_level])
    o1 = opt_level == "O1"
    cast = overrides.get("cast_model_type")
    if cast is not None and cast is not False:
        if not isinstance(cast, torch.dtype) or not cast.is_floating_point:
            raise TypeError(f"configure_apex_amp: cast_model_type must be a floating torch.dtype, got {cast!r}")
        if o1 and cast is not torch.float32:
            raise ValueError(
                "configure_apex_amp: O1 casts around torch functions, not model weights, so "
                f"cast_model_type must stay None with O1 (got {cast}); use opt_level O2 or O3"
            )
    if cast is not None:
        props["cast_model_type"] = cast or None
    patch = overrides.get("patch_torch_functions")
    if patch is not None:
        if patch and not o1:
            raise ValueError("configure_apex_amp: patch_torch_functions=True is only valid with opt_level O1")
        props["patch_torch_functions"] = bool(patch)
    keep = overrides.get("keep_batchnorm_fp32")
    if keep is not None:
        keep = {"True": True, "False": False}.get(keep, keep) if isinstance(keep, str) else keep
        if not isinstance(keep, bool):
            raise TypeError(
                "configure_apex_amp: keep_batchnorm_fp32 must be a bool, the string 'True' or "
                f"'False', or None; got {overrides['keep_batchnorm_fp32']!r}"
            )
        if o1:
            raise ValueError(
                "configure_apex_amp: with opt_level O1 batch norm already runs in float32; "
                "keep_batchnorm_fp32 must be None"
            )
        props["keep_batchnorm_fp32"] = keep
    master = overrides.get("master_weights")
    if master is not None:
        if o1:
            raise ValueError(
                "configure_apex_amp: master_weights makes no sense with opt_level O1 "
                "(the model's weights stay float32); leave it None"
            )
        props["master_weights"] = bool(master)
    scale = overrides.get("loss_scale")
    if scale is not None:
        props["loss_scale"] = _read_loss_scale(scale)
    return Properties(opt_level=opt_level, **props)


def _read_loss_scale(value: Any) -> Union[str, float]:
    if value == "dynamic":
        return "dynamic"
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not math.isfinite(number) or number <= 0:
        raise ValueError(
            "configure_apex_amp: loss_scale must be 'dynamic' or a positive number "
            f"(a string like '128.0' is fine), got {value!r}"
        )
    return number


def _as_list(value: Any, kind: type, argument: str) -> Tuple[List[Any], bool]:
    """``value`` as a list and whether it was one; a wrong type is an error naming ``argument``."""
    if isinstance(value, kind):
        return [value], False
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, kind) for v in value):
        return list(value), True
    raise TypeError(
        f"configure_apex_amp: {argument} must be a {kind.__module__}.{kind.__qualname__} or a "
        f"non-empty list of them, got {value!r}"
    )


def _same_shape(given: Any, results: List[Any]) -> Any:
    """``results`` shaped like ``given``: one object for one, the same list (updated in place,
    as apex does) for a list, a tuple for a tuple."""
    if isinstance(given, list):
        given[:] = results
        return given
    if isinstance(given, tuple):
        return tuple(results)
    return results[0]


def _index_in(objects: Sequence[Any], target: Any) -> Optional[int]:
    for index, candidate in enumerate(objects):
        if candidate is target:
            return index
    return None


def _wrapped_positions(context: Any, models: Any, optimizers: Any) -> List[int]:
    """Where each model sits in ``context.models``; every model and optimizer must have come
    from ``wrap_model``/``wrap_optimizer`` (Determined's order: wrap first, then configure)."""
    positions = []
    for argument, given, wrapped, kind, method in (
        ("models", models, context.models, torch.nn.Module, "wrap_model"),
        ("optimizers", optimizers, context.optimizers, torch.optim.Optimizer, "wrap_optimizer"),
    ):
        items, was_list = _as_list(given, kind, argument)
        for position, item in enumerate(items):
            index = _index_in(wrapped, item)
            if index is None:
                where = f"{argument}[{position}]" if was_list else argument
                raise TrialError(
                    f"context.configure_apex_amp: {where} was not returned by context.{method}(); "
                    "wrap every model and optimizer first, then call configure_apex_amp"
                )
            if kind is torch.nn.Module:
                positions.append(index)
    return positions


def _check_loss_arguments(
    context: Any,
    aggregation_frequency: int,
    num_losses: Any,
    min_loss_scale: Any,
    max_loss_scale: Any,
    cast_model_outputs: Any,
) -> None:
    """``num_losses``, the loss-scale bounds and ``cast_model_outputs``, and Determined's
    restrictions under distributed training."""
    if not isinstance(num_losses, int) or isinstance(num_losses, bool) or num_losses < 1:
        raise ValueError(f"configure_apex_amp: num_losses must be an integer >= 1, got {num_losses!r}")
    if context.distributed.size > 1:
        if num_losses != 1:
            raise TrialError(
                "context.configure_apex_amp: with distributed training only num_losses=1 is supported"
            )
        if aggregation_frequency > 1:
            raise TrialError(
                "context.configure_apex_amp is not supported with distributed training and "
                "optimizations.aggregation_frequency > 1"
            )
    for name, value in (("min_loss_scale", min_loss_scale), ("max_loss_scale", max_loss_scale)):
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if value is not None and not (is_number and value > 0 and not math.isnan(value)):
            raise ValueError(f"configure_apex_amp: {name} must be a positive number or None, got {value!r}")
    if min_loss_scale is not None and max_loss_scale is not None and min_loss_scale > max_loss_scale:
        raise ValueError(
            f"configure_apex_amp: min_loss_scale ({min_loss_scale}) is above max_loss_scale ({max_loss_scale})"
        )
    if cast_model_outputs is not None and not (
        isinstance(cast_model_outputs, torch.dtype) and cast_model_outputs.is_floating_point
    ):
        raise TypeError(
            f"configure_apex_amp: cast_model_outputs must be a floating torch.dtype, got {cast_model_outputs!r}"
        )


def _import_nvidia_apex() -> Tuple[Any, Optional[str]]:
    """``apex.amp`` when NVIDIA apex can run here, else None and why not."""
    try:
        from apex import amp as apex_amp  # type: ignore[import-not-found]
    except Exception as error:  # any failure to import means: not usable here
        return None, f"NVIDIA apex is not importable ({type(error).__name__}: {error})"
    if not all(callable(getattr(apex_amp, name, None)) for name in ("initialize", "scale_loss")):
        return None, "the installed 'apex' package is not NVIDIA apex"
    if not torch.cuda.is_available():
        return None, "NVIDIA apex needs CUDA, which is not available"
    return apex_amp, None


# ---------------------------------------------------------------------------------------------
# The plugin
# ---------------------------------------------------------------------------------------------


class ApexPlugin:
    """``configure_apex_amp`` and Determined's ordering rules around it; its state in checkpoints."""

    conflicts_with = ("amp",)

    def __init__(self, options: Optional[Dict[str, Any]] = None) -> None:
        self.settings = ApexSettings.from_options(dict(options or {}))
        #: The backend in use once ``configure_apex_amp`` ran: ``_ApexBackend`` or ``_TorchBackend``.
        self.backend: Any = None
        self._run: Any = None

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Remember the run (its aggregation frequency and plugin manager)."""
        self._run = run

    @hookimpl
    def hookdet_configure_apex_amp(
        self, context: Any, models: Any, optimizers: Any, args: Any, kwargs: Dict[str, Any]
    ) -> Tuple[Any, Any]:
        """``context.configure_apex_amp(models, optimizers, *args, **kwargs)``."""
        return self.configure_apex_amp(context, models, optimizers, *args, **kwargs)

    @hookimpl(wrapper=True)
    def hookdet_wrap_model(self, model: torch.nn.Module, context: Any, options: Dict[str, Any]) -> Any:
        """Determined's rule: every model is wrapped before ``configure_apex_amp``."""
        if self.backend is not None:
            raise TrialError("context.wrap_model: must call wrap_model() before configure_apex_amp")
        return (yield)

    @hookimpl(wrapper=True)
    def hookdet_wrap_optimizer(
        self, optimizer: Any, context: Any, backward_passes_per_step: int, options: Dict[str, Any]
    ) -> Any:
        """Determined's rule: every optimizer is wrapped before ``configure_apex_amp``."""
        if self.backend is not None:
            raise TrialError("context.wrap_optimizer: must call wrap_optimizer() before configure_apex_amp")
        return (yield)

    def configure_apex_amp(
        self,
        context: Any,
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
    ) -> Tuple[Any, Any]:
        """Determined's ``configure_apex_amp``: returns the models and optimizers to use from now
        on, each a single object or a list as passed in."""
        if not enabled:
            return models, optimizers
        warnings.warn(
            "configure_apex_amp: Determined deprecates NVIDIA apex support; prefer "
            "context.experimental.use_amp() or context.wrap_scaler() (torch.amp)",
            FutureWarning,
            stacklevel=3,
        )
        if self.backend is not None:
            raise TrialError("context.configure_apex_amp: please only call configure_apex_amp once")
        model_list, _ = _as_list(models, torch.nn.Module, "models")
        optimizer_list, _ = _as_list(optimizers, torch.optim.Optimizer, "optimizers")
        model_indices = _wrapped_positions(context, models, optimizers)
        aggregation_frequency = int(self._run.config.optimizations.aggregation_frequency)
        _check_loss_arguments(
            context, aggregation_frequency, num_losses, min_loss_scale, max_loss_scale, cast_model_outputs
        )
        overrides = dict(
            cast_model_type=cast_model_type,
            patch_torch_functions=patch_torch_functions,
            keep_batchnorm_fp32=keep_batchnorm_fp32,
            master_weights=master_weights,
            loss_scale=loss_scale,
        )
        props = resolve_properties(opt_level, overrides)
        verbosity = int(verbosity or 0)

        apex_amp, reason = (None, "plugin_config.apex.backend is 'torch'")
        if self.settings.backend != "torch":
            apex_amp, reason = _import_nvidia_apex()
        if apex_amp is None and self.settings.backend == "apex":
            raise PluginError(f"plugin_config.apex.backend is 'apex' but {reason}")
        log = logger.info if verbosity >= 1 and context.distributed.is_chief else logger.debug

        if apex_amp is not None:
            backend: Any = _ApexBackend(apex_amp, num_losses)
            models_out, optimizers_out = backend.initialize(
                context, model_list, model_indices, optimizer_list,
                dict(overrides, enabled=True, opt_level=opt_level, cast_model_outputs=cast_model_outputs,
                     num_losses=num_losses, verbosity=verbosity if context.distributed.is_chief else 0,
                     min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale),
            )
            log("apex: opt_level %s on NVIDIA apex.amp", opt_level)
        else:
            half = resolve_half_dtype(NAME, self.settings.dtype, context.device)
            backend = _TorchBackend(
                props, half, context, num_losses, min_loss_scale, max_loss_scale, verbosity, aggregation_frequency
            )
            backend.setup(context, model_indices, optimizer_list, cast_model_outputs)
            models_out, optimizers_out = model_list, optimizer_list
            log("apex: %s; running opt_level %s on torch.amp: %s", reason, opt_level, backend.describe())
        if backend.needs_step_hooks:
            self._run.plugins.register(STEPS_NAME, _ApexSteps(backend))
        self.backend = backend
        return _same_shape(models, models_out), _same_shape(optimizers, optimizers_out)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> Dict[str, Any]:
        """The backend's loss scalers (and master weights); empty before ``configure_apex_amp``."""
        return self.backend.state_dict() if self.backend is not None else {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved, refusing a checkpoint of another configuration."""
        if not state:
            if self.backend is not None:
                logger.warning("apex: the checkpoint holds no apex state; loss scales start afresh")
            return
        if self.backend is None:
            logger.warning(
                "apex: the checkpoint holds apex state but this trial never calls configure_apex_amp"
            )
            return
        self.backend.load_state_dict(state)


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------


class _LossIds:
    """Determined's loss ids: the n-th distinct loss tensor given to ``backward`` in a batch is n."""

    def __init__(self, num_losses: int) -> None:
        self.num_losses = num_losses
        self._batch: Optional[int] = None
        self._seen: List[torch.Tensor] = []

    def __call__(self, loss: torch.Tensor, batch_idx: int) -> int:
        if batch_idx != self._batch:
            self._batch, self._seen = batch_idx, []
        index = _index_in(self._seen, loss)
        if index is None:
            index = len(self._seen)
            self._seen.append(loss)
        if self.num_losses == 1:
            return 0
        if index >= self.num_losses:
            raise TrialError(
                f"context.backward: loss #{index + 1} of this batch, but configure_apex_amp was "
                f"given num_losses={self.num_losses}"
            )
        return index


def _check_single_backward(context: Any, state: Dict[str, Any]) -> None:
    """Determined's rule: under distributed training, one ``backward`` per batch with apex."""
    if context.distributed.size <= 1:
        return
    batch = context.current_train_batch()
    if state.get("last") == batch:
        raise TrialError(
            "context.backward: calling backward more than once per batch is not supported with "
            "configure_apex_amp and distributed training"
        )
    state["last"] = batch


class _ApexBackend:
    """NVIDIA apex.amp: ``initialize`` once, ``scale_loss`` around every backward."""

    needs_step_hooks = True

    def __init__(self, apex_amp: Any, num_losses: int) -> None:
        self.amp = apex_amp
        self.loss_ids = _LossIds(num_losses)
        self._backward_state: Dict[str, Any] = {}

    def initialize(
        self, context: Any, models: List[Any], indices: List[int], optimizers: List[Any], kwargs: Dict[str, Any]
    ) -> Tuple[List[Any], List[Any]]:
        """``apex.amp.initialize`` on the bare models (apex refuses DDP-wrapped ones). apex casts
        and patches them in place, so the models the trial got from ``wrap_model`` stay valid."""
        bare = [context.unwrapped_models[i] for i in indices]
        _, optimizers_out = self.amp.initialize(models=bare, optimizers=list(optimizers), **kwargs)
        for optimizer, out in zip(optimizers, optimizers_out):
            position = _index_in(context.optimizers, optimizer)
            if out is not optimizer and position is not None:
                context.optimizers[position] = out
        return list(models), list(optimizers_out)

    def backward(self, loss: torch.Tensor, context: Any, backward_kwargs: Dict[str, Any]) -> bool:
        _check_single_backward(context, self._backward_state)
        loss_id = self.loss_ids(loss, context.current_train_batch())
        with self.amp.scale_loss(loss, context.optimizers, loss_id=loss_id) as scaled:
            scaled.backward(**backward_kwargs)
        return True

    def step(self, optimizer: Any, scaler: Any, context: Any) -> Optional[bool]:
        return None  # apex patches a skipped step into the optimizer itself

    def state_dict(self) -> Dict[str, Any]:
        return {"backend": "apex", "amp": self.amp.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("backend") != "apex":
            raise ValueError(
                f"apex: the checkpoint was written by the {state.get('backend')!r} backend, but "
                "this run uses NVIDIA apex; resume where it was written or set "
                "plugin_config.apex.backend to match"
            )
        self.amp.load_state_dict(state["amp"])


class _LossScaler:
    """apex's ``LossScaler`` on device tensors: the scale and its clean-pass counter never leave
    the device (updated by ``torch._amp_update_scale_``, clamped to the bounds)."""

    def __init__(self, loss_scale: Union[str, float], min_scale: Optional[float], max_scale: Optional[float],
                 device: torch.device) -> None:
        self.dynamic = loss_scale == "dynamic"
        self.min_scale = min_scale
        self.max_scale = max_scale
        if not self.dynamic:
            first = float(loss_scale)
        else:
            first = INIT_SCALE if max_scale is None else min(max_scale, INIT_SCALE)
        self.scale = torch.full((), first, dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)

    def update(self, found_inf: torch.Tensor) -> None:
        if not self.dynamic:
            return
        torch._amp_update_scale_(
            self.scale, self.growth_tracker, found_inf, SCALE_FACTOR, 1.0 / SCALE_FACTOR, SCALE_WINDOW
        )
        if self.min_scale is not None or self.max_scale is not None:
            self.scale.clamp_(min=self.min_scale, max=self.max_scale)


class _TorchBackend:
    """apex's opt levels on torch.amp (see the module docstring)."""

    def __init__(self, props: Properties, half: torch.dtype, context: Any, num_losses: int,
                 min_scale: Optional[float], max_scale: Optional[float], verbosity: int,
                 aggregation_frequency: int = 1) -> None:
        self.props = props
        self.aggregation_frequency = aggregation_frequency
        self.device = context.device
        self.verbosity = verbosity
        cast = props.cast_model_type
        self.cast_model_type: Optional[torch.dtype] = half if cast == HALF else cast
        self.autocast_dtype = half if props.patch_torch_functions else None
        self.scalers = [
            _LossScaler(props.loss_scale, min_scale, max_scale, self.device) for _ in range(num_losses)
        ]
        self.loss_ids = _LossIds(num_losses)
        self.any_dynamic = props.loss_scale == "dynamic"
        self.needs_step_hooks = bool(props.master_weights) or self.any_dynamic or props.loss_scale != 1.0
        #: Per optimizer (by id): its (model parameter, master parameter) pairs; the same tensor
        #: twice where the optimizer steps the model's own parameter.
        self.pairs: Dict[int, List[Tuple[torch.Tensor, torch.Tensor]]] = {}
        self.optimizers: List[Any] = []
        #: Every (model parameter, master) pair once, in the order the optimizers list them.
        self.all_pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
        #: Overflow seen in the current aggregation window (dynamic scalers only), and its index.
        self.found_inf = torch.zeros((), dtype=torch.float32, device=self.device)
        self.window = -1
        self._backward_state: Dict[str, Any] = {}

    def describe(self) -> str:
        parts = []
        if self.autocast_dtype is not None:
            parts.append(f"autocast {dtype_name(self.autocast_dtype)} on {self.device.type}")
        if self.cast_model_type is not None:
            model = f"model cast to {dtype_name(self.cast_model_type)}"
            if self.props.keep_batchnorm_fp32 and self.cast_model_type != torch.float32:
                model += " (batch norm kept float32)"
            parts.append(model)
        if self.props.master_weights:
            parts.append("float32 master weights")
        scale = self.props.loss_scale
        parts.append("dynamic loss scale" if scale == "dynamic" else f"loss scale {scale:g}")
        if len(self.scalers) > 1:
            parts[-1] += f" per loss ({len(self.scalers)} losses)"
        return ", ".join(parts)

    # ------------------------------------------------------------------ setup

    def setup(self, context: Any, model_indices: List[int], optimizers: List[Any],
              cast_model_outputs: Optional[torch.dtype]) -> None:
        saved_states = {id(o): o.state_dict() for o in optimizers if o.state}
        output_dtype = cast_model_outputs or torch.float32
        for index in model_indices:
            bare, used = context.unwrapped_models[index], context.models[index]
            if self.cast_model_type is not None:
                _cast_model(bare, self.cast_model_type, bool(self.props.keep_batchnorm_fp32))
                patch_forward(used, _casting_forward(self.cast_model_type, output_dtype))
            if self.autocast_dtype is not None:  # O1 (possibly with cast_model_type=float32)
                patch_forward(used, autocast_forward(self.device.type, self.autocast_dtype, output_dtype))
            if self.cast_model_type is None and self.autocast_dtype is None and cast_model_outputs is not None:
                patch_forward(used, _casting_forward(None, output_dtype))
        for optimizer in optimizers:
            pairs = []
            for group in optimizer.param_groups:
                params = group["params"]
                for position, param in enumerate(params):
                    master = param
                    if self.props.master_weights and param.is_floating_point() and param.dtype != torch.float32:
                        master = param.detach().clone().float().requires_grad_(param.requires_grad)
                        params[position] = master
                    pairs.append((param, master))
            self.pairs[id(optimizer)] = pairs
            self.optimizers.append(optimizer)
            if id(optimizer) in saved_states:
                # Re-key any existing state to the (possibly new) parameters, cast to their dtype.
                optimizer.load_state_dict(saved_states[id(optimizer)])
        seen = set()
        for optimizer in self.optimizers:
            for model_param, master in self.pairs[id(optimizer)]:
                if id(model_param) not in seen:
                    seen.add(id(model_param))
                    self.all_pairs.append((model_param, master))

    # ------------------------------------------------------------------ per batch

    def backward(self, loss: torch.Tensor, context: Any, backward_kwargs: Dict[str, Any]) -> bool:
        """Backward through ``loss * scale``, then unscale the new gradients at once (checking
        them for inf/NaN) and add them to those already accumulated — into the float32 masters
        when there are master weights."""
        _check_single_backward(context, self._backward_state)
        batch = context.current_train_batch()
        scaler = self.scalers[self.loss_ids(loss, batch)]
        window = batch // self.aggregation_frequency
        if window != self.window:
            self.window = window
            self.found_inf.zero_()
        pairs = self.all_pairs
        stashed = []
        for model_param, master in pairs:
            if model_param is master and model_param.grad is not None:
                stashed.append((model_param, model_param.grad))
                model_param.grad = None
        (loss.float() * scaler.scale).backward(**backward_kwargs)

        fresh: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
        moved = []
        for model_param, master in pairs:
            grad = model_param.grad
            if grad is None:
                continue
            if master is not model_param:
                grad = grad.float()
                model_param.grad = None
                moved.append((master, grad))
            fresh.setdefault((grad.device, grad.dtype), []).append(grad)
        found = torch.zeros((), dtype=torch.float32, device=self.device)
        inv_scale = scaler.scale.double().reciprocal().float()
        for (device, _), grads in fresh.items():
            found_here = found if device == found.device else torch.zeros((), device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_here, inv_scale.to(device))
            if found_here is not found:
                found.add_(found_here.to(found.device))
        for param, previous in stashed:
            if param.grad is None:
                param.grad = previous
            else:
                param.grad.add_(previous)
        for master, grad in moved:
            if master.grad is None:
                master.grad = grad
            else:
                master.grad.add_(grad)
        if scaler.dynamic:
            self.found_inf.add_(found)
            scaler.update(found)
        return True

    def step(self, optimizer: Any, scaler: Any, context: Any) -> bool:
        """Step unless a dynamic scaler overflowed in this window; refresh the model from the masters."""
        window = context.current_train_batch() // self.aggregation_frequency
        if self.any_dynamic and window == self.window and bool(self.found_inf.item()):
            if self.verbosity >= 1:
                scales = ", ".join(f"{s.scale.item():g}" for s in self.scalers)
                logger.info("apex: gradient overflow; skipping this step, loss scale(s) now %s", scales)
            return True
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()
        distinct = [(p, m) for p, m in self.pairs.get(id(optimizer), ()) if p is not m]
        if distinct:
            with torch.no_grad():
                torch._foreach_copy_([p for p, _ in distinct], [m for _, m in distinct])
        return True

    # ------------------------------------------------------------------ state

    def state_dict(self) -> Dict[str, Any]:
        return {
            "backend": "torch",
            "opt_level": self.props.opt_level,
            "loss_scalers": [{"scale": s.scale, "growth_tracker": s.growth_tracker} for s in self.scalers],
            "found_inf": self.found_inf,
            "window": self.window,
            "master_weights": [
                [master for param, master in self.pairs[id(o)] if param is not master] for o in self.optimizers
            ],
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("backend") != "torch" or state.get("opt_level") != self.props.opt_level:
            raise ValueError(
                f"apex: the checkpoint was written with opt_level {state.get('opt_level')!r} on the "
                f"{state.get('backend')!r} backend, but this run uses opt_level "
                f"{self.props.opt_level!r} on torch.amp"
            )
        scalers, masters = state["loss_scalers"], state["master_weights"]
        mine = [[m for p, m in self.pairs[id(o)] if p is not m] for o in self.optimizers]
        if len(scalers) != len(self.scalers) or [len(m) for m in masters] != [len(m) for m in mine]:
            raise ValueError(
                f"apex: the checkpoint holds {len(scalers)} loss scaler(s) and master weights for "
                f"{[len(m) for m in masters]} parameters per optimizer; this run has "
                f"{len(self.scalers)} and {[len(m) for m in mine]} (num_losses or the optimizers differ)"
            )
        for scaler, saved in zip(self.scalers, scalers):
            scaler.scale.copy_(saved["scale"])
            scaler.growth_tracker.copy_(saved["growth_tracker"])
        self.found_inf.copy_(state["found_inf"])
        self.window = int(state["window"])
        with torch.no_grad():
            for current, saved in zip(mine, masters):
                for master, value in zip(current, saved):
                    master.copy_(value)


class _ApexSteps:
    """The per-batch hooks of a configured apex backend (registered only when needed)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    @hookimpl
    def hookdet_backward(self, loss: torch.Tensor, context: Any, backward_kwargs: Dict[str, Any]) -> bool:
        """Scaled backward (apex's ``scale_loss``)."""
        return self.backend.backward(loss, context, backward_kwargs)

    @hookimpl
    def hookdet_step_optimizer(self, optimizer: Any, context: Any, scaler: Any) -> Optional[bool]:
        """Step, or skip after an overflow; refresh half-precision weights from the masters."""
        return self.backend.step(optimizer, scaler, context)


# ---------------------------------------------------------------------------------------------
# Model casting
# ---------------------------------------------------------------------------------------------


def _cast_model(model: torch.nn.Module, dtype: torch.dtype, keep_batchnorm_fp32: bool) -> None:
    """Cast ``model``'s floating parameters and buffers to ``dtype`` in place (the parameter
    objects stay the same, so optimizers keep pointing at them); batch norm layers stay float32
    when asked."""
    nn = torch.nn
    batchnorm = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
                 nn.LazyBatchNorm1d, nn.LazyBatchNorm2d, nn.LazyBatchNorm3d)
    for module in model.modules():
        if keep_batchnorm_fp32 and isinstance(module, batchnorm):
            module.float()
            continue
        for param in module.parameters(recurse=False):
            if param.is_floating_point():
                param.data = param.data.to(dtype)
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None and buffer.is_floating_point():
                setattr(module, name, buffer.to(dtype))  # Module.__setattr__ replaces the buffer


def _casting_forward(input_dtype: Optional[torch.dtype], output_dtype: torch.dtype) -> Any:
    """Cast floating inputs to ``input_dtype`` (when given) and floating outputs to
    ``output_dtype`` around the forward, as apex does around a cast model."""
    warned: set = set()

    def around(inner: Any, args: tuple, kwargs: dict) -> Any:
        if input_dtype is not None:
            args = cast_tensors(args, input_dtype)
            kwargs = cast_tensors(kwargs, input_dtype)
        return cast_tensors(inner(*args, **kwargs), output_dtype, None, warned)

    return around
