"""A random search of 8 digits trials with ``--workers 1`` and ``--workers 2``: wall time, and
the per-trial overhead (trial process start to its first metrics record) against a single
``hookdet run`` of the same trial. Run: ``python benchmarks/search_overhead.py [TRIALS]``."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "examples" / "digits"


def first_record_time(run_dir: Path) -> float:
    with open(run_dir / "metrics.jsonl") as handle:
        return json.loads(handle.readline())["time"]


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "random.yaml"
        config.write_text((DIGITS / "random.yaml").read_text()
                          .replace("max_trials: 6", f"max_trials: {trials}"))
        single = work / "single"
        started = time.time()
        subprocess.run([sys.executable, "-m", "hookdet", "run", str(DIGITS / "const.yaml"),
                        "--run-dir", str(single)], env=env, cwd=work, check=True,
                       capture_output=True)
        single_overhead = first_record_time(single) - started
        print(f"single hookdet run: process start to first metrics record {single_overhead:.2f} s")
        for workers in (1, 2):
            search_dir = work / f"w{workers}"
            started = time.time()
            subprocess.run([sys.executable, "-m", "hookdet", "run", str(config), "--model-dir",
                            str(DIGITS), "--run-dir", str(search_dir), "--workers", str(workers)],
                           env=env, cwd=work, check=True, capture_output=True)
            wall = time.time() - started
            import optuna

            from hookdet.search.store import attrs_of

            study = optuna.load_study(study_name="hookdet-search",
                                      storage=f"sqlite:///{search_dir / 'search.db'}")
            overheads = []
            for segment in study.get_trials(deepcopy=False):
                attrs = attrs_of(segment)
                overheads.append(first_record_time(Path(attrs["run_dir"])) - attrs["started"])
            print(f"--workers {workers}: {trials} trials in {wall:.1f} s; per trial, process start "
                  f"to first metrics record: median {statistics.median(overheads):.2f} s")


if __name__ == "__main__":
    main()
