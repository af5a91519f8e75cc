"""What a hookdet checkpoint costs over a bare ``torch.save``/``torch.load`` of the same tensors.

One command::

    .venv/bin/python benchmarks/checkpoint_io.py [--sizes 300MB,1GB] [--repeats 5] [--dir DIR] [--json OUT]

builds, per size, a real run (``pytorch.init`` with the ``checkpoint`` plugin) whose trial wraps
an MLP of four square linear layers and an Adam optimizer (300MB: width 2500, 25.0 M parameters;
1GB: width 4560, 83.2 M), trains one batch so Adam's two moment buffers exist, and times,
``--repeats`` rounds each, interleaved so a shared machine's drift spreads over all of them, with
the page cache warm:

* ``bare_save``: ``torch.save`` of ``{"models_state_dict": [...], "optimizers_state_dict":
  [...]}`` to a fresh path (no checksum, no fsync); ``bare_save_fsync``: the same plus an fsync;
* ``async_blocked``: how long ``hookdet_save_checkpoint`` blocks training in the default
  (asynchronous) mode — gathering the state and RNG, the weights-only check, and the copy of
  every tensor into host buffers (kept from the previous checkpoint); the background write is
  then waited for, untimed, and its duration from submission to publication gives
  ``async_write`` and the background throughput;
* ``stall_in_training``: what a user sees: the time ``steps`` training steps take right after an
  asynchronous ``hookdet_save_checkpoint`` (the save included), less the mean time of the same
  steps run just before and just after with no checkpoint; ``steps`` covers twice the background write, so the
  writer competing with training for the cores, the interpreter lock and memory bandwidth is
  counted, not only the time ``hookdet_save_checkpoint`` blocks. The model's steps are
  memory-bound and their time varies by tens of percent on a shared machine, so this takes
  ``--stall-rounds`` rounds (default 15) and also times ``stall_noise_floor``: the same difference
  for a run with no checkpoint. A stall is measured only as far as it stands out of that
  floor's spread (the report gives both medians and quartiles);
* ``sync_save``: ``hookdet_save_checkpoint`` end to end in the synchronous mode — the same plus
  serialising with the XXH3-128 checksum computed while writing, the manifest and
  ``metadata.json``, fsync of every file and the directory, and the atomic rename;
* ``bare_load``: ``torch.load(weights_only=True)``; ``bare_load_mmap``: the same with
  ``mmap=True`` (what hookdet's load does under its checksum); ``bare_load_apply``: the plain
  load plus ``load_state_dict`` on model and optimizer; ``hookdet_load``: ``hookdet_load_checkpoint`` end to
  end — metadata digest, XXH3-128 of every file over a memory map, ``torch.load(weights_only=True,
  mmap=True)``, applying model, optimizer, RNG and counters.

The report gives each timing's median (and fastest), the ratios of the medians, the
checkpoint's size and the 1-minute load average before and after (``os.getloadavg``), since on a
shared machine a ratio means little without it. Compare numbers from one invocation only.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hookdet.checkpoints import format as fmt  # noqa: E402
from hookdet import pytorch  # noqa: E402
from hookdet.plugin import run_of

LAYERS = 4
#: Square layer width per state size: weights + Adam's two moments, 12 bytes per parameter.
WIDTHS = {"300MB": 2500, "1GB": 4560}


class BigTrial(pytorch.PyTorchTrial):
    """Four 2500x2500 linear layers (25.01 M parameters) trained with Adam."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        width = context.get_hparam("width")
        self.model = context.wrap_model(nn.Sequential(*[nn.Linear(width, width) for _ in range(LAYERS)]))
        self.optimizer = context.wrap_optimizer(torch.optim.Adam(self.model.parameters(), lr=1e-4))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        width = self.context.get_hparam("width")
        return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, width)), batch_size=2)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        width = self.context.get_hparam("width")
        return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.randn(2, width)), batch_size=2)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        loss = self.model(batch[0]).pow(2).mean()
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        return {"validation_loss": self.model(batch[0]).pow(2).mean()}


def interleaved(
    actions: Dict[str, Callable[[], Any]],
    repeats: int,
    before: Dict[str, Callable[[], Any]],
    after: Optional[Dict[str, Callable[[], Any]]] = None,
) -> Dict[str, List[float]]:
    """Time each action ``repeats`` times, taking turns, so drift on a shared machine spreads
    over all of them; ``before[name]`` and ``after[name]`` run untimed around each timing."""
    times: Dict[str, List[float]] = {name: [] for name in actions}
    for _ in range(repeats):
        for name, action in actions.items():
            before.get(name, lambda: None)()
            start = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - start)
            (after or {}).get(name, lambda: None)()
    return times


