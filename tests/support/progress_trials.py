"""Small trials for the live view and the run listing: many metrics, slow validation, failures."""
from __future__ import annotations

import os
import time
from typing import Any, Dict

import torch

from tests.support.trials import OneWeightTrial

#: Training metrics beyond the loss, so a report's metrics do not fit one 120-column line.
EXTRA_METRICS = [f"metric_{letter}" for letter in "abcdefghijklmnop"]


class ManyMetricsTrial(OneWeightTrial):
    """Sixteen extra training metrics and a validation whose searcher metric is not its first."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        for offset, name in enumerate(EXTRA_METRICS):
            metrics[name] = metrics["loss"] + offset
        return metrics

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        error = torch.nn.functional.mse_loss(self.model(x), y)
        return {"accuracy": 1.0 - error, "validation_loss": error}


class SlowValidationTrial(OneWeightTrial):
    """Each validation batch takes ``hparams.eval_sleep_s`` seconds."""

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        time.sleep(self.context.get_hparam("eval_sleep_s"))
        return super().evaluate_batch(batch)


class SlowTrainingTrial(OneWeightTrial):
    """Each training batch takes ``hparams.train_sleep_s`` seconds (time to send a signal)."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        time.sleep(self.context.get_hparam("train_sleep_s"))
        return super().train_batch(batch, epoch_idx, batch_idx)


class FailingTrial(OneWeightTrial):
    """Raises in ``train_batch`` at batch ``hparams.fail_at``."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        if batch_idx == self.context.get_hparam("fail_at"):
            raise RuntimeError(f"deliberate failure at batch {batch_idx} (pid {os.getpid()})")
        return super().train_batch(batch, epoch_idx, batch_idx)


class OddNamesTrial(OneWeightTrial):
    """Reports a metric and prints a line that are HTML (``hookdet ui`` must show them as text)."""

    METRIC = "<img src=x onerror=alert('metric')>"
    LINE = "<script>alert('log')</script>"

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        if batch_idx == 0:
            print(self.LINE, flush=True)
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        metrics[self.METRIC] = metrics["loss"]
        return metrics
