"""Random, ASHA and Optuna's TPE (alone and with Hyperband) on the digits example, at about the
same budget of training batches, over several experiment seeds: the best validation loss each
search found (docs/search.md, "Random, ASHA and TPE at an equal budget of batches").

    OMP_NUM_THREADS=1 python benchmarks/search_quality.py --seeds 1 2 3 4 5 --out /tmp/quality

Every search runs ``hookdet run`` on a copy of ``examples/digits/random.yaml`` whose searcher is
replaced; trials train to 108 batches (32 records each) and validate every 12. The budget is 8
full trials (864 batches): ``random`` and ``tpe`` run 8 trials; ASHA stops most trials at its
first rungs (12 and 36 batches), so it runs 30; Optuna's Hyperband keeps more trials to the end
(30 trials trained 2,184 batches at seed 1), so TPE + Hyperband runs 12. The table reports the
batches each search trained in fact. Outcomes do not depend on timing, so the machine's load
changes the wall times only.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "digits" / "random.yaml"
LENGTH = {"time_metric": "batches", "max_time": 108}
SEARCHERS: Dict[str, Dict[str, Any]] = {
    "random": {"name": "random", "max_trials": 8, "max_length": {"batches": 108}},  # Determined's way
    "asha": {"name": "async_halving", "num_rungs": 3, "divisor": 3, "max_trials": 30, **LENGTH},
    "tpe": {"name": "optuna", "sampler": "tpe", "sampler_options": {"n_startup_trials": 4},
            "max_trials": 8, **LENGTH},
    "tpe+hyperband": {"name": "optuna", "sampler": "tpe", "pruner": "hyperband", "num_rungs": 3,
                      "divisor": 3, "sampler_options": {"n_startup_trials": 4}, "max_trials": 12, **LENGTH},
}


def experiment(method: str, seed: int) -> Dict[str, Any]:
    config = yaml.safe_load(EXAMPLE.read_text())
    config["hyperparameters"]["dropout"] = {"type": "double", "minval": 0.0, "maxval": 0.5}
    config["searcher"] = {"metric": "validation_loss", "smaller_is_better": True,
                          "max_concurrent_trials": 2, **SEARCHERS[method]}
    config["min_validation_period"] = {"batches": 12}
    config["reproducibility"] = {"experiment_seed": seed}
    config["name"] = f"quality-{method}-{seed}"
    return config


def run_search(method: str, seed: int, out: Path, workers: int) -> Dict[str, Any]:
    """One search; its best validation loss, batches trained, trials and wall time."""
    path = EXAMPLE.parent / f".quality-{method}-{seed}.yaml"  # beside model_def.py
    path.write_text(yaml.safe_dump(experiment(method, seed)))
    search_dir = out / f"{method}-{seed}"
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "hookdet", "run", str(path), "--run-dir", str(search_dir),
                               "--workers", str(workers)], capture_output=True, text=True)
    finally:
        path.unlink()
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{method} seed {seed} failed:\n{done.stderr[-3000:]}")
    with open(search_dir / "summary.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {"method": method, "seed": seed, "wall_s": round(wall, 1), "trials": len(rows),
            "batches": sum(int(row["batches"] or 0) for row in rows),
            "best": min(float(row["best"]) for row in rows if row["best"])}


def table(results: List[Dict[str, Any]]) -> str:
    lines = ["| searcher | best validation loss, mean ± sd (5 seeds) | per seed | batches trained (mean) | trials |",
             "|---|---|---|---|---|"]
    for method in SEARCHERS:
        mine = [r for r in results if r["method"] == method]
        if not mine:
            continue
        bests = [r["best"] for r in mine]
        spread = statistics.stdev(bests) if len(bests) > 1 else 0.0
        lines.append(f"| {method} | {statistics.mean(bests):.4f} ± {spread:.4f} | "
                     f"{', '.join(f'{b:.4f}' for b in bests)} | {statistics.mean(r['batches'] for r in mine):.0f} | "
                     f"{mine[0]['trials']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--methods", nargs="+", default=list(SEARCHERS), choices=list(SEARCHERS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("search-quality"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = []
    for seed in args.seeds:
        for method in args.methods:
            done = args.out / f"{method}-{seed}.json"  # a search already measured is read back
            if not done.exists():
                shutil.rmtree(args.out / f"{method}-{seed}", ignore_errors=True)
                done.write_text(json.dumps(run_search(method, seed, args.out, args.workers)))
            results.append(json.loads(done.read_text()))
            print(json.dumps(results[-1]), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
