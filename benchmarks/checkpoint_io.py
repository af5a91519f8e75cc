"""What a hookdet checkpoint costs over a bare ``torch.save``/``torch.load`` of the same tensors.

One command::

    .venv/bin/python benchmarks/checkpoint_io.py [--repeats 5] [--dir DIR] [--json OUT]

builds a real run (``pytorch.init`` with the ``checkpoint`` plugin) whose trial wraps a 25 M
parameter MLP (four 2500x2500 linear layers) and an Adam optimizer, trains one batch so Adam's
two moment buffers exist, and times, ``--repeats`` times each, with the page cache warm:

* ``save``: ``hookdet_save_checkpoint`` end to end — collecting the state dicts and RNG states,
  the weights-only check, serialising with the sha256 digests computed while writing, the manifest and
  ``metadata.json``, fsync of every file and the directory, and the atomic rename into place —
  against ``torch.save`` of ``{"models_state_dict": [...], "optimizers_state_dict": [...]}`` to
  a path (which neither checksums nor fsyncs), and against that plus an fsync;
* ``load``: ``hookdet_load_checkpoint`` from the checkpoint directory end to end — metadata
  digest, sha256 of every file, ``torch.load(weights_only=True)``, applying the model and
  optimizer state, the RNG state —
  against ``torch.load(weights_only=True)`` plus ``load_state_dict`` on the model and optimizer.

Both sides store the same ~300 MB: 25 M float32 weights and Adam's ``exp_avg`` and
``exp_avg_sq`` (hookdet's file adds the RNG state, trial counters and scheduler/callback
lists, a few kB). The report gives each timing's median (and fastest) and the ratios of the
medians. Timings interleave (bare, bare+fsync, hookdet, and again) so a shared machine's drift
spreads over all of them; still, compare numbers from one invocation only.

Measured on the 2-core development VM (torch 2.13 CPU, warm page cache, median of 9), see the
issue note for the exact figures: saving costs about 1.1x a bare ``torch.save`` plus fsync (the
durability the bare save lacks is most of the difference to a bare ``torch.save``, the sha256
pass the rest); loading about 2x a bare ``torch.load``, because verification reads and
checksums all 300 MB before the state is trusted.
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
from typing import Any, Callable, Dict, List

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hookdet import checkpoint_format as fmt  # noqa: E402
from hookdet import pytorch  # noqa: E402

WIDTH, LAYERS = 2500, 4


class BigTrial(pytorch.PyTorchTrial):
    """Four 2500x2500 linear layers (25.01 M parameters) trained with Adam."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]))
        self.optimizer = context.wrap_optimizer(torch.optim.Adam(self.model.parameters(), lr=1e-4))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, WIDTH)), batch_size=2)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.randn(2, WIDTH)), batch_size=2)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        loss = self.model(batch[0]).pow(2).mean()
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        return {"validation_loss": self.model(batch[0]).pow(2).mean()}


def interleaved(actions: Dict[str, Callable[[], Any]], repeats: int, before: Dict[str, Callable[[], Any]]) -> Dict[str, List[float]]:
    """Time each action ``repeats`` times, taking turns, so drift on a shared machine spreads
    over all of them; ``before[name]`` runs untimed before each timing of ``name``."""
    times: Dict[str, List[float]] = {name: [] for name in actions}
    for _ in range(repeats):
        for name, action in actions.items():
            before.get(name, lambda: None)()
            start = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - start)
    return times


def fsync_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    root = Path(args.dir or tempfile.mkdtemp(prefix="hookdet-ckpt-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    exp_conf = {
        "plugins": ["checkpoint"],
        "checkpoint_storage": {"type": "directory", "container_path": str(root / "checkpoints"),
                               "save_trial_latest": 1000},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 1}},
    }
    results: Dict[str, Any] = {}
    try:
        with pytorch.init(exp_conf=exp_conf, run_dir=root / "run") as context:
            run = context._run
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

            def save_hookdet() -> None:
                saved.append(run.hook.hookdet_save_checkpoint(run=run))

            def forget_previous() -> None:
                for storage_id in saved:
                    run.storage.delete(storage_id)
                saved.clear()

            results.update(
                interleaved(
                    {
                        "bare_save": lambda: torch.save(bare_state, bare_path),
                        "bare_save_fsync": lambda: fsync_save(bare_state, bare_path),
                        "hookdet_save": save_hookdet,
                    },
                    args.repeats,
                    # Every writer gets a fresh file, as a checkpoint is: overwriting one in
                    # place costs the page cache more and would flatter the ratio.
                    before={
                        "bare_save": lambda: bare_path.unlink(missing_ok=True),
                        "bare_save_fsync": lambda: bare_path.unlink(missing_ok=True),
                        "hookdet_save": forget_previous,
                    },
                )
            )
            checkpoint_dir = Path(run.storage.location(saved[-1]))
            torch.save(bare_state, bare_path)
            results.update(
                interleaved(
                    {
                        "bare_load": lambda: torch.load(bare_path, weights_only=True),
                        "bare_load_apply": apply_bare,
                        "hookdet_load": lambda: run.hook.hookdet_load_checkpoint(
                            run=run, checkpoint=str(checkpoint_dir)
                        ),
                    },
                    args.repeats,
                    before={},
                )
            )
            sizes = {
                "bare_bytes": bare_path.stat().st_size,
                "hookdet_bytes": (checkpoint_dir / fmt.STATE_FILE).stat().st_size,
            }
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)

    medians = {name: statistics.median(values) for name, values in results.items()}
    fastest = {name: min(values) for name, values in results.items()}
    report = {
        "parameters": parameters,
        "state": "weights + Adam exp_avg/exp_avg_sq (+ RNG, counters for hookdet)",
        **sizes,
        "repeats": args.repeats,
        "median_seconds": medians,
        "min_seconds": fastest,
        "ratios": {
            "save_vs_torch_save": medians["hookdet_save"] / medians["bare_save"],
            "save_vs_torch_save_fsync": medians["hookdet_save"] / medians["bare_save_fsync"],
            "load_vs_torch_load": medians["hookdet_load"] / medians["bare_load"],
            "load_vs_torch_load_apply": medians["hookdet_load"] / medians["bare_load_apply"],
        },
    }
    print(f"{parameters / 1e6:.2f} M parameters + Adam; file {sizes['hookdet_bytes'] / 1e6:.1f} MB "
          f"(bare {sizes['bare_bytes'] / 1e6:.1f} MB); median of {args.repeats}")
    for name, value in medians.items():
        print(f"  {name:<18} {value * 1e3:8.1f} ms   (fastest {fastest[name] * 1e3:.1f} ms)")
    for name, value in report["ratios"].items():
        print(f"  {name:<26} {value:5.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
