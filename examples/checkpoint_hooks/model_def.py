"""Checkpoint hooks: put your own keys and files into checkpoints and read them back on resume.

Two ``PyTorchCallback``s, returned by ``build_callbacks``, show the three ways a trial adds to
what hookdet saves:

* ``InferenceNotes`` implements the checkpoint hooks. ``on_checkpoint_save_start(checkpoint)``
  receives the state dict about to be written (models, optimizers, ...) and adds the keys an
  inference service needs beside the weights: the class names and the preprocessing the model
  was trained with. ``on_checkpoint_write_end(checkpoint_dir)`` adds a file (``labels.txt``) to
  the checkpoint directory before its manifest is sealed, so the file is checksummed with the
  rest. ``on_checkpoint_load_start(checkpoint)`` gets the loaded dict before it is applied: it
  fills in keys an older checkpoint lacks and refuses to resume when the preprocessing changed
  since the checkpoint was written (the weights would silently be wrong).
* ``ValidationHistory`` keeps state of its own through ``state_dict``/``load_state_dict``: hookdet
  stores it in every checkpoint under the callback's name (``"validation_history"``) and restores
  it on resume, so the history spans the whole training, however often it was interrupted.

Everything added must load with ``torch.load(weights_only=True)``: tensors and plain Python
values (str, int, float, bool, None, lists, tuples and dicts of them). hookdet checks this before
writing and names the offending key.

The model and data are the MNIST example's (scikit-learn's digits at 28x28).
"""
from pathlib import Path
from typing import Any, Dict, List

import torch
from torch import nn

import data
from hookdet import pytorch

CLASS_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
NOTES_FORMAT = 2


def preprocessing() -> Dict[str, Any]:
    """How ``data.py`` turns a digit into the model's input; inference must do the same."""
    return {"image_size": data.IMAGE_SIZE, "mean": data.MNIST_MEAN, "std": data.MNIST_STD}


class InferenceNotes(pytorch.PyTorchCallback):
    """Adds class names and preprocessing to every checkpoint; checks them on resume."""

    def __init__(self) -> None:
        self.restored_notes: Dict[str, Any] = {}

    def on_checkpoint_save_start(self, checkpoint: Dict[str, Any]) -> None:
        checkpoint["class_names"] = list(CLASS_NAMES)
        checkpoint["preprocessing"] = preprocessing()
        checkpoint["notes_format"] = NOTES_FORMAT

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        (Path(checkpoint_dir) / "labels.txt").write_text("\n".join(CLASS_NAMES) + "\n")

    def on_checkpoint_load_start(self, checkpoint: Dict[str, Any]) -> None:
        # A checkpoint written before notes_format 2 had no preprocessing key: it used this one.
        checkpoint.setdefault("preprocessing", {"image_size": 28, "mean": 0.1307, "std": 0.3081})
        if checkpoint["preprocessing"] != preprocessing():
            raise ValueError(
                f"this checkpoint was trained on inputs preprocessed as {checkpoint['preprocessing']}, "
                f"but data.py now gives {preprocessing()}; resume with the original preprocessing"
            )
        keys = ("class_names", "preprocessing", "notes_format")
        self.restored_notes = {key: checkpoint.get(key) for key in keys}


class ValidationHistory(pytorch.PyTorchCallback):
    """Every validation's accuracy, kept across resumes by the callback state protocol."""

    def __init__(self) -> None:
        self.history: List[Dict[str, float]] = []

    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        self.history.append(
            {"accuracy": float(metrics["accuracy"]), "validation_loss": float(metrics["validation_loss"])}
        )

    @property
    def best_accuracy(self) -> float:
        return max((entry["accuracy"] for entry in self.history), default=0.0)

    def state_dict(self) -> Dict[str, Any]:
        return {"history": [dict(entry) for entry in self.history]}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.history = [dict(entry) for entry in state_dict["history"]]


class MNistTrial(pytorch.PyTorchTrial):
    """The MNIST trial plus the two callbacks above."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
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
                nn.Linear(128, len(CLASS_NAMES)),
                nn.LogSoftmax(dim=1),
            )
        )
        self.optimizer = self.context.wrap_optimizer(
            torch.optim.Adadelta(self.model.parameters(), lr=self.context.get_hparam("learning_rate"))
        )
        self.notes = InferenceNotes()
        self.validation_history = ValidationHistory()

    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        # The names are the keys under which callback state is saved: keep them stable.
        return {"inference_notes": self.notes, "validation_history": self.validation_history}

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            data.get_dataset(train=True), batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(data.get_dataset(train=False), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int) -> Dict[str, torch.Tensor]:
        images, labels = batch
        loss = nn.functional.nll_loss(self.model(images), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> Dict[str, Any]:
        images, labels = batch
        output = self.model(images)
        return {
            "validation_loss": nn.functional.nll_loss(output, labels).item(),
            "accuracy": output.argmax(dim=1).eq(labels).float().mean().item(),
        }
