"""One benchmark run per process: train one workload with one framework, write what was measured.

``overhead.py`` starts this file with the interpreter of each mode's environment::

    python benchmarks/workers.py MODE WORKLOAD --out DIR [--steps N --warmup K]

and reads back ``DIR/result.json`` and ``DIR/weights.pt``. The modes are ``raw`` (a plain PyTorch
loop), ``hookdet`` (``pytorch.init`` + ``Trainer.fit``, default plugins), ``lightning``
(``lightning.Trainer.fit``) and ``determined`` (``determined.pytorch.init`` + ``Trainer.fit``,
locally, without a master). Only the standard library and torch are imported at the top: the
Lightning and Determined environments have no hookdet, and the raw mode must not pay for it.

How time is measured, the same way in every mode:

* **Per step.** The first statement of the user's step function (the raw loop body,
  ``PyTorchTrial.train_batch``, ``LightningModule.training_step``) appends ``perf_counter()`` to
  a list. The interval between two consecutive stamps is one whole batch as the framework runs it:
  drawing and moving the batch, forward, backward, optimizer step, and every hook, callback,
  metric and logging call in between. The timed window (stamps ``warmup .. N-1``) is cut into
  blocks of :data:`workloads.BLOCK_STEPS` (100) consecutive intervals; a block's mean is its
  per-step time, and ``per_step_s`` is the *median over blocks*. Every block of 100 consecutive
  intervals holds exactly one reporting boundary of a 100-batch reporting period, so periodic
  work is counted at its true share in every block, while a burst of outside load on a shared
  machine (which slows a few blocks by 20–50 %) moves the median little and a whole-window mean
  a lot. The whole-window mean is kept as ``per_step_window_s``. The final validation and
  checkpoint come after the last stamp, outside the window. The process's CPU time
  (``process_time``, all threads) is read at the block boundaries only and gives
  ``per_step_cpu_s`` the same way.
* **Start-up.** The orchestrator notes the wall clock just before it starts the process; this
  process notes the wall clock at the first stamp. The difference is interpreter start, imports,
  framework initialisation, model and data construction: everything before the first batch.
* **Fit.** ``perf_counter()`` around the framework's fit call (the raw loop: around the loop, its
  one validation pass and its one checkpoint, the same end work the frameworks do).
* **Peak memory.** ``ru_maxrss`` of this process when the fit returns.
"""
from __future__ import annotations

import time

MAIN_STARTED_AT = time.time()  # before torch is imported: the interpreter's own start-up ends here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: E402

import torch  # noqa: E402

if __package__:
    from . import workloads  # noqa: E402
else:  # run as a script: this file's folder is sys.path[0]
    import workloads  # type: ignore[no-redef]  # noqa: E402

MODES = ("raw", "hookdet", "lightning", "determined")

#: The device every mode trains on: the first GPU where there is one (where hookdet and
#: Determined put a single-process run by themselves), else the CPU.
DEVICE = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


class StepClock:
    """Per-step timestamps: wall time (``perf_counter``) at the start of every step, and the
    process's CPU time (``process_time``) at the block boundaries of the timed window.

    CPU time is kept beside wall time because on a shared machine other load stretches wall time
    by however long this process waited for a core, while the process's CPU time counts only work
    done (by all its threads: a framework's background writer threads are charged to it). It is
    read once per block because ``process_time`` is a system call (about 2 µs in a VM), a visible
    share of a tiny step if read every step; ``perf_counter`` costs about 0.2 µs.
    """

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup = warmup
        self.steps = steps
        self.block = block_length(warmup, steps)
        self.stamps: List[float] = []
        self.cpu_marks: List[float] = []
        self.first_step_wall: Optional[float] = None

    def tick(self) -> None:
        """Called first thing in every training step, in every mode (the same cost in each)."""
        self.stamps.append(time.perf_counter())
        count = len(self.stamps)
        if count == 1:
            self.first_step_wall = time.time()
        if count > self.warmup and (count - 1 - self.warmup) % self.block == 0:
            self.cpu_marks.append(time.process_time())

    def cpu_per_step(self) -> float:
        """Median over blocks of the mean CPU seconds per step."""
        if len(self.cpu_marks) < 2:
            raise ValueError(f"the CPU window needs {self.warmup + 2} steps or more")
        return _median_block_mean(self.cpu_marks, self.block)


def block_length(warmup: int, steps: int) -> int:
    """Intervals per block: :data:`workloads.BLOCK_STEPS`, or the whole window when it is shorter
    (a smoke run of a few steps is then one block)."""
    return max(1, min(workloads.BLOCK_STEPS, steps - 1 - warmup))


