"""Trials the distributed tests train on several ranks, and helpers to launch and read them.

:class:`LinearTrial` fits ``y = w * x`` (one weight, no bias) with SGD on the mean squared error,
on records whose inputs all differ, so every step has a closed form (:func:`expected_weights`) and
which records a rank sees matters. Every rank writes what it saw to ``rank<r>.json`` in the run
directory when the trial shuts down, and its final weight to ``rank<r>-weight.pt``.
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
import yaml
from torch import nn

from hookdet import pytorch
from tests.support import hookdet_process

TESTS_DIR = Path(__file__).resolve().parent  # tests/support: the model directory of the trials here
REPO_ROOT = TESTS_DIR.parents[1]


def record_inputs(records: int) -> torch.Tensor:
    """Record ``i``'s input: ``0.5 + (i % 7) / 8``; distinct within any 7 consecutive records."""
    return 0.5 + (torch.arange(records, dtype=torch.float32) % 7).unsqueeze(1) / 8


def record_labels(records: int) -> torch.Tensor:
    """Record ``i``'s label: ``3 * x_i - 0.25 * (i % 3)``, so no weight fits every record."""
    index = torch.arange(records, dtype=torch.float32).unsqueeze(1)
    return 3 * record_inputs(records) - 0.25 * (index % 3)


