"""A run of several ranks from start to end: ranks forked from torchrun's agent against ranks
started as new interpreters (``HOOKDET_COLD_RANKS=1``, the way before).

Each round runs ``hookdet run`` of a 2-batch experiment on ``--ranks`` ranks as a user types it
(the installed console script, a new interpreter, its torchrun agent a new interpreter too), once
each way, the two in alternation so a busy spell hurts both alike; the figure is the wall time
from starting the command to its exit (what a user waits for a short distributed run, or each
segment of a search trial of several slots started cold), median and best of the rounds.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rank_start.py [--ranks 2] [--rounds 5]

Check ``uptime`` first: the figures are seconds on this machine as loaded as it is.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import yaml

REPO = Path(__file__).resolve().parents[1]
HOOKDET = Path(sys.executable).with_name("hookdet")
WAYS = {"forked": {}, "cold": {"HOOKDET_COLD_RANKS": "1"}}


def experiment(folder: Path, ranks: int) -> Path:
    """The tests' linear trial (``tests/support/distributed_trials.py``) for 2 batches on ``ranks`` ranks."""
    path = folder / "experiment.yaml"
    path.write_text(yaml.safe_dump({
        "name": "rank-start", "entrypoint": "distributed_trials:LinearTrial",
        "hyperparameters": {"global_batch_size": 2 * ranks, "lr": 0.1, "records": 8 * ranks},
        "searcher": {"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                     "max_length": {"batches": 2}},
        "resources": {"slots_per_trial": ranks}, "plugins": {"only": ["checkpoint", "metrics_log", "ddp"]},
    }))
    return path


def run_seconds(config: Path, run_dir: Path, extra_env: Dict[str, str]) -> float:
    """Seconds from starting ``hookdet run`` to its exit (which must be 0)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra_env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    start = time.perf_counter()
    subprocess.run([str(HOOKDET), "run", str(config), "--run-dir", str(run_dir), "--model-dir",
                    str(REPO / "tests" / "support")], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    times: Dict[str, List[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="hookdet-rank-start-") as folder:
        config = experiment(Path(folder), args.ranks)
        run_seconds(config, Path(folder) / "warm-up", {})  # the page cache: the first start reads every file
        for round_ in range(args.rounds):
            for way, extra_env in WAYS.items():
                times[way].append(run_seconds(config, Path(folder) / f"{way}-{round_}", extra_env))
    for way, values in times.items():
        print(f"{args.ranks} ranks, {way:<6} median {statistics.median(values):.2f} s, best {min(values):.2f} s "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    ratio = statistics.median(times["forked"]) / statistics.median(times["cold"])
    print(f"forked / cold (medians): {ratio:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