def _median_block_mean(boundaries: List[float], block: int) -> float:
    """Median of ``(boundaries[k+1] - boundaries[k]) / block`` over consecutive boundaries."""
    return statistics.median(
        (later - earlier) / block for earlier, later in zip(boundaries, boundaries[1:])
    )


Run = Tuple[torch.nn.Module, float, Dict[str, Any]]


def _evaluate(model: torch.nn.Module, loader: Any) -> float:
    """The raw loop's validation: mean loss over the validation loader, no gradients."""
    model.eval()
    total, batches = 0.0, 0
    with torch.no_grad():
        for inputs, labels in loader:
            inputs, labels = inputs.to(DEVICE), labels.to(DEVICE)
            total += float(workloads.loss_fn(model(inputs), labels))
            batches += 1
    model.train()
    return total / max(batches, 1)


def run_raw(workload: workloads.Workload, clock: StepClock, work_dir: Path) -> Run:
    """A plain PyTorch loop: the reference every other mode is divided by.

    The training loader reads the data in order (no shuffle) with a private generator, so the
    global RNG (the CNN's dropout) advances exactly as under hookdet, whose loader also has one.
    It ends like a framework's fit: one validation pass and one checkpoint file. On a GPU, batches
    are copied as the frameworks copy them (``non_blocking``).
    """
    train_set, validation_set = workload.datasets()
    model = workload.build_model().to(DEVICE)
    optimizer = workload.build_optimizer(model)
    loader = torch.utils.data.DataLoader(
        train_set, batch_size=workload.batch_size, generator=torch.Generator().manual_seed(0)
    )
    validation_loader = torch.utils.data.DataLoader(validation_set, batch_size=workload.batch_size)
    started = time.perf_counter()
    model.train()
    step = 0
    while step < workload.steps:
        for inputs, labels in loader:
            clock.tick()
            if DEVICE.type == "cuda":
                inputs, labels = inputs.to(DEVICE, non_blocking=True), labels.to(DEVICE, non_blocking=True)
            loss = workloads.loss_fn(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == workload.steps:
                break
    validation_loss = _evaluate(model, validation_loader)
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
        work_dir / "checkpoint.pt",
    )
    return model, time.perf_counter() - started, {"validation_loss": validation_loss}


def make_trial_class(pytorch: Any, workload: workloads.Workload, clock: StepClock) -> type:
    """One ``PyTorchTrial`` for hookdet and Determined alike: only the ``pytorch`` module differs.

    The loaders are the framework's own ``DataLoader`` without shuffling, so the data order is
    the raw loop's.
    """
    train_set, validation_set = workload.datasets()

    class BenchmarkTrial(pytorch.PyTorchTrial):  # type: ignore[misc, name-defined]
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(workload.build_model())
            self.optimizer = context.wrap_optimizer(workload.build_optimizer(self.model))

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(train_set, batch_size=workload.batch_size)

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(validation_set, batch_size=workload.batch_size)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
            clock.tick()
            inputs, labels = batch
            loss = workloads.loss_fn(self.model(inputs), labels)
            self.context.backward(loss)
            self.context.step_optimizer(self.optimizer)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
            inputs, labels = batch
            return {"validation_loss": workloads.loss_fn(self.model(inputs), labels)}

    return BenchmarkTrial


def _experiment_config(workload: workloads.Workload) -> Dict[str, Any]:
    """The experiment file both Trainer-API modes get. No ``plugins:``: hookdet's defaults run."""
    return {
        "name": f"benchmark-{workload.name}",
        "hyperparameters": {"global_batch_size": workload.batch_size},
        "searcher": {
            "name": "single",
            "metric": "validation_loss",
            "smaller_is_better": True,
            "max_length": {"batches": workload.steps},
        },
    }


def run_hookdet(workload: workloads.Workload, clock: StepClock, work_dir: Path) -> Run:
    """hookdet's Trainer API with its default plugins and ``Trainer.fit``'s default periods:
    reports every 100 batches; validation and checkpoint once, at the end."""
    from hookdet import pytorch
    from hookdet.plugin import run_of

    trial_class = make_trial_class(pytorch, workload, clock)
    config = _experiment_config(workload)
    with pytorch.init(hparams=config["hyperparameters"], exp_conf=config, run_dir=work_dir / "run") as context:
        trial = trial_class(context)
        plugins = list(run_of(context).plugins.named_plugins())
        started = time.perf_counter()
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(workload.steps))
        fit_seconds = time.perf_counter() - started
    return trial.model, fit_seconds, {"plugins": plugins}


