"""Trials that exercise every piece of state a resume must restore, and a driver that trains one.

The resume tests train a trial straight through, then again stopping at batch ``k``, then
resume in a *new process* (``python -m tests.support.resume_trials SPEC.json OUT.pt``, or ``--each
SPECS.json OUT_DIR`` for one forked child per spec) and compare what the two ways produced, bit
for bit. Each trial reports, per batch, values that expose a wrong
resume immediately: the sum of the batch's inputs (data order), the learning rate (scheduler
state), the loss (weights, optimizer, RNG), and for the stateful callback its counters.

Kept free of ``tests.*`` imports so ``hookdet run --model-dir tests`` can import it as a plain
module too.
"""
from __future__ import annotations

import copy
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch import nn

from hookdet import pytorch
from hookdet.plugin import run_of

PLUGINS = ["callbacks", "checkpoint", "metrics_log"]


class Recorder(pytorch.PyTorchCallback):
    """Records what the loop reports in this process: per-batch metrics, workload averages
    (with the batch range each covers), validations, and where training started."""

    def __init__(self, startup_log: Optional[str] = None) -> None:
        self.startup: Optional[Dict[str, Any]] = None
        self.batch_metrics: List[Dict[str, Any]] = []
        self.workloads: List[Dict[str, Any]] = []
        self.validations: List[Dict[str, Any]] = []
        self.first_batch = 0
        self.startup_log = startup_log
        #: Extra values written with the startup line (set by the trial).
        self.extra: Dict[str, Any] = {}

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
        self.startup = {"first_batch_idx": first_batch_idx, "checkpoint_uuid": checkpoint_uuid}
        self.first_batch = first_batch_idx
        if self.startup_log:  # for runs in other processes (hookdet run): one JSON line each
            with open(self.startup_log, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({**self.startup, **self.extra, "pid": os.getpid()}) + "\n")

    def on_training_workload_end(self, avg_metrics: Dict[str, Any], batch_metrics: List[Dict[str, Any]]) -> None:
        start = self.first_batch + len(self.batch_metrics)
        self.batch_metrics.extend(_plain(metrics) for metrics in batch_metrics)
        self.workloads.append({"start": start, "end": start + len(batch_metrics), "avg": _plain(avg_metrics)})

    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        self.validations.append(_plain(metrics))


def _plain(metrics: Dict[str, Any]) -> Dict[str, Any]:
    """Callback metrics (numpy values, as in Determined) as plain Python numbers."""
    return {name: np.asarray(value).tolist() for name, value in metrics.items()}