class OneWeight(nn.Module):
    """``x * w`` with ``w`` starting at 0; optionally a buffer that counts training forwards
    (so DDP has buffers to broadcast, as a BatchNorm would)."""

    def __init__(self, with_buffer: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        if with_buffer:
            self.register_buffer("training_forwards", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and hasattr(self, "training_forwards"):
            self.training_forwards += 1
        return x * self.weight


class RootMeanSquare(pytorch.MetricReducer):
    """RMS of every validation error: per rank (sum of squares, count), combined across ranks."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sum_of_squares = 0.0
        self.count = 0

    def update(self, errors: torch.Tensor) -> None:
        self.sum_of_squares += float((errors.double() ** 2).sum())
        self.count += errors.numel()

    def per_slot_reduce(self) -> Any:
        return self.sum_of_squares, self.count

    def cross_slot_reduce(self, per_slot_metrics: List[Any]) -> Any:
        total = sum(squares for squares, _ in per_slot_metrics)
        count = sum(count for _, count in per_slot_metrics)
        return (total / count) ** 0.5


def position_weighted_sum(values: List[List[float]]) -> float:
    """``sum((i + 1) * error_i)`` over the validation records in dataset order: any change of
    order (a wrong interleaving of the ranks' batches) changes it."""
    flat = [value for batch in values for value in batch]
    return float(sum((position + 1) * value for position, value in enumerate(flat)))


def ddp_settings(model: nn.Module) -> Optional[Dict[str, Any]]:
    """The DDP options a wrapped model ended up with; None when it is not wrapped in DDP."""
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        return None
    return {"bucket_bytes_cap": model.bucket_bytes_cap, "find_unused_parameters": model.find_unused_parameters}


def horovod_settings(optimizer: torch.optim.Optimizer) -> Optional[Dict[str, Any]]:
    """How a Horovod ``DistributedOptimizer`` was built; None for any other optimizer."""
    if not hasattr(optimizer, "backward_passes_per_step"):
        return None
    compression = optimizer._compression  # Horovod passes compressor classes around
    return {
        "compression": getattr(compression, "__name__", type(compression).__name__),
        "backward_passes_per_step": optimizer.backward_passes_per_step,
        "lr": optimizer.param_groups[0]["lr"],
    }


class Recorder(pytorch.PyTorchCallback):
    """Collects what this rank sees and writes it to the run directory at shutdown."""

    def __init__(self, trial: "LinearTrial") -> None:
        self.trial = trial
        self.epoch_starts: List[int] = []
        self.epoch_ends: List[int] = []
        self.validations: List[Dict[str, Any]] = []

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.epoch_starts.append(epoch_idx)

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.epoch_ends.append(epoch_idx)

    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        # numpy values, as Determined's callbacks get them: plain numbers for the JSON record.
        self.validations.append({name: np.asarray(value).tolist() for name, value in metrics.items()})

    def on_trial_shutdown(self) -> None:
        trial = self.trial
        run_dir = Path(trial.context.get_tensorboard_path()).parent
        run_dir.mkdir(parents=True, exist_ok=True)
        rank = trial.context.distributed.get_rank()
        record = {
            "rank": rank,
            "size": trial.context.distributed.get_size(),
            "batches": trial.batches,
            "weights": trial.weights,
            "grads": trial.grads,
            "epoch_starts": self.epoch_starts,
            "epoch_ends": self.epoch_ends,
            "validations": self.validations,
            "training_forwards": trial.training_forwards(),
            "ddp": ddp_settings(trial.model),
            "horovod": horovod_settings(trial.optimizer),
            # a process forked from its parent (torchrun's agent) without a new program has its command line
            "forked": Path("/proc/self/cmdline").read_bytes() == Path(f"/proc/{os.getppid()}/cmdline").read_bytes(),
        }
        (run_dir / f"rank{rank}.json").write_text(json.dumps(record))
        torch.save(trial.module.weight.detach().clone(), run_dir / f"rank{rank}-weight.pt")


def read_that_hangs(until: Path) -> None:
    """A stand-in for a read from a filesystem that stopped answering: returns once ``until``
    exists."""
    while not until.exists():
        time.sleep(0.05)


class LinearTrial(pytorch.PyTorchTrial):
    """``y = w * x`` by SGD; see the module docstring.

    hparams: ``global_batch_size``, ``lr``, ``records`` (training and validation set size),
    ``validation_records`` (default ``records``), ``shuffle``, ``noise`` (add N(0, noise) to the
    inputs from the global torch RNG, and draw from Python's and NumPy's, so resume must restore
    them), ``sleep`` (seconds per batch), ``fail_rank``/``fail_batch`` (raise there),
    ``stop_rank``/``stop_batch`` (that rank alone calls ``set_stop_requested(True)`` there),
    ``with_buffer`` (see :class:`OneWeight`), ``ddp_options`` (passed to ``wrap_model``),
    ``lr_gamma`` (a StepLR stepped every optimizer step), ``abort_at_teardown`` (rank 1 aborts
    when it leaves the process group, as torch's teardown sometimes has), ``pid_dir`` (each rank
    writes its pid there as ``rank<N>.pid``), ``hang_rank``/``hang_batch`` (that rank blocks in
    :func:`read_that_hangs` there until the file ``hang_until`` exists).
    """

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.hparams = context.get_hparams()
        if self.hparams.get("pid_dir"):
            (Path(self.hparams["pid_dir"]) / f"rank{context.distributed.rank}.pid").write_text(str(os.getpid()))
        if self.hparams.get("abort_at_teardown") and context.distributed.rank == 1:
            context.distributed.close = os.abort
        self.module = OneWeight(bool(self.hparams.get("with_buffer", False)))
        self.model = context.wrap_model(self.module, **self.hparams.get("ddp_options", {}))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=self.hparams["lr"]))
        if self.hparams.get("lr_gamma"):
            context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=self.hparams["lr_gamma"]),
                step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP,
            )
        self.rms = context.wrap_reducer(RootMeanSquare(), name="rms", for_training=False)
        self.ordered = context.wrap_reducer(position_weighted_sum, name="ordered", for_training=False)
        self.recorder = Recorder(self)
        self.batches: List[int] = []
        self.weights: List[float] = []
        self.grads: List[float] = []

    def training_forwards(self) -> Optional[int]:
        counter = getattr(self.module, "training_forwards", None)
        return None if counter is None else int(counter)

    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        return {"recorder": self.recorder}

    def _dataset(self, records: int) -> torch.utils.data.Dataset:
        return torch.utils.data.TensorDataset(record_inputs(records), record_labels(records))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            self._dataset(self.hparams["records"]),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=bool(self.hparams.get("shuffle", False)),
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        records = self.hparams.get("validation_records", self.hparams["records"])
        return pytorch.DataLoader(self._dataset(records), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        x, y = batch
        rank = self.context.distributed.get_rank()
        if self.hparams.get("fail_rank") == rank and self.hparams.get("fail_batch") == batch_idx:
            raise RuntimeError(f"rank {rank} fails on purpose at batch {batch_idx}")
        if self.hparams.get("stop_rank") == rank and self.hparams.get("stop_batch") == batch_idx:
            self.context.set_stop_requested(True)
        if self.hparams.get("hang_rank") == rank and self.hparams.get("hang_batch") == batch_idx:
            read_that_hangs(Path(self.hparams["hang_until"]))
        noise = float(self.hparams.get("noise", 0.0))
        if noise:
            x = x + noise * torch.randn_like(x)
            x = x * (1 + 0.01 * random.random()) * (1 + 0.01 * float(np.random.rand()))
        if self.hparams.get("sleep"):
            time.sleep(float(self.hparams["sleep"]))
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.grads.append(float(self.module.weight.grad))
        self.context.step_optimizer(self.optimizer)
        self.batches.append(batch_idx)
        self.weights.append(float(self.module.weight.detach()))
        return {"loss": loss}

    def evaluation_reducer(self) -> Dict[str, pytorch.Reducer]:
        return {
            "validation_loss": pytorch.Reducer.AVG,
            "error_sum": pytorch.Reducer.SUM,
            "error_max": pytorch.Reducer.MAX,
            "error_min": pytorch.Reducer.MIN,
        }

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        errors = self.model(x) - y
        self.rms.update(errors)
        self.ordered.update(errors.flatten().tolist())
        return {
            "validation_loss": (errors**2).mean(),
            "error_sum": errors.flatten(),
            "error_max": errors.flatten(),
            "error_min": errors.flatten(),
        }


class FullDatasetLinearTrial(LinearTrial):
    """:class:`LinearTrial` validated by ``evaluate_full_dataset`` (chief only), through the
    wrapped model."""

    evaluate_batch = pytorch.PyTorchTrial.evaluate_batch  # type: ignore[assignment]

    def evaluate_full_dataset(self, data_loader: torch.utils.data.DataLoader) -> Dict[str, Any]:
        errors = torch.cat([self.model(x) - y for x, y in data_loader])
        return {
            "validation_loss": float((errors**2).mean()),
            "error_sum": float(errors.sum()),
            "records": int(errors.numel()),
        }


# ---------------------------------------------------------------------------------------------
# Closed form
# ---------------------------------------------------------------------------------------------


def expected_weights(
    records: int,
    global_batch_size: int,
    lr: float,
    batches: int,
    aggregation_frequency: int = 1,
    lr_gamma: float = 1.0,
) -> List[float]:
    """The weight after each batch of SGD on MSE for ``y = w * x``, in float64.

    Batch ``k`` holds records ``k*B .. k*B + B - 1`` (mod the dataset; unshuffled, ``records``
    divisible by ``B``). With aggregation the gradients of ``aggregation_frequency`` batches are
    averaged and applied on the last of them; the learning rate is multiplied by ``lr_gamma``
    after every optimizer step.
    """
    x = record_inputs(records).double().flatten().numpy()
    y = record_labels(records).double().flatten().numpy()
    weight, accumulated, weights = 0.0, 0.0, []
    per_epoch = records // global_batch_size
    for batch in range(batches):
        start = (batch % per_epoch) * global_batch_size
        xs, ys = x[start : start + global_batch_size], y[start : start + global_batch_size]
        accumulated += float(np.mean(2 * (weight * xs - ys) * xs))
        if (batch + 1) % aggregation_frequency == 0:
            weight -= lr * accumulated / aggregation_frequency
            accumulated = 0.0
            lr *= lr_gamma
        weights.append(weight)
    return weights


# ---------------------------------------------------------------------------------------------
# Launching
# ---------------------------------------------------------------------------------------------


def write_config(path: Path, hparams: Dict[str, Any], **overrides: Any) -> Path:
    """An experiment file for ``distributed_trials:LinearTrial`` (entrypoint overridable)."""
    config: Dict[str, Any] = {
        "name": "distributed-test",
        "entrypoint": "distributed_trials:LinearTrial",
        "hyperparameters": hparams,
        "searcher": {
            "name": "single",
            "metric": "validation_loss",
            "smaller_is_better": True,
            "max_length": {"batches": 8},
        },
        "scheduling_unit": 1,
        "plugins": {"only": ["callbacks", "preemption", "metrics_log", "checkpoint", "ddp"]},
        "reproducibility": {"experiment_seed": 7},
    }
    config.update(overrides)
    path.write_text(yaml.safe_dump(config))
    return path


def child_env(**extra: str) -> Dict[str, str]:
    """The environment for a launched run: one thread per process, the repo importable."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.pop("HOOKDET_RUN_DIR", None)
    env.update(extra)
    return env


def hookdet_command(config: Path, run_dir: Path, *extra: str) -> List[str]:
    """``python -m hookdet run CONFIG`` with the tests directory as model directory."""
    return [
        sys.executable, "-m", "hookdet", "run", str(config),
        "--run-dir", str(run_dir), "--model-dir", str(TESTS_DIR), *extra,
    ]


def run_command(command: Sequence[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    """Run ``command`` to completion (killing it after ``timeout`` seconds); output captured. A
    :func:`hookdet_command` runs as the tests run hookdet (:mod:`tests.support.hookdet_process`),
    anything else (torchrun, horovodrun) as typed."""
    if list(command[:3]) == [sys.executable, "-m", "hookdet"]:
        return hookdet_process.run(*command[3:], cwd=REPO_ROOT, env=child_env(**env), timeout=timeout)
    return subprocess.run(
        list(command), env=child_env(**env), cwd=str(REPO_ROOT), capture_output=True, text=True,
        timeout=timeout,
    )


def read_rank(run_dir: Path, rank: int) -> Dict[str, Any]:
    """What rank ``rank`` recorded (see :class:`Recorder`)."""
    return json.loads((Path(run_dir) / f"rank{rank}.json").read_text())


def read_weight(run_dir: Path, rank: int) -> torch.Tensor:
    """Rank ``rank``'s final weight, exactly."""
    return torch.load(Path(run_dir) / f"rank{rank}-weight.pt", weights_only=True)


def free_port() -> int:
    """A TCP port nobody listens on right now (for a rendezvous endpoint)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
