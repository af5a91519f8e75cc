"""Determined's MNIST tutorial trial, run by hookdet: a two-convolution CNN on 1x28x28 digits.

The trial is written exactly as for ``determined.pytorch``; the only hookdet-specific line is the
import. ``__init__`` wraps the model and optimizer, ``train_batch`` runs one forward/backward/step,
``evaluate_batch`` reports the searcher metric (``validation_loss``) and the accuracy. The data is
scikit-learn's digits upsampled to 28x28 (see ``data.py``), so the example runs offline.
"""
from typing import Any, Dict

import torch
from torch import nn

import data
from hookdet import pytorch


def build_model(n_filters1: int, n_filters2: int, dropout1: float, dropout2: float) -> nn.Module:
    """The tutorial's network: 28x28 -> two 3x3 convolutions -> 2x2 max-pool -> two linear layers."""
    return nn.Sequential(
        nn.Conv2d(1, n_filters1, kernel_size=3),
        nn.ReLU(),
        nn.Conv2d(n_filters1, n_filters2, kernel_size=3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(dropout1),
        nn.Flatten(),
        nn.Linear(12 * 12 * n_filters2, 128),
        nn.ReLU(),
        nn.Dropout(dropout2),
        nn.Linear(128, 10),
        nn.LogSoftmax(dim=1),
    )


class MNistTrial(pytorch.PyTorchTrial):
    """One model, one optimizer; the loss is the negative log-likelihood of the log-softmax."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = self.context.wrap_model(
            build_model(
                n_filters1=self.context.get_hparam("n_filters1"),
                n_filters2=self.context.get_hparam("n_filters2"),
                dropout1=self.context.get_hparam("dropout1"),
                dropout2=self.context.get_hparam("dropout2"),
            )
        )
        self.optimizer = self.context.wrap_optimizer(
            torch.optim.Adadelta(self.model.parameters(), lr=self.context.get_hparam("learning_rate"))
        )
        self.loss_fn = nn.NLLLoss()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        # shuffle=True is resume-exact under hookdet: the order is a function of seed and epoch.
        return pytorch.DataLoader(
            data.get_dataset(train=True),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=True,
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            data.get_dataset(train=False), batch_size=self.context.get_per_slot_batch_size()
        )

    def train_batch(self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int) -> Dict[str, torch.Tensor]:
        images, labels = batch
        loss = self.loss_fn(self.model(images), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> Dict[str, Any]:
        images, labels = batch
        output = self.model(images)
        predictions = output.argmax(dim=1)
        return {
            "validation_loss": self.loss_fn(output, labels).item(),
            "accuracy": predictions.eq(labels).float().mean().item(),
        }
