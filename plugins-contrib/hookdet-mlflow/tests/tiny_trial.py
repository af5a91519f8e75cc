"""A one-weight trial (``y = w * x`` on ones, SGD on MSE) the plugin's tests train in a blink."""
from __future__ import annotations

from typing import Any, Dict

import torch
from torch import nn

from hookdet import pytorch


class TinyTrial(pytorch.PyTorchTrial):
    """hparams: lr, records, global_batch_size; stop_after (optional): ask to stop after that many
    batches, as a preempted trial would."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(1, 1, bias=False))
        with torch.no_grad():
            self.model.weight.zero_()
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"))
        )

    def _loader(self) -> pytorch.DataLoader:
        records = self.context.get_hparam("records")
        data = torch.utils.data.TensorDataset(torch.ones(records, 1), torch.ones(records, 1))
        return pytorch.DataLoader(data, batch_size=self.context.get_per_slot_batch_size())

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return self._loader()

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return self._loader()

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        if batch_idx + 1 == self.context.get_hparams().get("stop_after"):
            self.context.set_stop_requested(True)
        return {"loss": loss, "weight": self.model.weight.detach().clone().reshape(())}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}