class StatefulCallback(pytorch.PyTorchCallback):
    """A callback whose state changes training: it owns a generator whose noise the trial adds
    to each batch, and counts batches and epochs. Without ``state_dict``/``load_state_dict`` a
    resumed run would draw different noise and restart its counters."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(1234)
        self.batches_seen = 0
        self.epochs_ended: List[int] = []

    def noise(self, shape: torch.Size) -> torch.Tensor:
        self.batches_seen += 1
        return 0.01 * torch.randn(shape, generator=self.generator)

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.epochs_ended.append(epoch_idx)

    def state_dict(self) -> Dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "batches_seen": self.batches_seen,
            "epochs_ended": list(self.epochs_ended),
        }

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.generator.set_state(state_dict["generator"])
        self.batches_seen = state_dict["batches_seen"]
        self.epochs_ended = list(state_dict["epochs_ended"])


def _dataset(records: int, seed: int) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(records, 4, generator=generator)
    y = x @ torch.tensor([[0.5], [-1.0], [2.0], [0.25]]) + 0.1 * torch.randn(records, 1, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


class _StopAt:
    """Requests a stop after batch ``stop_at`` (hparam), the way a trial or callback would."""

    context: pytorch.PyTorchTrialContext

    def _maybe_stop(self, batch_idx: int) -> None:
        stop_at = self.context.get_hparams().get("stop_at")
        if stop_at is not None and batch_idx + 1 == stop_at:
            self.context.set_stop_requested(True)
        if self.context.get_hparams().get("sigterm_at") == batch_idx + 1:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal, at an exact batch


class RegressionTrial(_StopAt, pytorch.PyTorchTrial):
    """A small MLP regression with every switch a resume test needs.

    hparams: records, global_batch_size, lr, dropout, shuffle, optimizer (adam|sgd),
    scheduler (none|batch|epoch: a StepLR stepped by the loop), stateful (use
    :class:`StatefulCallback`), hidden, layers (extra hidden x hidden layers, to make
    checkpoints big), sleep (seconds per batch, to make training slow enough to interrupt),
    startup_log (a file the recorder appends ``on_trial_startup``'s arguments to), stop_at,
    sigterm_at (the process sends itself SIGTERM after that batch, as a preemption would),
    init_marker (a file ``__init__`` creates before it sleeps ``init_sleep`` seconds, so a signal
    can be sent while the trial is being built), chatter (lines the trial prints per batch),
    hold_while (a path: from the fourth batch on, each batch waits while it exists, so a test
    keeps the run training, reports written, for as long as it needs).
    """

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        if hp.get("init_marker"):
            Path(hp["init_marker"]).touch()
            time.sleep(float(hp.get("init_sleep", 60)))
        hidden = hp.get("hidden", 16)
        extra: List[nn.Module] = []
        for _ in range(hp.get("layers", 0)):
            extra += [nn.Linear(hidden, hidden), nn.ReLU()]
        self.model = context.wrap_model(
            nn.Sequential(
                nn.Linear(4, hidden), nn.ReLU(), nn.Dropout(hp.get("dropout", 0.0)), *extra, nn.Linear(hidden, 1)
            )
        )
        if hp.get("optimizer", "adam") == "adam":
            optimizer = torch.optim.Adam(self.model.parameters(), lr=hp["lr"])
        else:
            optimizer = torch.optim.SGD(self.model.parameters(), lr=hp["lr"], momentum=0.9)
        self.optimizer = context.wrap_optimizer(optimizer)
        scheduler = hp.get("scheduler", "none")
        if scheduler != "none":
            mode = {
                "batch": pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH,
                "epoch": pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
            }[scheduler]
            context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.8), step_mode=mode
            )
        self.recorder = Recorder(hp.get("startup_log"))
        # Under ``hookdet run --resume`` the resume point is known while the trial is built.
        self.recorder.extra["initial_batch_at_init"] = context.get_initial_batch()
        self.stateful = StatefulCallback() if hp.get("stateful") else None
        self.initial_batch_at_build: Optional[int] = None

    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        callbacks: Dict[str, pytorch.PyTorchCallback] = {"recorder": self.recorder}
        if self.stateful is not None:
            callbacks["stateful"] = self.stateful
        return callbacks

    def build_training_data_loader(self) -> pytorch.DataLoader:
        self.initial_batch_at_build = self.context.get_initial_batch()
        hp = self.context.get_hparams()
        return pytorch.DataLoader(
            _dataset(hp["records"], seed=0),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=bool(hp.get("shuffle", False)),
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(_dataset(16, seed=1), batch_size=8)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        x, y = batch
        metrics: Dict[str, Any] = {"x_sum": x.sum(), "lr": self.optimizer.param_groups[0]["lr"]}
        if self.stateful is not None:
            x = x + self.stateful.noise(x.shape).to(x.device)
            metrics["batches_seen"] = self.stateful.batches_seen
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        metrics["loss"] = loss
        self._maybe_stop(batch_idx)
        if self.context.get_hparams().get("sleep"):
            time.sleep(self.context.get_hparam("sleep"))
        hold = self.context.get_hparams().get("hold_while")
        while hold and batch_idx >= 3 and os.path.exists(hold):
            time.sleep(0.02)
        for line in range(self.context.get_hparams().get("chatter", 0)):
            print(f"batch {batch_idx} says line {line}: " + "x" * 60)
        return metrics

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}


class GANTrial(_StopAt, pytorch.PyTorchTrial):
    """Two models, two optimizers (Adam for the generator, SGD with momentum for the critic),
    stepped critic-first in one ``train_batch``; the generator's noise comes from the global
    torch RNG and the critic has dropout. The generator's backward leaves gradients on the
    critic between batches, as real GAN code often does: a resume must keep them."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        self.generator = context.wrap_model(nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 4)))
        self.critic = context.wrap_model(
            nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Dropout(0.25), nn.Linear(8, 1))
        )
        self.opt_g = context.wrap_optimizer(torch.optim.Adam(self.generator.parameters(), lr=hp["lr"]))
        self.opt_c = context.wrap_optimizer(
            torch.optim.SGD(self.critic.parameters(), lr=hp["lr"], momentum=0.9)
        )
        self.recorder = Recorder()
        self.initial_batch_at_build: Optional[int] = None

    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        return {"recorder": self.recorder}

    def build_training_data_loader(self) -> pytorch.DataLoader:
        self.initial_batch_at_build = self.context.get_initial_batch()
        hp = self.context.get_hparams()
        return pytorch.DataLoader(
            _dataset(hp["records"], seed=0), batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(_dataset(16, seed=1), batch_size=8)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        real, _ = batch
        bce = nn.functional.binary_cross_entropy_with_logits
        fake = self.generator(torch.randn(real.shape[0], 2, device=real.device))
        real_logits, fake_logits = self.critic(real), self.critic(fake.detach())
        critic_loss = bce(real_logits, torch.ones_like(real_logits)) + bce(fake_logits, torch.zeros_like(fake_logits))
        self.context.backward(critic_loss)
        self.context.step_optimizer(self.opt_c)
        fooled = self.critic(fake)
        generator_loss = bce(fooled, torch.ones_like(fooled))
        self.context.backward(generator_loss)
        self.context.step_optimizer(self.opt_g)
        self._maybe_stop(batch_idx)
        return {"x_sum": real.sum(), "critic_loss": critic_loss, "generator_loss": generator_loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        real, _ = batch
        with torch.random.fork_rng():
            torch.manual_seed(7)
            fake = self.generator(torch.randn(real.shape[0], 2, device=real.device))
        return {"validation_loss": self.critic(fake).mean() - self.critic(real).mean()}


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def _import(spec: str) -> type:
    module_name, _, name = spec.partition(":")
    return getattr(importlib.import_module(module_name), name)


def run_spec(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Train as ``spec`` says and return a snapshot of everything a resume must reproduce.

    spec: ``trial`` (``module:Class``), ``hparams``, ``config`` (extra experiment-file keys),
    ``run_dir``, ``max_batches``, ``validation_period``, ``reporting_period``,
    ``checkpoint_period`` (batches or None), ``checkpoint_policy``, ``resume`` (or None).
    """
    trial_class = _import(spec["trial"])
    hparams = dict(spec["hparams"])
    exp_conf = {
        "hyperparameters": hparams,
        "plugins": {"only": list(spec.get("plugins", PLUGINS))},
        "searcher": {"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                     "max_length": {"batches": spec["max_batches"]}},
        "reproducibility": {"experiment_seed": 3},
        **spec.get("config", {}),
    }
    checkpoint_period = spec.get("checkpoint_period")
    with pytorch.init(hparams=hparams, exp_conf=exp_conf, run_dir=spec["run_dir"]) as context:
        trial = trial_class(context)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(spec["max_batches"]),
            validation_period=pytorch.Batch(spec["validation_period"]),
            reporting_period=pytorch.Batch(spec["reporting_period"]),
            checkpoint_period=pytorch.Batch(checkpoint_period) if checkpoint_period else None,
            checkpoint_policy=spec.get("checkpoint_policy", "best"),
            latest_checkpoint=spec.get("resume"),
        )
        return snapshot(trial, context)


def snapshot(trial: Any, context: Any) -> Dict[str, Any]:
    """Copies of the trial's weights, optimizer and scheduler states, the callbacks' state and
    everything the :class:`Recorder` saw."""
    run = run_of(context)
    recorder = trial.recorder
    stateful = getattr(trial, "stateful", None)
    return copy.deepcopy(
        {
            "models": [model.state_dict() for model in context.unwrapped_models],
            "optimizers": [optimizer.state_dict() for optimizer in context.optimizers],
            "schedulers": [scheduler.state_dict() for scheduler in context.lr_schedulers],
            "stateful": stateful.state_dict() if stateful is not None else None,
            "startup": recorder.startup,
            "initial_batch_at_build": trial.initial_batch_at_build,
            "initial_batch_after_fit": context.get_initial_batch(),
            "batch_metrics": recorder.batch_metrics,
            "workloads": recorder.workloads,
            "validations": recorder.validations,
            "batches_trained": run.state.batches_trained,
            "latest_checkpoint": run.state.latest_checkpoint,
            "exit_reason": None if run.exit_reason is None else str(run.exit_reason),
        }
    )


def _run_forked(specs: List[Dict[str, Any]], out_dir: Path, parallel: int = 2) -> int:
    """Train each spec in its own child process, ``parallel`` at a time; out_dir/<i>.pt each.

    The children fork from this interpreter, which has imported torch and hookdet and done
    nothing else: each starts with no trace of any training, exactly like a fresh
    ``python -c``, without paying for the interpreter and torch import again.
    """
    pending = list(enumerate(specs))
    running: Dict[int, int] = {}
    failures = 0
    while pending or running:
        while pending and len(running) < parallel:
            index, spec = pending.pop(0)
            pid = os.fork()
            if pid == 0:  # the child
                status = 1
                try:
                    torch.save(run_spec(spec), out_dir / f"{index}.pt")
                    status = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(status)
            running[pid] = index
        pid, status = os.wait()
        index = running.pop(pid)
        if status != 0:
            failures += 1
            print(f"resume_trials: spec {index} failed with wait status {status}", file=sys.stderr)
    return 1 if failures else 0


def main(argv: List[str]) -> int:
    """``python -m tests.support.resume_trials SPEC.json OUT.pt``: train per the spec, save the snapshot;
    ``python -m tests.support.resume_trials --each SPECS.json OUT_DIR``: the same for each spec of a
    list, each in its own forked child."""
    if argv[0] == "--each":
        return _run_forked(json.loads(Path(argv[1]).read_text()), Path(argv[2]))
    spec = json.loads(Path(argv[0]).read_text())
    torch.save(run_spec(spec), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
