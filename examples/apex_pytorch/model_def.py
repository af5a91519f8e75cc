"""NVIDIA apex mixed precision through ``context.configure_apex_amp``, as in Determined.

A trial written for Determined's apex integration wraps its models and optimizers as usual and
then hands them to ``context.configure_apex_amp(models=..., optimizers=..., opt_level="O1")``,
using what it returns from then on; ``context.backward`` and ``context.step_optimizer`` do the
loss scaling. ``opt_level`` is apex's: ``O0`` float32, ``O1`` autocast-style mixed precision (the
usual choice), ``O2`` float16 weights with float32 master weights, ``O3`` pure float16.

Determined refuses to run this without CUDA. hookdet's ``apex`` plugin uses apex when it is
installed and a GPU is present, and otherwise carries out the same ``opt_level`` with
``torch.autocast`` and a ``GradScaler``, so the trial also trains on a laptop's CPU, and the
scaler state is checkpointed either way. ``apex`` and ``amp`` never run together: a trial calls
``configure_apex_amp`` or ``use_amp``, not both.

The model and data are the MNIST example's (scikit-learn's digits at 28x28).
"""
from typing import Any, Dict

import torch
from torch import nn

import data
from hookdet import pytorch


class MNistApexAMPTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        n_filters1, n_filters2 = self.context.get_hparam("n_filters1"), self.context.get_hparam("n_filters2")
        model = self.context.wrap_model(
            nn.Sequential(
                nn.Conv2d(1, n_filters1, kernel_size=3),
                nn.ReLU(),
                nn.Conv2d(n_filters1, n_filters2, kernel_size=3),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Dropout(self.context.get_hparam("dropout1")),
                nn.Flatten(),
                nn.Linear(12 * 12 * n_filters2, 128),
                nn.ReLU(),
                nn.Dropout(self.context.get_hparam("dropout2")),
                nn.Linear(128, 10),
            )
        )
        optimizer = self.context.wrap_optimizer(
            torch.optim.Adam(model.parameters(), lr=self.context.get_hparam("learning_rate"))
        )
        # After wrapping, before training: use the objects configure_apex_amp returns.
        self.model, self.optimizer = self.context.configure_apex_amp(
            models=model, optimizers=optimizer, opt_level=self.context.get_hparam("opt_level")
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            data.get_dataset(train=True), batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(data.get_dataset(train=False), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int) -> Dict[str, torch.Tensor]:
        images, labels = batch
        # O1 returns float32 outputs; .float() keeps the loss in float32 at O2/O3 too.
        loss = nn.functional.cross_entropy(self.model(images).float(), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> Dict[str, Any]:
        images, labels = batch
        logits = self.model(images).float()
        return {
            "validation_loss": nn.functional.cross_entropy(logits, labels),
            "accuracy": logits.argmax(dim=1).eq(labels).float().mean(),
        }
