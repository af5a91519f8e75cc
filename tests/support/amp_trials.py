"""Trials for the mixed-precision tests, and a command line that trains one in a fresh process.

Every trial regresses a fixed random linear target with a small MLP
(``Linear(8, 32) [-> BatchNorm1d] -> ReLU -> Linear(32, 1)``) on a sequential (unshuffled) loader,
so batch ``b`` of the first epoch is rows ``b * batch_size ...``. hparams:

* ``lr``, ``momentum`` (SGD, default 0.5), ``records``, ``global_batch_size``; ``batchnorm``
  (default true);
* ``overflow_batches``: first-epoch batches whose inputs are ``1e20``: without batch norm, such
  a batch overflows in every precision (float16 at the first layer, float32 at the loss,
  ``(1e20)**2``), so its loss is inf or NaN and its gradients are not finite;
* ``apex``: keyword arguments for ``configure_apex_amp`` (``ApexTrial``).

``python -m tests.support.amp_trials SPEC.json`` fits the trial SPEC names (``trial``, ``hparams``,
``config``, ``max_length``, ``run_dir``, optional ``latest_checkpoint``) and saves its final
state to ``SPEC["out"]`` (see :func:`final_state`): the resume tests continue a run in a process
that shares nothing with the one that wrote the checkpoint.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import torch
from torch import nn

from hookdet import pytorch
from hookdet.plugin import run_of
from tests.support.trials import fit

OVERFLOW_VALUE = 1e20


class RegressionTrial(pytorch.PyTorchTrial):
    """Trains in float32 unless a subclass (or the experiment file) switches precision on.

    Records, for every training batch: the dtype of the first layer's output (a forward hook on
    the real submodule) and of the model's output, the loss (kept on the device), and — before
    the batch runs — the parameters and the loss scale(s) (:meth:`current_scales`).
    """

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        self.before_wrapping()
        layers: List[nn.Module] = [nn.Linear(8, 32)]
        if hp.get("batchnorm", True):
            layers.append(nn.BatchNorm1d(32))
        layers += [nn.ReLU(), nn.Linear(32, 1)]
        self.model = context.wrap_model(nn.Sequential(*layers))
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=hp["lr"], momentum=hp.get("momentum", 0.5))
        )
        self.after_wrapping()
        self.hidden_dtypes: List[torch.dtype] = []
        self.output_dtypes: List[torch.dtype] = []
        self.losses: List[torch.Tensor] = []
        self.weights_before: List[List[torch.Tensor]] = []
        self.scales_before: List[List[float]] = []
        self.model[0].register_forward_hook(self._record_hidden)

    def _record_hidden(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        if module.training:
            self.hidden_dtypes.append(output.dtype)

    def current_scales(self) -> List[float]:
        """The loss scale(s) in use (none in float32)."""
        return []

    def _record_before(self) -> None:
        self.weights_before.append([p.detach().clone() for p in self.model.parameters()])
        self.scales_before.append(self.current_scales())

    def before_wrapping(self) -> None:
        """Switch precision on before any model is wrapped (``use_amp``, ``wrap_scaler``)."""

    def after_wrapping(self) -> None:
        """Switch precision on after wrapping (``configure_apex_amp``)."""

    def _dataset(self, overflow: bool) -> torch.utils.data.Dataset:
        hp = self.context.get_hparams()
        generator = torch.Generator().manual_seed(1234)
        x = torch.randn(hp["records"], 8, generator=generator)
        w = torch.randn(8, 1, generator=generator)
        y = x @ w + 0.05 * torch.randn(hp["records"], 1, generator=generator)
        if overflow:
            size = self.context.get_per_slot_batch_size()
            for batch in hp.get("overflow_batches", []):
                x[batch * size:(batch + 1) * size] = OVERFLOW_VALUE
        return torch.utils.data.TensorDataset(x, y)

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self._dataset(True), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self._dataset(False), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        self._record_before()
        x, y = batch
        output = self.model(x)
        self.output_dtypes.append(output.dtype)
        loss = nn.functional.mse_loss(output, y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        self.losses.append(loss.detach())
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}


class UseAmpTrial(RegressionTrial):
    """Determined's automatic mode: ``context.experimental.use_amp()`` first thing."""

    def before_wrapping(self) -> None:
        self.context.experimental.use_amp()

    def current_scales(self) -> List[float]:
        scaler = self.context.precision.scaler
        return [scaler.get_scale()] if scaler.is_enabled() else []


