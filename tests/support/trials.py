"""Small trials the tests train, and a helper that fits one and returns what it reported."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from hookdet import pytorch
from hookdet.plugin import run_of


class RecordingCallback(pytorch.PyTorchCallback):
    """Collects every per-batch training metric and every validation result."""

    def __init__(self) -> None:
        self.batch_metrics: List[Dict[str, Any]] = []
        self.validations: List[Dict[str, Any]] = []

    def on_training_workload_end(self, avg_metrics: Dict[str, Any], batch_metrics: List[Dict[str, Any]]) -> None:
        self.batch_metrics.extend(batch_metrics)

    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        self.validations.append(dict(metrics))


class OneWeightTrial(pytorch.PyTorchTrial):
    """``y = w * x`` with ``w = 0``, inputs and labels 1, SGD on MSE: every step has a closed form.

    hparams: lr, records, clip (optional, clip_grad_value_), scheduler (optional StepMode name),
    scheduler_frequency, gamma.
    """

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        self.model = context.wrap_model(nn.Linear(1, 1, bias=False))
        with torch.no_grad():
            self.model.weight.zero_()
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=hp["lr"]))
        self.scheduler = None
        if hp.get("scheduler"):
            mode = pytorch.LRScheduler.StepMode[hp["scheduler"]]
            self.scheduler = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=hp.get("gamma", 0.5)),
                step_mode=mode,
                frequency=hp.get("scheduler_frequency", 1),
            )
        self.recorder = RecordingCallback()

    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        return {"recorder": self.recorder}

    def _dataset(self) -> torch.utils.data.Dataset:
        records = self.context.get_hparam("records")
        return torch.utils.data.TensorDataset(torch.ones(records, 1), torch.ones(records, 1))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self._dataset(), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self._dataset(), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        x, y = batch
        lr = self.optimizer.param_groups[0]["lr"]
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        clip = self.context.get_hparams().get("clip")
        clip_grads = None
        if clip is not None:
            def clip_grads(parameters: Any) -> None:
                torch.nn.utils.clip_grad_value_(parameters, clip)
        self.context.step_optimizer(self.optimizer, clip_grads=clip_grads)
        if self.scheduler is not None and self.context.get_hparams()["scheduler"] == "MANUAL_STEP":
            self.scheduler.step()
        return {"loss": loss, "weight": self.model.weight.detach().clone().reshape(()), "lr": lr}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}


def fit(
    trial_class: type,
    hparams: Dict[str, Any],
    run_dir: Path,
    config: Optional[Dict[str, Any]] = None,
    **fit_kwargs: Any,
) -> Any:
    """Train ``trial_class`` through the Trainer API; return the trial (its run is ``run_of(trial.context)``)."""
    exp_conf = {"hyperparameters": hparams, "plugins": {"only": ["callbacks", "checkpoint"]}, **(config or {})}
    with pytorch.init(hparams=hparams, exp_conf=exp_conf, run_dir=run_dir) as context:
        trial = trial_class(context)
        fit_kwargs.setdefault("reporting_period", pytorch.Batch(10))
        pytorch.Trainer(trial, context).fit(**fit_kwargs)
    return trial
