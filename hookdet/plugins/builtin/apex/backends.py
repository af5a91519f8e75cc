"""The apex plugin's backends: NVIDIA apex.amp when it runs, else apex's opt levels on torch.amp
(loss scalers, master weights, model casting); the plugin's precision calls the chosen one per
batch."""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from hookdet.plugin import TrialError, autocast_forward, cast_tensors, dtype_name, patch_forward

from .options import (
    HALF,
    INIT_SCALE,
    SCALE_FACTOR,
    SCALE_WINDOW,
    Properties,
    index_in,
)

logger = logging.getLogger("hookdet")


class _LossIds:
    """Determined's loss ids: the n-th distinct loss tensor given to ``backward`` in a batch is n."""

    def __init__(self, num_losses: int) -> None:
        self.num_losses = num_losses
        self._batch: Optional[int] = None
        self._seen: List[torch.Tensor] = []

    def __call__(self, loss: torch.Tensor, batch_idx: int) -> int:
        if batch_idx != self._batch:
            self._batch, self._seen = batch_idx, []
        index = index_in(self._seen, loss)
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


class ApexBackend:
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
            position = index_in(context.optimizers, optimizer)
            if out is not optimizer and position is not None:
                context.optimizers[position] = out
        return list(models), list(optimizers_out)

    def backward(self, loss: torch.Tensor, context: Any, backward_kwargs: Dict[str, Any]) -> None:
        _check_single_backward(context, self._backward_state)
        loss_id = self.loss_ids(loss, context.current_train_batch())
        with self.amp.scale_loss(loss, context.optimizers, loss_id=loss_id) as scaled:
            scaled.backward(**backward_kwargs)

    def step(self, optimizer: Any, scaler: Any, context: Any) -> None:
        """A plain step: apex patches a skipped step into the optimizer itself."""
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()

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


class TorchBackend:
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

    def backward(self, loss: torch.Tensor, context: Any, backward_kwargs: Dict[str, Any]) -> None:
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

    def step(self, optimizer: Any, scaler: Any, context: Any) -> None:
        """Step unless a dynamic scaler overflowed in this window; refresh the model from the masters."""
        window = context.current_train_batch() // self.aggregation_frequency
        if self.any_dynamic and window == self.window and bool(self.found_inf.item()):
            if self.verbosity >= 1:
                scales = ", ".join(f"{s.scale.item():g}" for s in self.scalers)
                logger.info("apex: gradient overflow; skipping this step, loss scale(s) now %s", scales)
            return
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()
        distinct = [(p, m) for p, m in self.pairs.get(id(optimizer), ()) if p is not m]
        if distinct:
            with torch.no_grad():
                torch._foreach_copy_([p for p, _ in distinct], [m for _, m in distinct])

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