class UseAmpAfterWrapTrial(RegressionTrial):
    """Calls ``use_amp()`` after ``wrap_model`` (Determined refuses this order)."""

    def after_wrapping(self) -> None:
        self.context.experimental.use_amp()


class ManualScalerTrial(RegressionTrial):
    """Determined's manual mode: the trial autocasts to float16, scales its loss, steps through
    its scaler and updates it; ``wrap_scaler`` only registers the scaler."""

    def before_wrapping(self) -> None:
        hp = self.context.get_hparams()
        self.scaler = self.context.wrap_scaler(
            torch.amp.GradScaler(
                "cpu",
                init_scale=hp.get("init_scale", 2.0**16),
                growth_interval=hp.get("growth_interval", 2000),
            )
        )

    def current_scales(self) -> List[float]:
        return [self.scaler.get_scale()]

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        self._record_before()
        x, y = batch
        with torch.autocast("cpu", dtype=torch.float16):
            output = self.model(x)
            loss = nn.functional.mse_loss(output, y)
        self.output_dtypes.append(output.dtype)
        self.context.backward(self.scaler.scale(loss))
        self.context.step_optimizer(self.optimizer, scaler=self.scaler)
        self.scaler.update()
        self.losses.append(loss.detach())
        return {"loss": loss}


class ApexTrial(RegressionTrial):
    """A Determined apex trial: wrap, then ``configure_apex_amp(**hparams["apex"])``."""

    def after_wrapping(self) -> None:
        self.model, self.optimizer = self.context.configure_apex_amp(
            models=self.model, optimizers=self.optimizer, **self.context.get_hparams().get("apex", {})
        )

    def current_scales(self) -> List[float]:
        backend = self.context.precision.backend
        return [scaler.scale.item() for scaler in backend.scalers] if backend is not None else []


class TwoLossApexTrial(ApexTrial):
    """Two losses, two ``backward`` calls per batch (loss ids 0 and 1 in Determined's scheme);
    the second overflows on the batches listed in the ``overflow_second_loss`` hparam."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        self._record_before()
        x, y = batch
        first = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(first)
        overflow = batch_idx in self.context.get_hparams().get("overflow_second_loss", [])
        scale = OVERFLOW_VALUE if overflow else 1.0
        second = nn.functional.mse_loss(self.model(x * scale), y)
        self.context.backward(second)
        self.context.step_optimizer(self.optimizer)
        return {"loss": first, "second_loss": second}


TRIALS = {
    cls.__name__: cls
    for cls in (RegressionTrial, UseAmpTrial, ManualScalerTrial, ApexTrial, TwoLossApexTrial)
}


def final_state(trial: RegressionTrial) -> Dict[str, Any]:
    """What the resume tests compare: weights, optimizer state and every plugin's state."""
    run = run_of(trial.context)
    return {
        "model": {k: v.clone() for k, v in trial.context.unwrapped_models[0].state_dict().items()},
        "optimizer": trial.optimizer.state_dict(),
        "plugins": {
            name: plugin.state_dict()
            for name, plugin in run.plugins.named_plugins().items()
            if name in ("amp", "apex")
        },
        "batches_trained": run.state.batches_trained,
    }


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    kwargs: Dict[str, Any] = {"max_length": pytorch.Batch(spec["max_length"])}
    if spec.get("latest_checkpoint"):
        kwargs["latest_checkpoint"] = spec["latest_checkpoint"]
    trial = fit(TRIALS[spec["trial"]], spec["hparams"], Path(spec["run_dir"]), spec.get("config"), **kwargs)
    torch.save(final_state(trial), spec["out"])


if __name__ == "__main__":
    main(sys.argv[1])
