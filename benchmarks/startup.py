"""Start-up: what ``import hookdet.pytorch`` costs over ``import torch``, and ``hookdet --help``.

Every measurement is a fresh interpreter (as a user's script and every rank starts), timed from
spawn to exit; best of N, the two imports taken in alternation so a busy spell hurts both alike.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/startup.py             # best of 7
    .venv/bin/python benchmarks/startup.py --rounds 15 --json out.json

Goals (issue 26): ``import hookdet.pytorch`` at most 1.15x ``import torch``; ``hookdet --help``
under 0.5 s. ``tests/test_import_budget.py`` guards which modules the import loads; this file
measures the time, which a test on a shared machine could not do honestly.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

COMMANDS = {
    "python": [sys.executable, "-c", "pass"],
    "import torch": [sys.executable, "-c", "import torch"],
    "import hookdet.pytorch": [sys.executable, "-c", "import hookdet.pytorch"],
    "import hookdet": [sys.executable, "-c", "import hookdet"],
    "hookdet --help": [str(Path(sys.executable).with_name("hookdet")), "--help"],
}


def wall_seconds(command: List[str]) -> float:
    """Seconds from spawning ``command`` to its exit."""
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(rounds: int) -> Dict[str, List[float]]:
    """Each command once per round, in the same order every round."""
    for command in COMMANDS.values():  # warm the page cache: the first spawn reads every file
        wall_seconds(command)
    times: Dict[str, List[float]] = {name: [] for name in COMMANDS}
    for _ in range(rounds):
        for name, command in COMMANDS.items():
            times[name].append(wall_seconds(command))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="also write every measurement here")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    times = measure(args.rounds)
    best = {name: min(values) for name, values in times.items()}
    for name, value in best.items():
        print(f"{name:<24} best of {args.rounds}: {value:.3f} s")
    ratio = best["import hookdet.pytorch"] / best["import torch"]
    print(f"import hookdet.pytorch / import torch: {ratio:.3f}x (goal <= 1.15x)")
    print(f"hookdet --help: {best['hookdet --help']:.3f} s (goal < 0.5 s)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"times": times, "best": best, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
