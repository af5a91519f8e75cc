"""``hookdet ui`` at scale, in a real headless Chromium: 500 runs in the list, and a search of 200
trials with 5,000 metric records each.

It writes the run and search directories in hookdet's own formats (``run.json``, ``config.json``,
``metrics.jsonl``; ``search.json``, ``search-state.json``), starts ``hookdet ui`` on them as a
user would, and measures:

* **start-up**: from starting ``hookdet ui`` to its URL printed (the server listening), and
  then its first answer (which reads every run's records for the first time);
* **list ready**: the browser's navigation to ``/`` until the page has drawn its rows;
* **search ready**: navigation to the search's page until its curves chart has a trace per trial
  (the server's first reading of 200 x 5,000 records included, then again warm);
* **server memory**: its resident size after the search page, against the same search with ten
  times the records per trial (bounded by what is shown, not by the size of ``metrics.jsonl``).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ui_scale.py [--runs 500] [--trials 200] [--records 5000]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hookdet.ui.catalog import root_key  # noqa: E402
from tests.support.browser import browser, ui_server, wait_for, wait_ready  # noqa: E402


def write_run(directory: Path, records: int, seed: int, every: int = 50) -> None:
    """A completed run of ``records`` training reports and a validation every ``every``."""
    generator = random.Random(seed)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({
        "name": directory.name, "hyperparameters": {"lr": generator.uniform(0.001, 0.1), "momentum": 0.9},
        "searcher": {"name": "single", "metric": "validation_loss", "smaller_is_better": True}}))
    (directory / "run.json").write_text(json.dumps({
        "state": "completed", "created": f"2026-11-{1 + seed % 27:02d}T10:00:00+00:00",
        "started": f"2026-11-{1 + seed % 27:02d}T10:00:00+00:00", "ended": f"2026-11-{1 + seed % 27:02d}T11:00:00+00:00",
        "batches_trained": records, "max_batches": records, "searcher_metric": "validation_loss"}))
    lines = []
    for batch in range(1, records + 1):
        loss = 2.0 / (1 + batch / 100) + generator.random() * 0.05
        lines.append(json.dumps({"group": "training", "steps_completed": batch, "metrics": {"loss": loss}, "time": 0.0}))
        if batch % every == 0:
            lines.append(json.dumps({"group": "validation", "steps_completed": batch,
                                     "metrics": {"validation_loss": loss * 1.1}, "time": 0.0}))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def write_search(directory: Path, trials: int, records: int) -> None:
    """A finished search of ``trials`` trials, each a run of ``records`` reports."""
    directory.mkdir(parents=True)
    state: Dict[str, Any] = {"order": [], "trials": {}}
    for number in range(1, trials + 1):
        request_id = f"r{number:04d}"
        trial_dir = directory / f"trial-{number:03d}"
        write_run(trial_dir, records, seed=number, every=max(1, records // 50))
        state["order"].append(request_id)
        state["trials"][request_id] = {
            "number": number, "request_id": request_id, "seed": number, "bracket": 0, "rung": number % 3,
            "state": "completed" if number % 3 == 2 else "stopped", "restarts": 0, "batches": records,
            "target": records, "validations": [[records // 2, 1.0 / number], [records, 0.5 / number]],
            "dir": str(trial_dir),
            "hparams": {"lr": 0.001 * number, "momentum": 0.5 + (number % 10) / 20, "dropout": (number % 7) / 10}}
    (directory / "search-state.json").write_text(json.dumps(state))
    (directory / "search.json").write_text(json.dumps({"searcher": "adaptive_asha", "metric": "validation_loss",
                                                       "smaller_is_better": True, "storage": "sqlite:///search.db",
                                                       "experiment": {"name": "scale"}}))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def timed_page(driver: Any, url: str, ready: str) -> float:
    """Seconds from navigating to ``url`` until the page's script is ready and ``ready`` (JS) holds."""
    start = time.monotonic()
    driver.get(url)
    wait_ready(driver, timeout=120)
    wait_for(lambda: driver.execute_script(ready), timeout=120, every=0.01)
    return time.monotonic() - start


def measure(root: Path, trials: int) -> Dict[str, float]:
    key = root_key(root)
    import urllib.request

    started = time.monotonic()
    with ui_server(str(root)) as (url, process, _), browser() as driver:
        startup = time.monotonic() - started
        urllib.request.urlopen(url, timeout=120).read()
        rows = "return document.querySelectorAll('#runs tbody tr').length > 0"
        curves = (f"const d = document.getElementById('curves'); return d && d.data && d.data.length === {trials}")
        figures = {"startup_s": startup, "first_answer_s": time.monotonic() - started - startup}
        figures["list_first_s"] = timed_page(driver, url, rows)
        figures["list_s"] = timed_page(driver, url, rows)
        figures["search_first_s"] = timed_page(driver, f"{url.rstrip('/')}/search/{key}/search", curves)
        figures["search_s"] = timed_page(driver, f"{url.rstrip('/')}/search/{key}/search", curves)
        figures["server_rss_mib"] = rss_kib(process.pid) / 1024
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--records", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "runs"
        for index in range(args.runs):
            write_run(root / f"run-{index:04d}", 200, seed=index)
        write_search(root / "search", args.trials, args.records)
        print(f"{args.runs} runs, a search of {args.trials} trials x {args.records} records "
              f"({sum(p.stat().st_size for p in root.rglob('metrics.jsonl')) / 1e6:.0f} MB of metrics.jsonl)")
        small = measure(root, args.trials)
        for name, value in small.items():
            print(f"  {name}: {value:.2f}")
        bigger = Path(folder) / "bigger"
        write_search(bigger / "search", args.trials, args.records * 10)
        large = measure(bigger, args.trials)
        print(f"the same search with {args.records * 10} records per trial: server {large['server_rss_mib']:.0f} MiB "
              f"(search page {large['search_first_s']:.2f} s first, {large['search_s']:.2f} s warm)")


if __name__ == "__main__":
    main()
