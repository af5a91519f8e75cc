"""Mixed-precision building blocks any plugin may use: dtype options, autocast support,
casting nested outputs, and patching a model's forward to run under autocast.

The ``amp`` and ``apex`` plugins both build on these (plugins do not import one another); a
third-party mixed-precision plugin can too.
"""
from __future__ import annotations

import logging
import types
import warnings
from typing import Any, Callable, Dict, Optional

import torch

from hookdet.errors import PluginError

logger = logging.getLogger("hookdet")

#: Names accepted for ``dtype`` options; ``auto`` picks by device.
DTYPE_NAMES: Dict[str, Optional[torch.dtype]] = {
    "auto": None,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def known_dtype_name(value: str) -> str:
    """A ``dtype`` option checked against :data:`DTYPE_NAMES` and lower-cased (a ``ValueError``
    otherwise): the validator of the mixed-precision plugins' declared ``dtype``."""
    if value.lower() not in DTYPE_NAMES:
        raise ValueError(f"expected one of {', '.join(DTYPE_NAMES)}; got '{value}'")
    return value.lower()


def autocast_supported(device_type: str, dtype: torch.dtype) -> bool:
    """Whether this torch build can autocast to ``dtype`` on ``device_type``.

    Asked of torch itself: an unsupported pair either raises or silently disables autocast
    (with a warning), depending on the version and device.
    """
    if not torch.amp.is_autocast_available(device_type):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast(device_type, dtype=dtype):
                return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False


def resolve_half_dtype(plugin: str, requested: str, device: torch.device) -> torch.dtype:
    """The reduced precision for ``device``: the requested one, or float16 on CUDA and bfloat16
    elsewhere; refused (naming ``plugin_config.<plugin>.dtype``) when torch cannot autocast it."""
    dtype = DTYPE_NAMES[requested]
    if dtype is None:
        dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    if not autocast_supported(device.type, dtype):
        raise PluginError(
            f"plugin_config.{plugin}.dtype: torch {torch.__version__} cannot autocast to "
            f"{dtype_name(dtype)} on {device.type}; choose another dtype"
        )
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).replace("torch.", "")


def cast_tensors(
    value: Any, to: torch.dtype, only_from: Optional[torch.dtype] = None, warned: Optional[set] = None
) -> Any:
    """``value`` with its floating tensors cast to ``to`` (only those of dtype ``only_from`` when
    given), looking inside dicts, lists, tuples and named tuples.

    Any other object passes through unchanged; with a ``warned`` set, once per type with a
    warning, since tensors inside it keep their dtype (compute the loss inside the model, or
    autocast it yourself).
    """
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.dtype == to:
            return value
        if only_from is not None and value.dtype != only_from:
            return value
        return value.to(to)
    if isinstance(value, dict):
        items = {k: cast_tensors(v, to, only_from, warned) for k, v in value.items()}
        try:
            return type(value)(items)
        except TypeError:
            return items
    if isinstance(value, list):
        return [cast_tensors(v, to, only_from, warned) for v in value]
    if isinstance(value, tuple):
        items = [cast_tensors(v, to, only_from, warned) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if warned is not None and value is not None and not isinstance(value, (str, bytes, int, float)):
        if type(value) not in warned:
            warned.add(type(value))
            logger.warning(
                "mixed precision: the model returned a %s; tensors inside it keep their dtype",
                type(value).__name__,
            )
    return value


#: ``around(inner_forward, args, kwargs) -> output``: what a patched forward runs.
Around = Callable[[Callable, tuple, dict], Any]


def patch_forward(model: torch.nn.Module, around: Around) -> None:
    """Make ``model(...)`` run ``around(previous forward, args, kwargs)``, on this instance only.

    The patch is a method bound to ``model`` and stored on the instance, shadowing the class's
    ``forward``: hooks, attributes and ``state_dict`` keys are unchanged. The previous forward is
    looked up on whichever instance is called, so a ``copy.deepcopy`` of the model (an EMA or
    ``AveragedModel`` copy, say) runs its own weights, not the original's. Patches stack.
    """
    previous = model.__dict__.get("forward")

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if previous is None:
            inner = type(self).forward.__get__(self, type(self))
        elif isinstance(previous, types.MethodType):
            inner = previous.__func__.__get__(self, type(self))
        else:
            inner = previous
        return around(inner, args, kwargs)

    model.forward = types.MethodType(forward, model)


def autocast_forward(
    device_type: str, dtype: torch.dtype, output_dtype: Optional[torch.dtype] = torch.float32
) -> Around:
    """Run the forward under ``torch.autocast(device_type, dtype)``, then cast its outputs of
    dtype ``dtype`` to ``output_dtype`` (every floating output when ``output_dtype`` is not
    float32: apex's ``cast_model_outputs``), so a loss computed outside the model runs in full
    precision; ``output_dtype=None`` leaves the outputs as they are."""
    warned: set = set()
    only_from = dtype if output_dtype == torch.float32 else None

    def around(inner: Callable, args: tuple, kwargs: dict) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            output = inner(*args, **kwargs)
        if output_dtype is None:
            return output
        return cast_tensors(output, output_dtype, only_from, warned)

    return around