def fsync_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def stall_in_training(
    trial: BigTrial, save: Callable[[bool], None], finish: Callable[[], None], forget: Callable[[], None],
    write_seconds: float, rounds: int,
) -> Dict[str, List[float]]:
    """``stall_in_training`` and ``stall_noise_floor`` (see the module docstring)."""
    batch = next(iter(trial.build_training_data_loader()))
    batch = [tensor.to(trial.context.device) for tensor in batch]

    def steps(count: int) -> None:  # the trial's step, outside the loop (which counts batches)
        for _ in range(count):
            loss = trial.model(batch[0]).pow(2).mean()
            loss.backward()
            trial.optimizer.step()
            trial.optimizer.zero_grad()
        if trial.context.device.type == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    steps(5)
    step_seconds = (time.perf_counter() - start) / 5
    count = max(5, int(2 * write_seconds / step_seconds) + 1)
    # Each checkpointed run, and a control run of plain steps, sits between two plain runs and
    # is compared with their mean: drift and the order of runs cancel out.
    timings = interleaved(
        {
            "plain_before": lambda: steps(count),
            "checkpointed": lambda: (save(True), steps(count)),
            "plain_between": lambda: steps(count),
            "control": lambda: steps(count),
            "plain_after": lambda: steps(count),
        },
        rounds,
        before={"checkpointed": forget},
        after={"checkpointed": finish},
    )
    print(f"stall_in_training: {count} steps of {step_seconds * 1e3:.1f} ms after each checkpoint, "
          f"{rounds} rounds", file=sys.stderr)
    before, between, after = timings["plain_before"], timings["plain_between"], timings["plain_after"]
    return {
        "stall_in_training": [run - (a + b) / 2 for run, a, b in zip(timings["checkpointed"], before, between)],
        "stall_noise_floor": [run - (a + b) / 2 for run, a, b in zip(timings["control"], between, after)],
    }


def quartiles(values: List[float]) -> List[float]:
    """First and third quartile (``statistics.quantiles``, inclusive)."""
    first, _, third = statistics.quantiles(values, n=4, method="inclusive")
    return [first, third]


