"""A trial that reads its model's attributes through what ``wrap_model`` returned, as Determined
trials do (``self.model.weight``, ``self.model.fc``, ``self.model.latent_dim``), and records what
it saw in ``rank<r>-attributes.json`` in the run directory."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import torch
from torch import nn

from hookdet import pytorch
from tests.support.distributed_trials import LinearTrial


class Generator(nn.Module):
    """A submodule and a plain attribute next to ``LinearTrial``'s one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(1, 1, bias=False)
        self.latent_dim = 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class AttributeRecorder(pytorch.PyTorchCallback):
    def __init__(self, trial: "AttributeTrial") -> None:
        self.trial = trial

    def on_trial_shutdown(self) -> None:
        trial = self.trial
        run_dir = Path(trial.context.get_tensorboard_path()).parent
        rank = trial.context.distributed.get_rank()
        (run_dir / f"rank{rank}-attributes.json").write_text(json.dumps(trial.seen))


class AttributeTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.generator_module = Generator()
        self.generator = context.wrap_model(self.generator_module)
        self.seen: List[Dict[str, Any]] = []

    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        return {**super().build_callbacks(), "attributes": AttributeRecorder(self)}

    def _missing_attribute_error(self) -> str:
        try:
            self.model.no_such_attribute
        except AttributeError as error:
            return str(error)
        return "no error"

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        self.seen.append({
            "wrapper": type(self.model).__name__,
            "is_ddp": isinstance(self.model, torch.nn.parallel.DistributedDataParallel),
            "weight_is_the_modules": self.model.weight is self.module.weight,
            "weight": self.model.weight.item(),
            "fc_is_the_modules": self.generator.fc is self.generator_module.fc,
            "latent_dim": self.generator.latent_dim,
            "module_is_ddps_own": self.model.module is self.module,
            "missing": self._missing_attribute_error(),
        })
        return super().train_batch(batch, epoch_idx, batch_idx)
