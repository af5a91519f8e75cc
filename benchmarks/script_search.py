"""What a search of a Trainer-API script waits for: the script's process forked from its warm
segment (``warm``, as hookdet ships) against every segment a new interpreter
(``HOOKDET_COLD_SEGMENTS=1``: the segment's ``hookdet run`` and the script each start cold, as
before scripts were forked).

The script is the test suite's Determined-tutorial-shaped ``train.py``
(``tests/fixtures/trainer_script``), searched by ``random`` over its learning rate, one trial at a
time. Each way's wall time runs from starting ``hookdet run`` to its exit; the two searches'
summaries must be equal (the same trials, the same metrics). Run::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/script_search.py [--trials 8] [--batches 20]
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
SCRIPT_DIR = REPO / "tests" / "fixtures" / "trainer_script"


def experiment(trials: int, batches: int) -> str:
    return (f"name: script-search\nentrypoint: python3 train.py --batches {batches} --validate-every {batches}\n"
            "hyperparameters:\n"
            "  learning_rate: {type: log, minval: -1.5, maxval: 0.3, base: 10}\n"
            "  global_batch_size: 32\n  n_hidden: 32\n  dropout: 0.25\n"
            f"searcher:\n  name: random\n  metric: validation_loss\n  max_trials: {trials}\n"
            "  max_concurrent_trials: 1\nreproducibility:\n  experiment_seed: 11\n")


def search(workdir: Path, config: Path, cold: bool) -> float:
    """Wall seconds of one search in ``workdir`` (``cold``: every segment a new interpreter)."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env.pop("HOOKDET_COLD_SEGMENTS", None)
    if cold:
        env["HOOKDET_COLD_SEGMENTS"] = "1"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hookdet", "run", str(config), "--run-dir", "search", "--workers", "1",
                    "--model-dir", str(SCRIPT_DIR)], cwd=workdir, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def summary(workdir: Path) -> List[Dict[str, str]]:
    with open(workdir / "search" / "summary.csv") as handle:
        return [{k: v for k, v in row.items() if k != "request_id"} for row in csv.DictReader(handle)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hookdet-script-search-") as root:
        config = Path(root) / "script.yaml"
        config.write_text(experiment(args.trials, args.batches))
        walls = {}
        for way in ("warm", "cold"):
            (Path(root) / way).mkdir()
            walls[way] = search(Path(root) / way, config, cold=way == "cold")
        assert summary(Path(root) / "warm") == summary(Path(root) / "cold"), "the two searches differ"
    print(f"{args.trials} trials of {args.batches} batches, one worker, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', '1')}, load {os.getloadavg()[0]:.2f}")
    for way, wall in walls.items():
        print(f"{way}: {wall:.1f} s ({wall / args.trials:.2f} s a trial)")
    print(f"warm saves {walls['cold'] - walls['warm']:.1f} s, x{walls['cold'] / walls['warm']:.2f}")


if __name__ == "__main__":
    main()
