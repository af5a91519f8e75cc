"""Child process of tests/test_replacement_plugins.py: three runs with the replacement plugins
(an uninterrupted one, one stopped at a checkpoint, one resumed from it); prints a JSON summary."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any, Dict

import torch

from hookdet import pytorch
from hookdet.plugin import run_of

HP = {"lr": 0.05, "global_batch_size": 2}
PLUGINS = ["no:tensorboard", "no:progress", "no:amp", "csv_writer", "bf16_autocast", "line_progress"]


class ReplacedTrial(pytorch.PyTorchTrial):
    """Mixed precision, a TensorBoard writer and the initial batch, all asked of the context."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        context.experimental.use_amp()
        torch.manual_seed(0)
        self.model = context.wrap_model(torch.nn.Sequential(torch.nn.Linear(4, 1)))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=HP["lr"]))
        self.writer = context.get_tensorboard_writer()
        self.initial_batch = None

    def _data(self) -> torch.utils.data.Dataset:
        generator = torch.Generator().manual_seed(1)
        return torch.utils.data.TensorDataset(torch.randn(16, 4, generator=generator), torch.randn(16, 1, generator=generator))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        self.initial_batch = self.context.get_initial_batch()
        return pytorch.DataLoader(self._data(), batch_size=2, shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self._data(), batch_size=4)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        x, y = batch
        output = self.model(x)
        loss = torch.nn.functional.mse_loss(output, y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        self.writer.add_scalar("trial/loss", loss.item(), batch_idx)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}


def run(run_dir: Path, storage_root: Path, max_batches: int, resume: Any = None) -> Dict[str, Any]:
    exp_conf = {
        "hyperparameters": HP,
        "plugins": PLUGINS,
        "checkpoint_storage": {"type": "flat_storage", "root": str(storage_root), "save_trial_latest": 1},
        "searcher": {"name": "single", "metric": "validation_loss", "smaller_is_better": True},
    }
    autocast_seen = []
    with pytorch.init(exp_conf=exp_conf, run_dir=run_dir) as context:
        trial = ReplacedTrial(context)
        # Inside the model's forward: under the replacement's autocast, the layer computes in bfloat16.
        trial.model[0].register_forward_hook(lambda m, i, o: autocast_seen.append(str(o.dtype)))
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(max_batches), checkpoint_period=pytorch.Batch(4),
            validation_period=pytorch.Batch(4), reporting_period=pytorch.Batch(2), latest_checkpoint=resume,
        )
        run_state = run_of(context).state
        loaded = sorted(run_of(context).plugins.named_plugins())
        enabled = context.get_enable_tensorboard_logging()
    return {
        "weights": [p.detach().clone() for p in trial.model.parameters()],
        "initial_batch": trial.initial_batch,
        "autocast_in_forward": sorted(set(autocast_seen)),
        "latest_checkpoint": run_state.latest_checkpoint,
        "loaded": loaded,
        "tensorboard_enabled": enabled,
        "scalars": [row for row in csv.reader((run_dir / "scalars.csv").open())],
        "progress": (run_dir / "progress.txt").read_text().splitlines(),
        "reports": [json.loads(line)["steps_completed"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()],
    }


def main(root: Path) -> None:
    storage = root / "flat"
    whole = run(root / "whole", storage, 8)
    stopped = run(root / "stopped", storage, 4)
    resumed = run(root / "resumed", storage, 8, resume=stopped["latest_checkpoint"])
    summary = {
        "exact": all(torch.equal(a, b) for a, b in zip(whole["weights"], resumed["weights"])),
        "stopped_differs": not all(torch.equal(a, b) for a, b in zip(whole["weights"], stopped["weights"])),
        "builtins_imported": sorted(
            name for name in ("amp", "tensorboard", "progress", "storage") if f"hookdet.plugins.builtin.{name}" in sys.modules
        ),
        "storage_ids": sorted(p.name for p in storage.iterdir()),
        "recorded_storage": json.loads((root / "whole" / "run_identity.json").read_text())["storage"],
    }
    for name, result in (("whole", whole), ("stopped", stopped), ("resumed", resumed)):
        result.pop("weights")
        summary[name] = result
    print(json.dumps(summary))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
