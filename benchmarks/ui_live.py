"""A run's training speed with its ``hookdet ui`` page open and updating, against the same run
with no page open: the digits example, rounds alternating, in one session.

Each round trains ``examples/digits/const.yaml`` for ``--epochs`` epochs with ``hookdet run``.
Half the rounds have the run's page open in a headless Chromium from its first report to its
end (the page asks the server for what is new every 0.7 s, and the server reads the run's new
bytes). The figure is the training time between the run's first and last report (from
``metrics.jsonl``'s own time stamps), so interpreter start-up is left out of both.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ui_live.py [--rounds 3] [--epochs 40]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hookdet.ui.catalog import root_key  # noqa: E402
from tests.support.browser import browser, ui_server, wait_for, wait_ready  # noqa: E402

HOOKDET = Path(sys.executable).with_name("hookdet")


def training_seconds(run_dir: Path) -> float:
    times = [json.loads(line)["time"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return max(times) - min(times)


def one_round(folder: Path, name: str, epochs: int, driver: Optional[Any], base: str) -> float:
    run_dir = folder / "runs" / name
    process = subprocess.Popen(
        [str(HOOKDET), "run", "const.yaml", "--run-dir", str(run_dir), "--config", f"searcher.max_length.epochs={epochs}"],
        cwd=folder, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if driver is not None:
        wait_for(lambda: (run_dir / "metrics.jsonl").exists() or process.poll() is not None, timeout=300)
        driver.get(f"{base}/run/{root_key(folder / 'runs')}/{name}")
        wait_ready(driver)
    assert process.wait(timeout=900) == 0, f"{name} failed"
    if driver is not None:
        driver.get("about:blank")
    return training_seconds(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        for path in (REPO / "examples" / "digits").iterdir():
            if path.is_file():
                shutil.copy(path, folder)
        (folder / "runs").mkdir()
        without: List[float] = []
        watched: List[float] = []
        with ui_server(str(folder / "runs")) as (url, _, _), browser() as driver:
            base = url.rstrip("/")
            for index in range(args.rounds):
                without.append(one_round(folder, f"alone-{index}", args.epochs, None, base))
                watched.append(one_round(folder, f"watched-{index}", args.epochs, driver, base))
                print(f"round {index + 1}: alone {without[-1]:.2f} s, page open {watched[-1]:.2f} s", flush=True)
        alone, seen = statistics.median(without), statistics.median(watched)
        spread = (max(without) - min(without)) / alone
        print(f"median training time: alone {alone:.2f} s, page open {seen:.2f} s: ratio {seen / alone:.3f} "
              f"(the alone rounds spread {100 * spread:.1f} % among themselves); load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
