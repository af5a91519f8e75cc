"""Native mixed precision: forward passes under ``torch.autocast``, losses through a ``GradScaler``.

Three ways in, the first two exactly as in Determined:

* ``context.experimental.use_amp()`` — automatic. Every model wrapped afterwards runs its forward
  pass under autocast (its reduced-precision outputs come back as float32, so the loss is computed
  in float32); ``context.backward`` scales the loss; ``context.step_optimizer`` unscales the
  gradients before they are averaged and clipped, then steps through the scaler; after
  ``train_batch`` on a batch that stepped, the scaler is updated once.
* ``context.wrap_scaler(scaler)`` — manual. The trial autocasts, scales its loss, passes
  ``scaler=`` to ``step_optimizer`` and calls ``scaler.update()`` itself, as with plain PyTorch;
  hookdet only keeps the scaler's state in checkpoints (Determined's harness likewise updates
  the scaler only under ``use_amp``).
* ``plugins: [amp]`` in the experiment file — automatic for every model, with no change to the
  trial (as if it had called ``use_amp()`` first). A trial that calls ``wrap_scaler`` before
  wrapping a model takes over manually instead.

Determined's ordering rules hold: ``use_amp``/``wrap_scaler`` come before any ``wrap_model`` and
are called once. The plugin provides the run's precision (:class:`AmpPrecision`, answering
``hookdet_make_precision``), so ``amp`` and ``apex`` never run together: a run has one precision.

``plugin_config.amp`` (all optional): ``enabled`` (false: ``use_amp`` trains in float32),
``dtype`` (``auto``: float16 on CUDA, bfloat16 elsewhere; or ``float16``/``bfloat16``), and the
``GradScaler``'s ``init_scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``.
Loss scaling runs for float16 only: bfloat16 has float32's exponent range and needs none, so with
bfloat16 the context calls nothing of the precision per batch.

``GradScaler.step`` reads one flag from the device per optimizer step to decide whether to skip
it (PyTorch's own design); nothing else here waits on the device per batch.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional

import pydantic
import torch

from hookdet.plugin import (
    DTYPE_NAMES,
    Precision,
    PrecisionPlugin,
    TrialError,
    autocast_forward,
    dtype_name,
    known_dtype_name,
    options_for,
    patch_forward,
    resolve_half_dtype,
)

logger = logging.getLogger("hookdet")

NAME = "amp"
BY_FILE = "the experiment file"

# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


class AmpSettings(pydantic.BaseModel):
    """``plugin_config.amp``, declared (checked with the experiment file); the scaler fields are
    ``torch.amp.GradScaler``'s, with its defaults."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    enabled: bool = pydantic.Field(True, description="false: use_amp() and plugins: [amp] change nothing")
    dtype: str = pydantic.Field("auto", description=f"the half dtype: {', '.join(DTYPE_NAMES)} (auto: bfloat16 on CPU, float16 on CUDA)")
    init_scale: float = pydantic.Field(2.0**16, gt=0, allow_inf_nan=False, description="the scaler's first loss scale")
    growth_factor: float = pydantic.Field(2.0, gt=1, allow_inf_nan=False, description="how the scale grows")
    backoff_factor: float = pydantic.Field(0.5, gt=0, lt=1, description="how the scale shrinks after an overflow")
    growth_interval: int = pydantic.Field(2000, ge=1, description="overflow-free steps before the scale grows")

    _known_dtype = pydantic.field_validator("dtype")(known_dtype_name)


# ---------------------------------------------------------------------------------------------
# The precision
# ---------------------------------------------------------------------------------------------


