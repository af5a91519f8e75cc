"""Trials for the differential suite, written once against Determined's public API.

Every trial imports its framework through ``PARITY_FRAMEWORK`` (``determined`` or ``hookdet``),
so this one file runs unchanged under both; what each observes goes to :mod:`tests.parity.record`.
Models are tiny linear layers on 16 synthetic records (4 batches of 4 per epoch, per rank), so a
whole case runs in a second or two.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Dict

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from tests.parity.record import LATEST_CHECKPOINT, event, plain, type_name

pytorch = importlib.import_module(os.environ.get("PARITY_FRAMEWORK", "hookdet") + ".pytorch")

RECORDS = 16


class Regression(Dataset):
    """``RECORDS`` fixed records ``(x, y, index)``: the index tells which records a batch held."""

    def __init__(self, records: int = RECORDS, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(records, 3, generator=generator)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1 * torch.randn(records, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> Any:
        return self.x[index], self.y[index], index


def getters(context: Any) -> Dict[str, Any]:
    """What ``train_batch``/``evaluate_batch`` can ask the context, a user's view of it."""
    return {
        "hparams": context.get_hparams(),
        "global_batch_size": context.get_global_batch_size(),
        "per_slot_batch_size": context.get_per_slot_batch_size(),
        "rank": context.distributed.get_rank(),
        "size": context.distributed.get_size(),
        "stop_requested": context.get_stop_requested(),
        "enable_tensorboard_logging": context.get_enable_tensorboard_logging(),
    }


def train_getters(context: Any) -> Dict[str, Any]:
    """:func:`getters` plus the ones that only mean something while training."""
    return dict(
        getters(context),
        current_train_batch=context.current_train_batch(),
        current_train_epoch=context.current_train_epoch(),
        is_epoch_start=context.is_epoch_start(),
        is_epoch_end=context.is_epoch_end(),
    )


class Recorder(pytorch.PyTorchCallback):
    """Records every callback call with its arguments, and where training stands at that moment."""

    def __init__(self, trial: Any, name: str = "recorder") -> None:
        self.trial = trial
        self.name = name
        self.calls = 0

    def _seen(self, method: str, **arguments: Any) -> None:
        self.calls += 1
        event("callback", name=self.name, method=method, trained=self.trial.trained, **arguments)

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Any) -> None:
        self._seen("on_trial_startup", first_batch_idx=first_batch_idx, checkpoint_uuid=_kind(checkpoint_uuid))

    def on_trial_shutdown(self) -> None:
        self._seen("on_trial_shutdown")

    def on_training_start(self) -> None:
        self._seen("on_training_start")

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self._seen("on_training_epoch_start", epoch_idx=epoch_idx)

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self._seen("on_training_epoch_end", epoch_idx=epoch_idx)

    def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
        self._seen(
            "on_training_workload_end",
            avg_metrics=avg_metrics,
            batch_metrics=batch_metrics,
            types=[type_name(avg_metrics), type_name(batch_metrics)]
            + sorted({type_name(v) for m in batch_metrics for v in m.values()}),
        )

    def on_validation_start(self) -> None:
        self._seen("on_validation_start")

    def on_validation_epoch_start(self) -> None:
        self._seen("on_validation_epoch_start")

    def on_validation_epoch_end(self, outputs: Any) -> None:
        self._seen("on_validation_epoch_end", outputs=outputs)

    def on_validation_end(self, metrics: Any) -> None:
        self._seen("on_validation_end", metrics=metrics, types=sorted({type_name(v) for v in metrics.values()}))

    def on_checkpoint_load_start(self, checkpoint: Any) -> None:
        self._seen("on_checkpoint_load_start", checkpoint_keys=_determined_keys(checkpoint))

    def on_checkpoint_save_start(self, checkpoint: Any) -> None:
        self._seen("on_checkpoint_save_start", checkpoint_keys=_determined_keys(checkpoint))

    def on_checkpoint_write_end(self, checkpoint_dir: Any) -> None:
        self._seen("on_checkpoint_write_end", checkpoint_dir=_directory(checkpoint_dir))

    def on_checkpoint_upload_end(self, uuid: Any) -> None:
        LATEST_CHECKPOINT.append(uuid)
        self._seen("on_checkpoint_upload_end", uuid=_kind(uuid))

    def on_checkpoint_end(self, checkpoint_dir: Any) -> None:
        self._seen("on_checkpoint_end", checkpoint_dir=_directory(checkpoint_dir))

    def state_dict(self) -> Dict[str, Any]:
        self._seen("state_dict")
        return {"calls": self.calls, "name": self.name}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._seen("load_state_dict", state=state_dict)
        self.calls = state_dict["calls"]


#: The keys Determined's own checkpoint dict has; hookdet adds its own (see expected differences).
DETERMINED_CHECKPOINT_KEYS = (
    "models_state_dict",
    "optimizers_state_dict",
    "lr_schedulers_state_dict",
    "callbacks",
    "amp_state",
    "scalers_state_dict",
    "rng_state",
)


def _determined_keys(checkpoint: Any) -> Any:
    return sorted(key for key in checkpoint if key in DETERMINED_CHECKPOINT_KEYS)


def _kind(value: Any) -> Any:
    """A uuid-like string reads as "str" (its value differs per run), None as None."""
    return None if value is None else type(value).__name__


def _directory(value: Any) -> Any:
    return {"type": type(value).__name__, "is_dir": os.path.isdir(str(value))}


class BaseTrial(pytorch.PyTorchTrial):
    """One linear model, SGD, MSE; records every batch, its metrics and the context's getters."""

    #: Whether evaluate_batch takes batch_idx (overridden by subclasses that say otherwise).
    lr = 0.05

    def __init__(self, context: Any) -> None:
        self.context = context
        self.trained = 0  # batches trained so far (the last train_batch's batch_idx + 1)
        self.model = context.wrap_model(nn.Linear(3, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=self.lr))
        event("init", getters=getters(context))

    def build_callbacks(self) -> Dict[str, Any]:
        return {"recorder": Recorder(self)}

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(Regression(), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(Regression(8, seed=1), batch_size=self.context.get_per_slot_batch_size())

    def loss(self, batch: Any) -> torch.Tensor:
        x, y, _ = batch
        return nn.functional.mse_loss(self.model(x), y)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        event("train_batch", epoch_idx=epoch_idx, batch_idx=batch_idx, records=batch[2],
              getters=train_getters(self.context))
        loss = self.loss(batch)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        self.trained = batch_idx + 1
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        event("evaluate_batch", records=batch[2], getters=getters(self.context))
        return {"val_loss": self.loss(batch)}


class Basic(BaseTrial):
    """The plainest trial: ``evaluate_batch(batch)``, one callback."""
