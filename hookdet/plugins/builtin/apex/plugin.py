"""The apex plugin itself: :class:`ApexPrecision` (``configure_apex_amp``, Determined's ordering
rules around it, the backend's backward and step, its state), and the plugin that provides it
as the run's precision."""
from __future__ import annotations

import logging
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from hookdet.plugin import PluginError, Precision, PrecisionPlugin, TrialError, options_for, resolve_half_dtype

from .backends import ApexBackend, TorchBackend
from .options import (
    NAME,
    ApexSettings,
    as_list,
    check_loss_arguments,
    import_nvidia_apex,
    resolve_properties,
    same_shape,
    wrapped_positions,
)

logger = logging.getLogger("hookdet")


class ApexPrecision(Precision):
    """``configure_apex_amp`` and Determined's ordering rules around it; then the backend's
    scaled backward, its step (skipped after an overflow) and its state."""

    name = NAME

    def __init__(self, settings: ApexSettings, aggregation_frequency: int) -> None:
        self.settings = settings
        self.aggregation_frequency = aggregation_frequency
        #: The backend in use once ``configure_apex_amp`` ran: ``ApexBackend`` or ``TorchBackend``.
        self.backend: Any = None

    @property
    def changes_steps(self) -> bool:
        """Once configured, unless the backend changes nothing per batch (loss scale 1, no
        master weights)."""
        return self.backend is not None and self.backend.needs_step_hooks

    def use_amp(self, context: Any) -> None:
        """Refused, in Determined's words: apex and native AMP never mix."""
        raise self.refusal("context.experimental.use_amp")

    def wrap_scaler(self, context: Any, scaler: Any) -> Any:
        """Refused, in Determined's words: apex and native AMP never mix."""
        raise self.refusal("context.wrap_scaler")

    def refusal(self, call: str) -> TrialError:
        """Determined's words, then which precision the run has."""
        return TrialError(f"{call}: Do not mix APEX with PyTorch AMP. (this run's precision is 'apex')")

    def convert_model(self, model: torch.nn.Module, context: Any) -> torch.nn.Module:
        """Determined's rule: every model is wrapped before ``configure_apex_amp``."""
        if self.backend is not None:
            raise TrialError("context.wrap_model: must call wrap_model() before configure_apex_amp")
        return model

    def convert_optimizer(self, optimizer: torch.optim.Optimizer, context: Any) -> torch.optim.Optimizer:
        """Determined's rule: every optimizer is wrapped before ``configure_apex_amp``."""
        if self.backend is not None:
            raise TrialError("context.wrap_optimizer: must call wrap_optimizer() before configure_apex_amp")
        return optimizer

    def backward(self, loss: torch.Tensor, context: Any, backward_kwargs: Dict[str, Any]) -> None:
        """Scaled backward (apex's ``scale_loss``)."""
        self.backend.backward(loss, context, backward_kwargs)

    def step(self, optimizer: torch.optim.Optimizer, context: Any, scaler: Any) -> None:
        """Step, or skip after an overflow; refresh half-precision weights from the masters."""
        self.backend.step(optimizer, scaler, context)

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
        model_list, _ = as_list(models, torch.nn.Module, "models")
        optimizer_list, _ = as_list(optimizers, torch.optim.Optimizer, "optimizers")
        model_indices = wrapped_positions(context, models, optimizers)
        aggregation_frequency = self.aggregation_frequency
        check_loss_arguments(
            context, aggregation_frequency, num_losses, min_loss_scale, max_loss_scale, cast_model_outputs
        )
        overrides = dict(
            cast_model_type=cast_model_type,
            patch_torch_functions=patch_torch_functions,
            keep_batchnorm_fp32=keep_batchnorm_fp32,
            master_weights=master_weights,
            loss_scale=loss_scale,
        )
        arguments = dict(
            overrides, enabled=True, opt_level=opt_level, cast_model_outputs=cast_model_outputs, num_losses=num_losses,
            verbosity=int(verbosity or 0), min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale,
        )
        backend, models_out, optimizers_out = self._start_backend(
            context, model_list, model_indices, optimizer_list, arguments, resolve_properties(opt_level, overrides),
            aggregation_frequency,
        )
        self.backend = backend
        return same_shape(models, models_out), same_shape(optimizers, optimizers_out)

    def _start_backend(
        self, context: Any, model_list: List[Any], model_indices: Any, optimizer_list: List[Any],
        arguments: Dict[str, Any], props: Any, aggregation_frequency: int,
    ) -> Tuple[Any, List[Any], List[Any]]:
        """NVIDIA apex.amp when it is installed (and the backend option allows it), else the same
        opt level on torch.amp; the backend and the models and optimizers to use from now on."""
        opt_level, verbosity, num_losses = arguments["opt_level"], arguments["verbosity"], arguments["num_losses"]
        apex_amp, reason = (None, "plugin_config.apex.backend is 'torch'")
        if self.settings.backend != "torch":
            apex_amp, reason = import_nvidia_apex()
        if apex_amp is None and self.settings.backend == "apex":
            raise PluginError(f"plugin_config.apex.backend is 'apex' but {reason}")
        log = logger.info if verbosity >= 1 and context.distributed.is_chief else logger.debug
        if apex_amp is not None:
            backend: Any = ApexBackend(apex_amp, num_losses)
            models_out, optimizers_out = backend.initialize(
                context, model_list, model_indices, optimizer_list,
                dict(arguments, verbosity=verbosity if context.distributed.is_chief else 0),
            )
            log("apex: opt_level %s on NVIDIA apex.amp", opt_level)
            return backend, models_out, optimizers_out
        half = resolve_half_dtype(NAME, self.settings.dtype, context.device)
        backend = TorchBackend(
            props, half, context, num_losses, arguments["min_loss_scale"], arguments["max_loss_scale"], verbosity,
            aggregation_frequency,
        )
        backend.setup(context, model_indices, optimizer_list, arguments["cast_model_outputs"])
        log("apex: %s; running opt_level %s on torch.amp: %s", reason, opt_level, backend.describe())
        return backend, model_list, optimizer_list

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


class ApexPlugin(PrecisionPlugin):
    """Provides :class:`ApexPrecision` as the run's precision and keeps its state in checkpoints."""

    Options = ApexSettings

    def __init__(self, options: Optional[Dict[str, Any]] = None) -> None:
        self.settings: ApexSettings = options_for(ApexPlugin, options, NAME)

    def make(self, run: Any) -> ApexPrecision:
        """The precision needs the run's aggregation frequency."""
        return ApexPrecision(self.settings, int(run.config.optimizations.aggregation_frequency))
