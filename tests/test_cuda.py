"""What only a CUDA device can show; skipped on a machine without one.

Run on a GPU machine with ``bash scripts/device_check.sh`` (which also runs the AMP, apex,
checkpoint, resume and warm-search tests there, where every trial trains on ``cuda:0``):

- the per-batch path adds no device-to-host synchronisation: with
  ``torch.cuda.set_sync_debug_mode("warn")`` every synchronising CUDA call warns, and between the
  end of one ``train_batch`` and the start of the next no warning may come, except where a report
  is due (the report reads the metrics' values, once per reporting period);
- a run trained on the GPU resumes bit for bit there (dropout draws from the CUDA generator,
  which the checkpoint carries), and the same checkpoint resumes on a machine without a GPU.
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from torch import nn

from hookdet import pytorch
from hookdet.plugin import run_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

REPO = Path(__file__).resolve().parents[1]
SYNC_WARNING = "called a synchronizing CUDA operation"


class DropoutTrial(pytorch.PyTorchTrial):
    """An MLP with dropout over data that already lives on the run's device (so the data loader
    itself copies nothing from the host); records how many synchronisation warnings had come at the
    start and at the end of each batch."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        torch.manual_seed(0)
        self.model = context.wrap_model(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 1)))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9))
        self.caught: List[Any] = []
        self.marks: Dict[int, List[int]] = {}

    def _dataset(self) -> torch.utils.data.TensorDataset:
        generator = torch.Generator().manual_seed(1)
        inputs = torch.randn(512, 16, generator=generator)
        device = self.context.device
        return torch.utils.data.TensorDataset(inputs.to(device), inputs.sum(dim=1, keepdim=True).to(device))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self._dataset(), batch_size=self.context.get_per_slot_batch_size(), shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self._dataset(), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        start = sum(SYNC_WARNING in str(item.message) for item in self.caught)
        inputs, labels = batch
        loss = nn.functional.mse_loss(self.model(inputs), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        end = sum(SYNC_WARNING in str(item.message) for item in self.caught)
        self.marks[batch_idx] = [start, end]
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        inputs, labels = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(inputs), labels)}


def _config(batches: int) -> Dict[str, Any]:
    """An experiment file that names no plugins: hookdet's defaults run, as a user's would."""
    return {
        "hyperparameters": {"global_batch_size": 16},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": batches}},
        "reproducibility": {"experiment_seed": 5},
    }


def test_the_loop_adds_no_device_to_host_sync_between_batches(tmp_path: Path) -> None:
    batches, period = 200, 50
    config = _config(batches)
    with pytorch.init(hparams=config["hyperparameters"], exp_conf=config, run_dir=tmp_path / "run") as context:
        trial = DropoutTrial(context)
        assert next(trial.model.parameters()).device.type == "cuda"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trial.caught = caught
            torch.cuda.set_sync_debug_mode("warn")
            try:
                pytorch.Trainer(trial, context).fit(
                    max_length=pytorch.Batch(batches), reporting_period=pytorch.Batch(period)
                )
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert run_of(context).state.batches_trained == batches
    inside = {index: end - start for index, (start, end) in trial.marks.items() if end != start}
    assert inside == {}, f"the trial's own step synchronised (batch: warnings): {inside}"
    between = {
        index: trial.marks[index + 1][0] - trial.marks[index][1]
        for index in range(batches - 1)
        if (index + 1) % period != 0
    }
    synced = {index: count for index, count in between.items() if count}
    assert not synced, f"the loop synchronised between batches (batch: warnings): {synced}"
    at_reports = sum(trial.marks[index + 1][0] - trial.marks[index][1] for index in range(period - 1, batches - 1, period))
    print(f"synchronising calls: 0 on {len(between)} plain batch boundaries, {at_reports} at {batches // period - 1} reports")


def _train(run_dir: Path, batches: int, resume: Any = None) -> Dict[str, torch.Tensor]:
    config = _config(batches)
    with pytorch.init(hparams=config["hyperparameters"], exp_conf=config, run_dir=run_dir) as context:
        trial = DropoutTrial(context)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(batches), reporting_period=pytorch.Batch(10), latest_checkpoint=resume
        )
        weights = {name: value.detach().clone() for name, value in trial.model.state_dict().items()}
        momentum = [state["momentum_buffer"].clone() for state in trial.optimizer.state.values()]
    return {**weights, **{f"momentum.{index}": value for index, value in enumerate(momentum)}}


CPU_RESUME = """
import sys, torch
from pathlib import Path
assert not torch.cuda.is_available()
from tests.test_cuda import _train
state = _train(Path(sys.argv[1]), 40, resume=sys.argv[1])
assert all(value.device.type == "cpu" for value in state.values()), state
assert all(bool(torch.isfinite(value).all()) for value in state.values())
print("resumed on the CPU to batch 40")
"""


def test_a_gpu_run_resumes_bit_for_bit_on_the_gpu_and_also_on_a_machine_without_one(tmp_path: Path) -> None:
    straight = _train(tmp_path / "straight", 40)
    _train(tmp_path / "stopped", 20)
    resumed = _train(tmp_path / "resumed", 40, resume=str(tmp_path / "stopped"))
    assert straight.keys() == resumed.keys()
    for name, value in straight.items():
        assert value.device.type == "cuda"
        assert torch.equal(value, resumed[name]), name
    _train(tmp_path / "for-cpu", 20)
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", CPU_RESUME, str(tmp_path / "for-cpu")],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed on the CPU to batch 40" in done.stdout


def test_more_ranks_than_gpus_is_refused_in_one_line_naming_the_gpus(tmp_path: Path) -> None:
    gpus = torch.cuda.device_count()
    done = subprocess.run(
        [sys.executable, "-m", "hookdet", "run", str(REPO / "examples/digits/const.yaml"),
         "--slots", str(gpus + 1), "--run-dir", str(tmp_path / "run"), "--config", "searcher.max_length.epochs=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode != 0
    assert f"local rank {gpus} has no GPU: this machine has {gpus}" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


DETERMINISTIC_MNIST = """
import sys, torch
from pathlib import Path
# NLLLoss has no deterministic CUDA kernel: without warn_only, PyTorch refuses it outright.
torch.use_deterministic_algorithms(True, warn_only=True)
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
import trainer_api
from hookdet import pytorch
out = Path(sys.argv[1])
straight = trainer_api.train(pytorch.Batch(24), run_dir=str(out / "straight"))
trainer_api.train(pytorch.Batch(12), run_dir=str(out / "first"))
resumed = trainer_api.train(pytorch.Batch(24), run_dir=str(out / "second"), latest_checkpoint=str(out / "first"))
pairs = list(zip(straight.model.state_dict().values(), resumed.model.state_dict().values()))
assert pairs and all(a.device.type == "cuda" and torch.equal(a, b) for a, b in pairs)
print("resumed bit for bit")
"""


def test_a_convolutional_example_resumes_bit_for_bit_on_the_gpu_with_deterministic_kernels(tmp_path: Path) -> None:
    """cuDNN's convolution kernels differ run to run unless asked not to (docs/exact-resume.md):
    with deterministic algorithms, the MNIST example's Trainer-API script resumed at batch 12
    equals 24 batches straight through."""
    environment = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    done = subprocess.run(
        [sys.executable, "-c", DETERMINISTIC_MNIST, str(tmp_path)],
        cwd=REPO / "examples/mnist_pytorch", env=environment, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed bit for bit" in done.stdout