class AmpPrecision(Precision):
    """``use_amp``, ``wrap_scaler``, ``autocast_forward_pass`` and ``plugins: [amp]``: autocast
    forwards and, in automatic float16 mode, a ``GradScaler`` around backward and step."""

    name = NAME

    def __init__(self, settings: AmpSettings, listed_in_config: bool) -> None:
        self.settings = settings
        #: The registered ``GradScaler`` (``use_amp``'s own, or the trial's from ``wrap_scaler``).
        self.scaler: Any = None
        #: ``None`` until switched on, then ``"auto"`` or ``"manual"``.
        self.mode: Optional[str] = None
        #: The autocast dtype in automatic mode (None when disabled or manual).
        self.dtype: Optional[torch.dtype] = None
        self._listed_in_config = listed_in_config
        self._switched_on_by: Optional[str] = None
        self._device_type = "cpu"
        self._unscaled = False

    @property
    def changes_steps(self) -> bool:
        """In automatic mode with an active (float16) scaler; manual mode leaves them to the trial."""
        return self.mode == "auto" and self._scaler_active()

    # ------------------------------------------------------------------ the trial's switches

    def use_amp(self, context: Any) -> None:
        """``context.experimental.use_amp()``: automatic mixed precision with a fresh scaler."""
        if self._switched_on_by == BY_FILE and self.mode == "auto":
            return
        self._check_can_register(context, "use_amp")
        self._switch_on_auto(context, "use_amp()")

    def wrap_scaler(self, context: Any, scaler: Any) -> Any:
        """``context.wrap_scaler(scaler)``: the trial drives ``scaler``; hookdet checkpoints it."""
        missing = [m for m in ("scale", "step", "update", "unscale_", "state_dict", "load_state_dict")
                   if not callable(getattr(scaler, m, None))]
        if missing:
            raise TypeError(
                f"wrap_scaler takes a torch.amp.GradScaler, got a {type(scaler).__name__} "
                f"(it has no {', '.join(missing)})"
            )
        self._check_can_register(context, "wrap_scaler")
        self.scaler = scaler
        self.mode = "manual"
        self._switched_on_by = "wrap_scaler()"
        logger.info("amp: the trial's %s is registered (manual mixed precision)", type(scaler).__name__)
        return scaler

    def autocast_forward_pass(self, context: Any, module: torch.nn.Module) -> torch.nn.Module:
        """``context.autocast_forward_pass(model)``: ``model``'s forward under autocast, its
        half-precision outputs cast back to float32; no scaler is registered. The dtype is the
        one automatic mode uses (``plugin_config.amp.dtype``); disabled amp leaves it as is."""
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                f"autocast_forward_pass takes a torch.nn.Module, got {type(module).__name__}"
            )
        if not self.settings.enabled:
            return module
        dtype = resolve_half_dtype(NAME, self.settings.dtype, context.device)
        patch_forward(module, autocast_forward(context.device.type, dtype))
        return module

    def configure_apex_amp(self, context: Any, models: Any, optimizers: Any, **arguments: Any) -> Any:
        """Refused, in Determined's words: apex and native AMP never mix."""
        raise TrialError(
            "context.configure_apex_amp: Do not mix APEX with PyTorch AMP. (this run's precision "
            f"is 'amp', switched on by {self._switched_on_by or 'the experiment file'})"
        )

    # ------------------------------------------------------------------ wrapping and steps

    def convert_model(self, model: torch.nn.Module, context: Any) -> torch.nn.Module:
        """In automatic mode, run the wrapped model's forward under autocast."""
        if self.mode is None and self._listed_in_config:
            self._switch_on_auto(context, BY_FILE)
        if self.mode == "auto" and self.dtype is not None:
            patch_forward(model, autocast_forward(self._device_type, self.dtype))
        return model

    def backward(self, loss: torch.Tensor, context: Any, backward_kwargs: Dict[str, Any]) -> None:
        """Backward through the scaled loss."""
        self.scaler.scale(loss).backward(**backward_kwargs)

    def unscale_gradients(self, optimizer: Any, context: Any) -> None:
        """Unscale ``optimizer``'s gradients (before averaging, clipping and the step)."""
        self.scaler.unscale_(optimizer)
        self._unscaled = True

    def step(self, optimizer: Any, context: Any, scaler: Any) -> None:
        """Step through the trial's scaler if it passed one, else this one (skips on inf/NaN)."""
        (scaler if scaler is not None else self.scaler).step(optimizer)

    def batch_end(self, context: Any) -> None:
        """Update the scale once per batch that stepped (with gradient aggregation, the last
        batch of each window; the others never reach the step)."""
        if self._unscaled:
            self._unscaled = False
            self.scaler.update()

    # ------------------------------------------------------------------ state

    def state_dict(self) -> Dict[str, Any]:
        """The scaler's state (scale and growth tracker), empty when no scaler is active."""
        return {"scaler": self.scaler.state_dict()} if self._scaler_active() else {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the scaler saved by :meth:`state_dict`."""
        saved = state.get("scaler")
        active = self._scaler_active()
        if saved and active:
            self.scaler.load_state_dict(saved)
        elif saved:
            logger.warning("amp: the checkpoint holds a loss scaler's state but this trial uses none")
        elif active:
            logger.warning("amp: the checkpoint holds no loss scaler state; the scaler starts afresh")

    # ------------------------------------------------------------------ internals

    def _scaler_active(self) -> bool:
        if self.scaler is None:
            return False
        is_enabled = getattr(self.scaler, "is_enabled", None)
        return bool(is_enabled()) if callable(is_enabled) else True

    def _check_can_register(self, context: Any, caller: str) -> None:
        """Determined's rules for ``wrap_scaler``/``use_amp``: once, and before ``wrap_model``."""
        if self.mode is not None and self._switched_on_by != BY_FILE:
            raise TrialError(
                f"context.{caller}: a scaler is already registered by {self._switched_on_by}; "
                "please only call wrap_scaler or use_amp once"
            )
        if context.models:
            raise TrialError(
                f"context.{caller}: please call {caller} before wrap_model; "
                f"{len(context.models)} model(s) are already wrapped"
            )

    def _switch_on_auto(self, context: Any, by: str) -> None:
        settings = self.settings
        self.mode = "auto"
        self._switched_on_by = by
        self._device_type = context.device.type
        if not settings.enabled:
            self.dtype = None
            self.scaler = torch.amp.GradScaler(self._device_type, enabled=False)
            logger.info("amp: disabled by plugin_config.amp.enabled; training in float32")
            return
        self.dtype = resolve_half_dtype(NAME, settings.dtype, context.device)
        self.scaler = torch.amp.GradScaler(
            self._device_type,
            init_scale=settings.init_scale,
            growth_factor=settings.growth_factor,
            backoff_factor=settings.backoff_factor,
            growth_interval=settings.growth_interval,
            enabled=self.dtype == torch.float16,
        )
        scaling = "dynamic loss scaling" if self.scaler.is_enabled() else "no loss scaling"
        logger.info(
            "amp: automatic mixed precision (%s): autocast %s on %s, %s",
            by, dtype_name(self.dtype), self._device_type, scaling,
        )


# ---------------------------------------------------------------------------------------------
# The plugin
# ---------------------------------------------------------------------------------------------


class AmpPlugin(PrecisionPlugin):
    """Provides :class:`AmpPrecision` as the run's precision and keeps its state in checkpoints."""

    Options = AmpSettings

    def __init__(self, options: Optional[Dict[str, Any]] = None) -> None:
        self.settings: AmpSettings = options_for(AmpPlugin, options, NAME)

    def make(self, run: Any) -> AmpPrecision:
        """Listing ``amp`` in the experiment file means automatic mode for every model."""
        return AmpPrecision(self.settings, listed_in_config=NAME in run.plugin_names)