def run_determined(workload: workloads.Workload, clock: StepClock, work_dir: Path) -> Run:
    """Determined's Trainer API run locally (no master): ``det.pytorch.init()`` + ``fit``.

    Locally Determined stores checkpoints under ``appdirs.user_data_dir("determined")``; the
    orchestrator points ``XDG_DATA_HOME`` into this run's scratch directory.
    """
    import determined
    from determined import pytorch

    trial_class = make_trial_class(pytorch, workload, clock)
    config = _experiment_config(workload)
    with pytorch.init(hparams=config["hyperparameters"], exp_conf=config) as context:
        trial = trial_class(context)
        started = time.perf_counter()
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(workload.steps))
        fit_seconds = time.perf_counter() - started
    return trial.model, fit_seconds, {"determined": determined.__version__}


def run_lightning(workload: workloads.Workload, clock: StepClock, work_dir: Path) -> Run:
    """Lightning's ``Trainer.fit`` with its defaults (progress bar, logger, checkpointing), set to
    the same work as the others: ``max_steps``, logging every 100 steps, one validation at the
    last step (``val_check_interval``) and no sanity-check validation before the first batch."""
    import lightning

    train_set, validation_set = workload.datasets()

    class BenchmarkModule(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = workload.build_model()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            clock.tick()
            inputs, labels = batch
            loss = workloads.loss_fn(self.model(inputs), labels)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            inputs, labels = batch
            self.log("validation_loss", workloads.loss_fn(self.model(inputs), labels))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return workload.build_optimizer(self.model)

    module = BenchmarkModule()
    train_loader = torch.utils.data.DataLoader(
        train_set, batch_size=workload.batch_size, generator=torch.Generator().manual_seed(0)
    )
    validation_loader = torch.utils.data.DataLoader(validation_set, batch_size=workload.batch_size)
    trainer = lightning.Trainer(
        accelerator="gpu" if DEVICE.type == "cuda" else "cpu",
        devices=1,
        max_steps=workload.steps,
        max_epochs=-1,
        val_check_interval=workload.steps,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=100,
        default_root_dir=str(work_dir),
    )
    started = time.perf_counter()
    trainer.fit(module, train_loader, validation_loader)
    fit_seconds = time.perf_counter() - started
    return module.model, fit_seconds, {"lightning": lightning.__version__}


RUNNERS: Dict[str, Callable[[workloads.Workload, StepClock, Path], Run]] = {
    "raw": run_raw,
    "hookdet": run_hookdet,
    "lightning": run_lightning,
    "determined": run_determined,
}


def per_step_seconds(stamps: List[float], warmup: int) -> float:
    """Median over blocks of the mean seconds per step in the window ``warmup .. len(stamps)-1``
    (see the module docstring); the steps after the last full block are left out."""
    if len(stamps) < warmup + 2:
        raise ValueError(f"{len(stamps)} steps are too few for a warm-up of {warmup}")
    block = block_length(warmup, len(stamps))
    return _median_block_mean(stamps[warmup::block], block)


def window_seconds_per_step(stamps: List[float], warmup: int) -> float:
    """Mean seconds per step over the whole window ``warmup .. len(stamps) - 1``."""
    return (stamps[-1] - stamps[warmup]) / (len(stamps) - 1 - warmup)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("workload", choices=workloads.names())
    parser.add_argument("--out", required=True, type=Path, help="directory for result.json, weights.pt")
    parser.add_argument("--steps", type=int, help="override the workload's step count")
    parser.add_argument("--warmup", type=int, help="override the workload's warm-up steps")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.backends.cudnn.deterministic = True  # on a GPU, the same kernels in every mode: equal weights
    workload = workloads.WORKLOADS[args.workload]
    if args.steps is not None or args.warmup is not None:
        workload = workload.scaled(
            args.steps if args.steps is not None else workload.steps,
            args.warmup if args.warmup is not None else workload.warmup,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    clock = StepClock(workload.warmup, workload.steps)
    model, fit_seconds, info = RUNNERS[args.mode](workload, clock, args.out)
    cpu_seconds = time.process_time()
    max_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    if len(clock.stamps) != workload.steps:
        raise RuntimeError(
            f"{args.mode} ran {len(clock.stamps)} training steps, expected {workload.steps}"
        )
    torch.save([tensor.detach().cpu() for tensor in model.state_dict().values()], args.out / "weights.pt")
    result = {
        "mode": args.mode,
        "workload": workload.name,
        "steps": workload.steps,
        "warmup": workload.warmup,
        "per_step_s": per_step_seconds(clock.stamps, workload.warmup),
        "per_step_window_s": window_seconds_per_step(clock.stamps, workload.warmup),
        "per_step_cpu_s": clock.cpu_per_step(),
        "fit_s": fit_seconds,
        "process_cpu_s": cpu_seconds,
        "main_started_at": MAIN_STARTED_AT,
        "first_step_at": clock.first_step_wall,
        "max_rss_kib": max_rss_kib,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "cpu",
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        **info,
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
