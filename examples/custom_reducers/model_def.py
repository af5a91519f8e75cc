"""Custom reducers: metrics that are not a mean of per-batch values, computed right across slots.

``evaluate_batch`` returns per-batch numbers that hookdet reduces per metric (``Reducer.AVG`` by
default: the mean over batches). Many metrics cannot be built that way: an F1 score of the whole
validation set is not the mean of per-batch F1 scores, and even accuracy, averaged per batch,
over-weights a short last batch. ``context.wrap_reducer`` registers a reducer that sees the whole
workload instead, on every slot, and combines the slots' partial results:

* ``PerClassF1`` is a :class:`~hookdet.pytorch.MetricReducer`. ``update`` counts, per class, the
  true positives, the predictions and the labels (as tensors on the device: no host sync per
  batch); ``per_slot_reduce`` hands those counts over once per workload; ``cross_slot_reduce`` adds
  every slot's counts and turns them into an F1 score per class plus their unweighted mean
  (macro F1). Wrapped with ``name=None``, it reports the dict it returns, one metric per key.
* ``exact_accuracy`` is a plain function over the values the trial passes to ``update``, here
  one ``(correct, count)`` pair per validation batch; hookdet gathers every slot's values and
  calls it once. Wrapped with ``name="exact_accuracy"`` and ``for_training=False``.

Reducers are reset before every training and validation workload, so each report covers exactly
the batches of that workload. The network and data are the MNIST example's.
"""
from typing import Any, Dict, List, Tuple

import torch
from torch import nn

import data
from hookdet import pytorch

NUM_CLASSES = 10


class PerClassF1(pytorch.MetricReducer):
    """F1 score of each class, and the macro F1, over every record of a workload on every slot."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        self.num_classes = num_classes
        self.reset()

    def reset(self) -> None:
        """Start counting afresh (hookdet calls this before every workload)."""
        self.counts = None  # created on the first update, on the device of the labels

    def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
        """Count one batch: the trial calls this from ``train_batch`` and ``evaluate_batch``."""
        if self.counts is None:
            self.counts = torch.zeros(3, self.num_classes, dtype=torch.long, device=labels.device)
        self.counts[0] += torch.bincount(labels[predictions == labels], minlength=self.num_classes)
        self.counts[1] += torch.bincount(predictions, minlength=self.num_classes)
        self.counts[2] += torch.bincount(labels, minlength=self.num_classes)

    def per_slot_reduce(self) -> List[List[int]]:
        """This slot's [true positives, predicted, actual] per class, as plain ints."""
        if self.counts is None:  # a slot that saw no batches in this workload
            return [[0] * self.num_classes for _ in range(3)]
        return self.counts.tolist()

    def cross_slot_reduce(self, per_slot_metrics: List[List[List[int]]]) -> Dict[str, float]:
        """Sum the slots' counts; F1 = 2 TP / (predicted + actual), 0 for a class never seen."""
        true_positives, predicted, actual = torch.tensor(per_slot_metrics, dtype=torch.float64).sum(dim=0)
        denominator = predicted + actual
        f1 = torch.where(
            denominator > 0, 2 * true_positives / denominator.clamp(min=1), torch.zeros_like(denominator)
        )
        scores = {f"f1_class_{index}": float(score) for index, score in enumerate(f1)}
        scores["macro_f1"] = float(f1.mean())
        return scores


def exact_accuracy(values: List[Tuple[int, int]]) -> float:
    """Correct predictions over all records, from every slot's ``(correct, count)`` pairs."""
    correct = sum(pair[0] for pair in values)
    count = sum(pair[1] for pair in values)
    return correct / count if count else 0.0


def build_model(n_filters1: int, n_filters2: int, dropout1: float, dropout2: float) -> nn.Module:
    """The MNIST example's network: two 3x3 convolutions, a 2x2 max-pool, two linear layers."""
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
        nn.Linear(128, NUM_CLASSES),
        nn.LogSoftmax(dim=1),
    )


class MNistTrial(pytorch.PyTorchTrial):
    """The MNIST trial plus two custom reducers (see the module docstring)."""

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
        # name=None: the reducer returns a dict and each key becomes a metric (training and
        # validation, each reset before its workload).
        self.f1_score = self.context.wrap_reducer(PerClassF1())
        # A function: wrap_reducer returns an object whose update(value) collects the values.
        self.accuracy = self.context.wrap_reducer(exact_accuracy, name="exact_accuracy", for_training=False)

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            data.get_dataset(train=True), batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(data.get_dataset(train=False), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int) -> Dict[str, torch.Tensor]:
        images, labels = batch
        output = self.model(images)
        loss = nn.functional.nll_loss(output, labels)
        self.f1_score.update(output.detach().argmax(dim=1), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> Dict[str, Any]:
        images, labels = batch
        output = self.model(images)
        predictions = output.argmax(dim=1)
        self.f1_score.update(predictions, labels)
        correct = int(predictions.eq(labels).sum())
        self.accuracy.update((correct, len(labels)))
        # The per-batch mean, reduced by Reducer.AVG, for comparison with exact_accuracy.
        return {
            "validation_loss": nn.functional.nll_loss(output, labels).item(),
            "accuracy": correct / len(labels),
        }
