"""``hookdet ui`` at scale, in a real headless Chromium: 500 runs of 2,000 reports in the list,
and a search of 200 trials of 5,000 reports (500 of them validations), 3 metrics each.

It writes the run and search directories in hookdet's own formats (``run.json``, ``config.json``,
``metrics.jsonl`` and the ``metrics-summary.json`` hookdet's writer keeps beside it;
``search.json``, ``search-state.json``), starts ``hookdet ui`` on them as a user would, and
measures:

* **start-up**: from starting ``hookdet ui`` to its URL printed (the server listening), and
  then its first answer (the list: every run's records read for the first time);
* **list ready**: the browser's navigation to ``/`` until the page has drawn its rows, and one
  poll of ``/api/list`` (what the open page asks again and again);
* **search ready**: navigation to the search's page until its curves chart has a trace per trial
  (the server's first reading of the trials' validations included, then again warm), and until
  every chart further down is drawn too (the hyperparameter charts come a moment later);
* **server memory**: its resident size after the search page;
* then the same for a search of ten times the trials (``--more``, default 10).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ui_scale.py [--runs 500] [--trials 200] [--records 5000]

Check ``uptime`` first: the figures are seconds on this machine as loaded as it is.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hookdet.runs.metrics import summarize, write_summary  # noqa: E402
from hookdet.ui.catalog import root_key  # noqa: E402
from tests.support.browser import browser, ui_server, wait_for, wait_ready  # noqa: E402


def write_run(directory: Path, records: int, seed: int, every: int = 50) -> None:
    """A completed run of ``records`` reports, a validation every ``every`` of them, 3 metrics a
    report, and the summary of them hookdet's writer keeps."""
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
        if batch % every == 0:
            metrics = {"validation_loss": loss * 1.1, "accuracy": 1 - loss / 3, "top5": 1 - loss / 6}
            lines.append(json.dumps({"group": "validation", "steps_completed": batch, "metrics": metrics, "time": 0.0}))
        else:
            metrics = {"loss": loss, "lr": 0.1 / (1 + batch / 1000), "grad_norm": generator.random()}
            lines.append(json.dumps({"group": "training", "steps_completed": batch, "metrics": metrics, "time": 0.0}))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    write_summary(directory, summarize(directory))


#: The space the search's trials were drawn from, as its experiment file gives it.
SPACE = {"lr": {"type": "double", "minval": 0.0, "maxval": 2.0},
         "momentum": {"type": "double", "minval": 0.5, "maxval": 0.95},
         "dropout": {"type": "categorical", "vals": [number / 10 for number in range(7)]}}


def write_search(directory: Path, trials: int, records: int) -> None:
    """A finished search of ``trials`` trials, each a run of ``records`` reports."""
    directory.mkdir(parents=True)
    state: Dict[str, Any] = {"order": [], "trials": {}}
    for number in range(1, trials + 1):
        request_id = f"r{number:04d}"
        trial_dir = directory / f"trial-{number:03d}"
        write_run(trial_dir, records, seed=number, every=10)
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
                                                       "experiment": {"name": "scale", "hyperparameters": SPACE}}))


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


def save_page(driver: Any, folder: Optional[str], name: str) -> None:
    """A screenshot of the whole page, when ``--screenshots`` names a folder."""
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        width = driver.get_window_size()["width"]
        driver.set_window_size(width, max(700, min(4000, driver.execute_script("return document.body.scrollHeight") + 40)))
        time.sleep(1)  # charts follow the new size on their own resize handler
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def measure(root: Path, trials: int, screenshots: Optional[str] = None) -> Dict[str, float]:
    key = root_key(root)
    import urllib.request

    started = time.monotonic()
    with ui_server(str(root)) as (url, process, _), browser() as driver:
        startup = time.monotonic() - started
        urllib.request.urlopen(url, timeout=300).read()
        rows = "return document.querySelectorAll('#runs tbody tr').length > 0"
        curves = (f"const d = document.getElementById('curves'); return d && d.data && d.dataset.trials === '{trials}'")
        figures = {"startup_s": startup, "first_answer_s": time.monotonic() - started - startup}
        figures["list_page_s"] = timed_page(driver, url, rows)
        polled = time.monotonic()
        urllib.request.urlopen(f"{url.rstrip('/')}/api/list", timeout=300).read()
        figures["list_poll_s"] = time.monotonic() - polled
        every_chart = curves + " && document.getElementById('importance').data !== undefined"
        figures["search_first_s"] = timed_page(driver, f"{url.rstrip('/')}/search/{key}/search", curves)
        figures["search_s"] = timed_page(driver, f"{url.rstrip('/')}/search/{key}/search", curves)
        figures["search_every_chart_s"] = timed_page(driver, f"{url.rstrip('/')}/search/{key}/search", every_chart)
        figures["server_rss_mib"] = rss_kib(process.pid) / 1024
        if screenshots:
            save_page(driver, screenshots, f"scale-search-{trials}-trials")
            timed_page(driver, url, rows)
            save_page(driver, screenshots, f"scale-list-{trials}-trials")
            timed_page(driver, f"{url.rstrip('/')}/run/{key}/search/trial-001",
                       "const d = document.getElementById('chart-validation_loss'); return d && d.data")
            save_page(driver, screenshots, "scale-run")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--run-records", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--more", type=int, default=10, help="the second search has this many times the trials")
    parser.add_argument("--screenshots", help="a folder for pictures of the list, the search and a run page")
    args = parser.parse_args()
    print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "runs"
        for index in range(args.runs):
            write_run(root / f"run-{index:04d}", args.run_records, seed=index)
        write_search(root / "search", args.trials, args.records)
        print(f"{args.runs} runs x {args.run_records} reports, a search of {args.trials} trials x {args.records} "
              f"reports ({sum(p.stat().st_size for p in root.rglob('metrics.jsonl')) / 1e6:.0f} MB of metrics.jsonl)")
        for name, value in measure(root, args.trials, args.screenshots).items():
            print(f"  {name}: {value:.3f}")
        if args.more > 1:
            more = Path(folder) / "more"
            write_search(more / "search", args.trials * args.more, args.records)
            print(f"a search of {args.trials * args.more} trials x {args.records} reports "
                  f"({sum(p.stat().st_size for p in more.rglob('metrics.jsonl')) / 1e6:.0f} MB)")
            for name, value in measure(more, args.trials * args.more).items():
                print(f"  {name}: {value:.3f}")
        print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
