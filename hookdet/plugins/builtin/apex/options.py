"""The apex plugin's options: ``plugin_config.apex``, apex's opt-level table and the checks
``configure_apex_amp`` applies to its arguments (the module docstring of
:mod:`hookdet.plugins.builtin.apex` explains the opt levels)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

import pydantic
import torch

from hookdet.plugin import DTYPE_NAMES, TrialError, known_dtype_name

NAME = "apex"

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

class ApexSettings(pydantic.BaseModel):
    """``plugin_config.apex``, declared (checked with the experiment file)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    backend: Literal["auto", "torch", "apex"] = pydantic.Field(
        "auto", description="apex: NVIDIA apex.amp (refused where it cannot run); torch: torch.amp; auto: apex when importable"
    )
    dtype: str = pydantic.Field("auto", description=f"the torch backend's half dtype: {', '.join(DTYPE_NAMES)}")

    _known_dtype = pydantic.field_validator("dtype")(known_dtype_name)


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


def as_list(value: Any, kind: type, argument: str) -> Tuple[List[Any], bool]:
    """``value`` as a list and whether it was one; a wrong type is an error naming ``argument``."""
    if isinstance(value, kind):
        return [value], False
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, kind) for v in value):
        return list(value), True
    raise TypeError(
        f"configure_apex_amp: {argument} must be a {kind.__module__}.{kind.__qualname__} or a "
        f"non-empty list of them, got {value!r}"
    )


def same_shape(given: Any, results: List[Any]) -> Any:
    """``results`` shaped like ``given``: one object for one, the same list (updated in place,
    as apex does) for a list, a tuple for a tuple."""
    if isinstance(given, list):
        given[:] = results
        return given
    if isinstance(given, tuple):
        return tuple(results)
    return results[0]


def index_in(objects: Sequence[Any], target: Any) -> Optional[int]:
    for index, candidate in enumerate(objects):
        if candidate is target:
            return index
    return None


def wrapped_positions(context: Any, models: Any, optimizers: Any) -> List[int]:
    """Where each model sits in ``context.models``; every model and optimizer must have come
    from ``wrap_model``/``wrap_optimizer`` (Determined's order: wrap first, then configure)."""
    positions = []
    for argument, given, wrapped, kind, method in (
        ("models", models, context.models, torch.nn.Module, "wrap_model"),
        ("optimizers", optimizers, context.optimizers, torch.optim.Optimizer, "wrap_optimizer"),
    ):
        items, was_list = as_list(given, kind, argument)
        for position, item in enumerate(items):
            index = index_in(wrapped, item)
            if index is None:
                where = f"{argument}[{position}]" if was_list else argument
                raise TrialError(
                    f"context.configure_apex_amp: {where} was not returned by context.{method}(); "
                    "wrap every model and optimizer first, then call configure_apex_amp"
                )
            if kind is torch.nn.Module:
                positions.append(index)
    return positions


def check_loss_arguments(
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


def import_nvidia_apex() -> Tuple[Any, Optional[str]]:
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
