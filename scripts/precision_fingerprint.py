"""Fingerprints of mixed-precision training: run it on two commits to show that a change to the
``amp`` or ``apex`` plugins trains bit for bit as before.

Each case trains the mixed-precision tests' regression trial (``tests/support/amp_trials.py``)
in this process and prints one line: the case and a SHA-256 over its final weights, optimizer
state, every loss it trained on and the plugins' checkpointed state (loss scales, master
weights). A resumed case trains half, then resumes from that checkpoint to the end.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/precision_fingerprint.py > after.txt
    git stash; ... > before.txt; git stash pop; diff before.txt after.txt
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Tuple

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hookdet import pytorch  # noqa: E402
from tests.support import amp_trials  # noqa: E402
from tests.support.trials import fit  # noqa: E402

HP = {"lr": 0.02, "records": 256, "global_batch_size": 16}
FLOAT16 = {"plugin_config": {"amp": {"dtype": "float16", "growth_interval": 3}}}

#: name -> (trial class, hparams, experiment-file fragment)
CASES: Dict[str, Tuple[str, Dict[str, Any], Dict[str, Any]]] = {
    "use_amp bfloat16": ("UseAmpTrial", HP, {}),
    "use_amp float16, overflows": ("UseAmpTrial", {**HP, "batchnorm": False, "overflow_batches": [2, 5]}, FLOAT16),
    "use_amp float16, aggregation 2": ("UseAmpTrial", HP, {**FLOAT16, "optimizations": {"aggregation_frequency": 2}}),
    "plugins: [amp] float16": ("RegressionTrial", HP, {**FLOAT16, "plugins": {"only": ["callbacks", "checkpoint", "amp"]}}),
    "wrap_scaler": ("ManualScalerTrial", {**HP, "growth_interval": 3}, {}),
    "apex O0": ("ApexTrial", {**HP, "apex": {"opt_level": "O0"}}, {}),
    "apex O1": ("ApexTrial", {**HP, "apex": {"opt_level": "O1"}}, {}),
    "apex O2": ("ApexTrial", {**HP, "apex": {"opt_level": "O2"}}, {}),
    "apex O3": ("ApexTrial", {**HP, "apex": {"opt_level": "O3"}}, {}),
    "apex O2 float16, overflows": (
        "ApexTrial", {**HP, "batchnorm": False, "overflow_batches": [3], "apex": {"opt_level": "O2"}},
        {"plugin_config": {"apex": {"dtype": "float16"}}},
    ),
    "apex two losses": ("TwoLossApexTrial", {**HP, "overflow_second_loss": [4], "apex": {"num_losses": 2}}, {}),
}
RESUMED = ("use_amp float16, overflows", "apex O2")
BATCHES = 32


def digest(trial: Any) -> str:
    """SHA-256 over what training produced: every tensor's dtype and bytes, every other value's
    text, in order."""
    state = amp_trials.final_state(trial)
    state["losses"] = [loss.float() for loss in trial.losses]
    hashed = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            hashed.update(str(value.dtype).encode())
            hashed.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                hashed.update(str(key).encode())
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                feed(item)
        else:
            hashed.update(repr(value).encode())

    feed(state)
    return hashed.hexdigest()[:16]


def train(name: str, root: Path, resumed: bool) -> str:
    trial_name, hparams, config = CASES[name]
    trial_class = amp_trials.TRIALS[trial_name]
    run_dir = root / f"{len(list(root.iterdir()))}"
    config = {**config, "reproducibility": {"experiment_seed": 7}}
    if not resumed:
        return digest(fit(trial_class, hparams, run_dir, config, max_length=pytorch.Batch(BATCHES)))
    fit(trial_class, hparams, run_dir, config, max_length=pytorch.Batch(BATCHES // 2))
    checkpoints = sorted((run_dir / "checkpoints").iterdir(), key=lambda path: path.stat().st_mtime)
    trial = fit(trial_class, hparams, run_dir, config, max_length=pytorch.Batch(BATCHES),
                latest_checkpoint=checkpoints[-1].name)
    return digest(trial)


def main() -> None:
    torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as root:
        for name in CASES:
            torch.manual_seed(0)
            print(f"{name}: {train(name, Path(root), resumed=False)}", flush=True)
        for name in RESUMED:
            torch.manual_seed(0)
            print(f"{name}, resumed at {BATCHES // 2}: {train(name, Path(root), resumed=True)}", flush=True)


if __name__ == "__main__":
    main()
