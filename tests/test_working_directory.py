"""A ``module:Class`` trial runs in its model directory, as Determined's harness runs it (and as
hookdet runs scripts), so a relative data path means the same wherever the user stands; the paths
given on the command line (``--run-dir``, ``--resume``) keep meaning what they meant where the
user typed them."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.faults.harness import child_env
from tests.support import hookdet_process

TRIAL = '''
import os
from pathlib import Path

import torch
from hookdet import pytorch


class ReadsRelativeData(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        rows = [float(v) for v in Path("data/values.txt").read_text().split()]  # relative to the model
        self.data = torch.tensor(rows).reshape(-1, 1)
        Path(os.environ["SEEN_CWD"]).write_text(os.getcwd())
        self.model = context.wrap_model(torch.nn.Linear(1, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def build_training_data_loader(self):
        return pytorch.DataLoader(torch.utils.data.TensorDataset(self.data), batch_size=2)

    def build_validation_data_loader(self):
        return pytorch.DataLoader(torch.utils.data.TensorDataset(self.data), batch_size=2)

    def train_batch(self, batch, epoch_idx, batch_idx):
        loss = self.model(batch[0]).pow(2).mean()
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        return {"validation_loss": self.model(batch[0]).pow(2).mean()}
'''


def test_a_trial_class_runs_in_its_model_directory(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "data").mkdir(parents=True)
    (model / "data" / "values.txt").write_text("1 2 3 4")
    (model / "relative_trial.py").write_text(TRIAL)
    (model / "exp.yaml").write_text(yaml.safe_dump({
        "entrypoint": "relative_trial:ReadsRelativeData",
        "hyperparameters": {"global_batch_size": 2},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 4}},
        "min_checkpoint_period": {"batches": 2},
    }))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    seen = tmp_path / "cwd.txt"

    def hookdet(*args: str) -> subprocess.CompletedProcess:
        result = hookdet_process.run("run", "../model/exp.yaml", *args, cwd=elsewhere, env=child_env(SEEN_CWD=str(seen)),
                                     timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    hookdet("--run-dir", "run")
    assert seen.read_text() == str(model.resolve())
    assert (elsewhere / "run" / "metrics.jsonl").is_file() and not (model / "run").exists()

    # --resume with a relative path, typed where the user stands.
    hookdet("--resume", "run", "--config", "searcher.max_length.batches=6")
    steps = [json.loads(line)["steps_completed"] for line in (elsewhere / "run" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["group"] == "training"]
    assert steps == [2, 4, 6]  # reported at each checkpoint; the resume went on from batch 4
