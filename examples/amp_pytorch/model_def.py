"""Automatic mixed precision with ``context.experimental.use_amp()``, as in Determined.

One call, before any ``wrap_model``, and the trial code stays as it was: hookdet's ``amp`` plugin
runs every wrapped model's forward pass under ``torch.autocast`` (matrix multiplies and
convolutions in reduced precision, reductions and losses in float32), and, when that precision
is float16, scales the loss in ``context.backward``, unscales the gradients before clipping in
``context.step_optimizer``, skips steps whose gradients overflowed and updates the scale after
each step. The scaler's state is saved in checkpoints, so a resumed run scales exactly as the
uninterrupted one would have.

The precision is the plugin's to choose: float16 with loss scaling on a GPU, bfloat16 (same
exponent range as float32, so no scaling) on a CPU. ``plugin_config.amp`` in the experiment file
overrides it (``dtype``, the ``GradScaler`` settings, or ``enabled: false`` to compare against
float32 without touching the trial).

The model and data are the MNIST example's (scikit-learn's digits at 28x28).
"""
from typing import Any, Dict

import torch
from torch import nn

import data
from hookdet import pytorch


class MNistAutoAMPTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        # Must come before wrap_model: the models wrapped afterwards are the ones autocast.
        self.context.experimental.use_amp()

        n_filters1, n_filters2 = self.context.get_hparam("n_filters1"), self.context.get_hparam("n_filters2")
        self.model = self.context.wrap_model(
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
        self.optimizer = self.context.wrap_optimizer(
            torch.optim.Adam(self.model.parameters(), lr=self.context.get_hparam("learning_rate"))
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            data.get_dataset(train=True), batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(data.get_dataset(train=False), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int) -> Dict[str, torch.Tensor]:
        images, labels = batch
        # The model's output comes back in float32, so the loss is computed in full precision.
        loss = nn.functional.cross_entropy(self.model(images), labels)
        self.context.backward(loss)
        # Gradients are unscaled before clipping; clipping sees their true size.
        self.context.step_optimizer(
            self.optimizer, clip_grads=lambda params: torch.nn.utils.clip_grad_norm_(params, 1.0)
        )
        return {"loss": loss}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> Dict[str, Any]:
        images, labels = batch
        logits = self.model(images)
        return {
            "validation_loss": nn.functional.cross_entropy(logits, labels),
            "accuracy": logits.argmax(dim=1).eq(labels).float().mean(),
        }