def measure(size: str, root: Path, repeats: int, stall_rounds: int) -> Dict[str, Any]:
    """Every timing for one state size, in one run."""
    width = WIDTHS[size]
    exp_conf = {
        "plugins": {"only": ["checkpoint"]},
        "hyperparameters": {"width": width},
        "checkpoint_storage": {"type": "directory", "container_path": str(root / "checkpoints"),
                               "save_trial_latest": 1000},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 1}},
    }
    results: Dict[str, List[float]] = {}
    load_before = os.getloadavg()[0]
    with pytorch.init(exp_conf=exp_conf, run_dir=root / "run") as context:
        run = run_of(context)
        plugin = run.plugins.get("checkpoint")
        trial = BigTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(1))
        model, optimizer = trial.model, trial.optimizer
        parameters = sum(p.numel() for p in model.parameters())
        bare_state = {"models_state_dict": [model.state_dict()], "optimizers_state_dict": [optimizer.state_dict()]}
        bare_path = root / "bare.pth"

        def apply_bare() -> None:
            loaded = torch.load(bare_path, weights_only=True)
            model.load_state_dict(loaded["models_state_dict"][0])
            optimizer.load_state_dict(loaded["optimizers_state_dict"][0])

        saved: List[str] = []
        write_seconds: List[float] = []
        first_blocked: List[float] = []

        def save(asynchronous: bool) -> None:
            plugin.asynchronous = asynchronous
            saved.append(run.hook.hookdet_save_checkpoint(run=run))

        def finish_background_write() -> None:
            plugin.finish_write(run, wait=True, before="the benchmark goes on")
            write_seconds.append(plugin.last_write_seconds)

        def forget_previous() -> None:
            for storage_id in saved:
                run.storage.delete(storage_id)
            saved.clear()

        # The first background checkpoint allocates its host buffers; later ones reuse them.
        start = time.perf_counter()
        save(True)
        first_blocked.append(time.perf_counter() - start)
        finish_background_write()
        forget_previous()
        results.update(
            interleaved(
                {
                    "bare_save": lambda: torch.save(bare_state, bare_path),
                    "bare_save_fsync": lambda: fsync_save(bare_state, bare_path),
                    "async_blocked": lambda: save(True),
                    "sync_save": lambda: save(False),
                },
                repeats,
                # Every writer gets a fresh file, as a checkpoint is: overwriting one in place
                # costs the page cache more and would flatter the ratio.
                before={
                    "bare_save": lambda: bare_path.unlink(missing_ok=True),
                    "bare_save_fsync": lambda: bare_path.unlink(missing_ok=True),
                    "async_blocked": forget_previous,
                    "sync_save": forget_previous,
                },
                after={"async_blocked": finish_background_write},
            )
        )
        plugin.asynchronous = True
        checkpoint_dir = Path(run.storage.location(saved[-1]))
        torch.save(bare_state, bare_path)
        results.update(
            interleaved(
                {
                    "bare_load": lambda: torch.load(bare_path, weights_only=True),
                    "bare_load_mmap": lambda: torch.load(bare_path, weights_only=True, mmap=True),
                    "bare_load_apply": apply_bare,
                    "hookdet_load": lambda: run.hook.hookdet_load_checkpoint(run=run, checkpoint=str(checkpoint_dir)),
                },
                repeats,
                before={},
            )
        )
        results["async_write"] = write_seconds
        results["async_blocked_first"] = first_blocked
        sizes = {"bare_bytes": bare_path.stat().st_size, "hookdet_bytes": (checkpoint_dir / fmt.STATE_FILE).stat().st_size}
        results.update(stall_in_training(trial, save, finish_background_write, forget_previous,
                                         statistics.median(write_seconds), stall_rounds))
        forget_previous()
    medians = {name: statistics.median(values) for name, values in results.items()}
    return {
        "size": size,
        "parameters": parameters,
        **sizes,
        "repeats": repeats,
        "loadavg_1min_before_after": [load_before, os.getloadavg()[0]],
        "median_seconds": medians,
        "min_seconds": {name: min(values) for name, values in results.items()},
        "stall_quartiles_seconds": {name: quartiles(results[name]) for name in ("stall_in_training", "stall_noise_floor")},
        "background_write_MB_per_s": sizes["hookdet_bytes"] / 1e6 / medians["async_write"],
        "ratios": {
            "async_blocked_vs_torch_save": medians["async_blocked"] / medians["bare_save"],
            "async_blocked_vs_torch_save_fsync": medians["async_blocked"] / medians["bare_save_fsync"],
            "stall_in_training_vs_torch_save_fsync": medians["stall_in_training"] / medians["bare_save_fsync"],
            "stall_noise_floor_vs_torch_save_fsync": medians["stall_noise_floor"] / medians["bare_save_fsync"],
            "sync_save_vs_torch_save_fsync": medians["sync_save"] / medians["bare_save_fsync"],
            "load_vs_torch_load": medians["hookdet_load"] / medians["bare_load"],
            "load_vs_torch_load_apply": medians["hookdet_load"] / medians["bare_load_apply"],
            "load_vs_torch_load_mmap": medians["hookdet_load"] / medians["bare_load_mmap"],
        },
    }


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="300MB,1GB", help=f"comma-separated, of {', '.join(WIDTHS)}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stall-rounds", type=int, default=15, help="rounds of step runs for stall_in_training")
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.stall_rounds < 2 or args.repeats < 1:
        parser.error("--stall-rounds must be at least 2 (its quartiles need two) and --repeats at least 1")
    torch.set_num_threads(1)
    reports = []
    for size in args.sizes.split(","):
        if size not in WIDTHS:
            parser.error(f"unknown size {size!r}; sizes: {', '.join(WIDTHS)}")
        root = Path(args.dir or tempfile.mkdtemp(prefix="hookdet-ckpt-bench-")) / size
        root.mkdir(parents=True, exist_ok=True)
        try:
            report = measure(size, root, args.repeats, args.stall_rounds)
        finally:
            if not args.dir:
                shutil.rmtree(root.parent, ignore_errors=True)
        reports.append(report)
        medians, fastest = report["median_seconds"], report["min_seconds"]
        print(f"{size}: {report['parameters'] / 1e6:.2f} M parameters + Adam; file "
              f"{report['hookdet_bytes'] / 1e6:.1f} MB (bare {report['bare_bytes'] / 1e6:.1f} MB); median of "
              f"{args.repeats}; load average {report['loadavg_1min_before_after'][0]:.2f} -> "
              f"{report['loadavg_1min_before_after'][1]:.2f}")
        for name, value in medians.items():
            print(f"  {name:<20} {value * 1e3:8.1f} ms   (fastest {fastest[name] * 1e3:.1f} ms)")
        for name, (first, third) in report["stall_quartiles_seconds"].items():
            print(f"  {name:<20} quartiles {first * 1e3:.1f} .. {third * 1e3:.1f} ms")
        print(f"  background write     {report['background_write_MB_per_s']:8.0f} MB/s")
        for name, value in report["ratios"].items():
            print(f"  {name:<30} {value:5.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
