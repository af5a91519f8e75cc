"""A CIFAR-10 CNN in the style of Determined's ``cifar10_pytorch`` example, with an epoch LR schedule.

Four 3x3 convolutions in two blocks, each block ending in 2x2 max-pooling and dropout, then two
linear layers (the Keras ``cifar10_cnn`` architecture Determined's example follows). The learning
rate decays by ``lr_decay`` at the end of every epoch: the trial hands its torch scheduler to
``context.wrap_lr_scheduler(..., step_mode=STEP_EVERY_EPOCH)`` and never calls ``step()`` itself;
the loop steps it after the last batch of each epoch, and checkpoints carry its state, so a
resumed run continues on the same schedule. ``train_batch`` reports the rate it trained with as
the ``lr`` metric so the schedule is visible in ``metrics.jsonl`` and TensorBoard.

The images are generated (see ``data.py``); sizes come from the experiment file's ``data`` block.
"""
from typing import Any, Dict

import torch
from torch import nn

import data
from hookdet import pytorch


def accuracy_rate(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The fraction of ``labels`` the ``logits`` rank first, as a 0-d tensor (no host sync)."""
    return (logits.argmax(dim=1) == labels).float().mean()


class CIFARTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        width = self.context.get_hparam("base_filters")
        self.model = self.context.wrap_model(
            nn.Sequential(
                nn.Conv2d(data.NUM_CHANNELS, width, kernel_size=3),  # 32 -> 30
                nn.ReLU(),
                nn.Conv2d(width, width, kernel_size=3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),  # 30 -> 15
                nn.Dropout(self.context.get_hparam("layer1_dropout")),
                nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
                nn.ReLU(),
                nn.Conv2d(2 * width, 2 * width, kernel_size=3),  # 15 -> 13
                nn.ReLU(),
                nn.MaxPool2d(2),  # 13 -> 6
                nn.Dropout(self.context.get_hparam("layer2_dropout")),
                nn.Flatten(),
                nn.Linear(2 * width * 6 * 6, 256),
                nn.ReLU(),
                nn.Dropout(self.context.get_hparam("layer3_dropout")),
                nn.Linear(256, data.NUM_CLASSES),
            )
        )
        self.optimizer = self.context.wrap_optimizer(
            torch.optim.Adam(
                self.model.parameters(),
                lr=self.context.get_hparam("learning_rate"),
                weight_decay=self.context.get_hparam("weight_decay"),
            )
        )
        self.lr_scheduler = self.context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(
                self.optimizer, step_size=1, gamma=self.context.get_hparam("lr_decay")
            ),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        records = self.context.get_data_config()["train_records"]
        return pytorch.DataLoader(
            data.get_dataset(train=True, records=records),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=True,
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        records = self.context.get_data_config()["validation_records"]
        return pytorch.DataLoader(
            data.get_dataset(train=False, records=records), batch_size=self.context.get_per_slot_batch_size()
        )

    def train_batch(self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        images, labels = batch
        learning_rate = self.lr_scheduler.get_last_lr()[0]
        logits = self.model(images)
        loss = nn.functional.cross_entropy(logits, labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        accuracy = accuracy_rate(logits.detach(), labels)
        return {"loss": loss, "train_accuracy": accuracy, "train_error": 1.0 - accuracy, "lr": learning_rate}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> Dict[str, Any]:
        images, labels = batch
        logits = self.model(images)
        accuracy = accuracy_rate(logits, labels)
        return {
            "validation_loss": nn.functional.cross_entropy(logits, labels),
            "validation_accuracy": accuracy,
            "validation_error": 1.0 - accuracy,
        }
