"""A Determined-style trial: a small CNN on scikit-learn's 8x8 handwritten digits.

The data ships inside scikit-learn, so nothing is downloaded. Written exactly as for
``determined.pytorch``; only the import differs.
"""
from typing import Any, Dict

import torch
from sklearn.datasets import load_digits
from torch import nn

from hookdet import pytorch


def digits_split(train: bool, validation_fraction: float = 0.2) -> torch.utils.data.TensorDataset:
    """The digits as (1x8x8 image in [0, 1], label) pairs; a fixed train/validation split."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = int(len(labels) * (1 - validation_fraction))
    chosen = order[:cut] if train else order[cut:]
    return torch.utils.data.TensorDataset(images[chosen], labels[chosen])


class DigitsTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hidden = context.get_hparam("hidden_channels")
        self.model = context.wrap_model(
            nn.Sequential(
                nn.Conv2d(1, hidden, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(hidden, 2 * hidden, 3, padding=1),
                nn.ReLU(),
                nn.Flatten(),
                nn.Dropout(context.get_hparam("dropout")),
                nn.Linear(2 * hidden * 16, 10),
            )
        )
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(
                self.model.parameters(),
                lr=context.get_hparam("learning_rate"),
                momentum=context.get_hparam("momentum"),
            )
        )
        self.scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=context.get_hparam("lr_decay")),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
        )
        self.loss_fn = nn.CrossEntropyLoss()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            digits_split(train=True), batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(digits_split(train=False), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        images, labels = batch
        loss = self.loss_fn(self.model(images), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        images, labels = batch
        logits = self.model(images)
        accuracy = (logits.argmax(dim=1) == labels).float().mean()
        return {"validation_loss": self.loss_fn(logits, labels), "accuracy": accuracy}
