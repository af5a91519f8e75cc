"""What a search costs beyond its training: one random search of 16 short digits trials, three ways
in one run.

- ``cold``: ``hookdet run`` with ``HOOKDET_COLD_SEGMENTS=1``, every segment a new interpreter;
- ``warm``: ``hookdet run`` as it ships, every segment forked from the warm process;
- ``loop``: the same 16 configurations (each trial's own segment file and seed) trained back to
  back in one new Python process through ``hookdet run``'s own entry point, with the same
  validations and checkpoints: the search's work without its processes.

Per segment it reports the start-up (the worker starting the process to the trial's first batch)
and the work after training (its last batch to the process's exit, or to the next call in the
loop), and each way's wall time, from starting the command to its exit. Run::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/warm_search.py [--trials 16] [--batches 20]
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
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "examples" / "digits"

#: A digits trial that notes when its first batch starts and its last batch ends.
TIMED_TRIAL = '''
import json, os, time
from model_def import DigitsTrial


class TimedDigitsTrial(DigitsTrial):
    def train_batch(self, batch, epoch_idx, batch_idx):
        if not getattr(self, "_timed", False):
            self._timed = True
            self._note("first_batch", time.time())
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        if batch_idx + 1 == int(os.environ["BENCH_BATCHES"]):
            self._note("last_batch", time.time())
        return metrics

    def _note(self, event, when):
        with open(os.environ["BENCH_LOG"], "a") as log:
            log.write(json.dumps({"trial": self.context.get_trial_id(), "event": event, "time": when}) + "\\n")
'''


def experiment(trials: int, batches: int) -> str:
    """The digits random search, ``trials`` trials of ``batches`` batches, one at a time."""
    text = (DIGITS / "random.yaml").read_text()
    text = text.replace("entrypoint: model_def:DigitsTrial", "entrypoint: timed_trial:TimedDigitsTrial")
    text = text.replace("max_trials: 6", f"max_trials: {trials}").replace("max_concurrent_trials: 2", "max_concurrent_trials: 1")
    text = text.replace("max_length:\n    epochs: 3", f"max_length:\n    batches: {batches}")
    return text.replace("min_validation_period:\n  epochs: 1", f"min_validation_period:\n  batches: {batches}")


def notes(log: Path) -> Dict[int, Dict[str, float]]:
    found: Dict[int, Dict[str, float]] = {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        found.setdefault(record["trial"], {})[record["event"]] = record["time"]
    return found


def run_search(work: Path, config: Path, name: str, batches: int, cold: bool) -> Dict[str, List[float]]:
    """One search with one worker; per segment its start-up and its work after training."""
    log = work / f"{name}.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", BENCH_LOG=str(log), BENCH_BATCHES=str(batches))
    env.pop("HOOKDET_COLD_SEGMENTS", None)
    if cold:
        env["HOOKDET_COLD_SEGMENTS"] = "1"
    started = time.time()
    subprocess.run([sys.executable, "-m", "hookdet", "run", str(config), "--run-dir", str(work / name),
                    "--workers", "1"], env=env, cwd=work, check=True, capture_output=True)
    wall = time.time() - started
    from hookdet.search.store import Queue, attrs_of

    meta = json.loads((work / name / "search.json").read_text())
    times = notes(log)
    startup, after = [], []
    for segment in Queue(meta["storage"], meta["study"]).segments():
        attrs = attrs_of(segment)
        trial = times[attrs["trial"]]
        startup.append(trial["first_batch"] - attrs["started"])
        after.append(attrs["ended"] - trial["last_batch"])
    return {"wall": [wall], "startup": startup, "after": after}


def run_loop(work: Path, search_dir: Path, batches: int) -> Dict[str, List[float]]:
    """The search's trials (their segment files and seeds) trained back to back in one new
    Python process (so its wall time, like a search's, includes starting Python and importing)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", BENCH_LOG=str(work / "loop.log"), BENCH_BATCHES=str(batches))
    started = time.time()
    done = subprocess.run([sys.executable, __file__, "--loop", str(search_dir), str(work)], env=env,
                          cwd=work, check=True, capture_output=True, text=True)
    wall = time.time() - started
    calls = json.loads(done.stdout.splitlines()[-1])
    times = notes(work / "loop.log")
    return {"wall": [wall],
            "startup": [times[number]["first_batch"] - begun for number, begun, _ in calls],
            "after": [ended - times[number]["last_batch"] for number, _, ended in calls]}


def loop(search_dir: Path, work: Path) -> None:
    """In the loop's process: train each trial of ``search_dir`` through ``hookdet run``'s entry
    point; print ``[[trial, call start, call end], ...]``."""
    sys.path.insert(0, str(work))
    from hookdet.cli.commands import main as hookdet_main

    state = json.loads((search_dir / "search-state.json").read_text())
    calls = []
    for trial in sorted(state["trials"].values(), key=lambda trial: trial["number"]):
        os.environ["HOOKDET_TRIAL_SEED"] = str(trial["seed"])
        os.environ["HOOKDET_TRIAL_ID"] = str(trial["number"])
        segment = Path(trial["dir"]) / f"segment-{trial['segments']}.yaml"
        call_started = time.time()
        status = hookdet_main(["run", str(segment), "--run-dir", str(work / "loop" / f"trial-{trial['number']}"),
                               "--model-dir", str(work)])
        assert status == 0, status
        calls.append([trial["number"], call_started, time.time()])
    print(json.dumps(calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--no-cold", action="store_true", help="leave out the cold way (quicker, to compare changes)")
    parser.add_argument("--loop", nargs=2, metavar=("SEARCH_DIR", "WORK_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop:
        return loop(Path(args.loop[0]), Path(args.loop[1]))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copy(DIGITS / "model_def.py", work)
        (work / "timed_trial.py").write_text(TIMED_TRIAL)
        config = work / "search.yaml"
        config.write_text(experiment(args.trials, args.batches))
        results = {} if args.no_cold else {"cold": run_search(work, config, "cold", args.batches, cold=True)}
        results["warm"] = run_search(work, config, "warm", args.batches, cold=False)
        results["loop"] = run_loop(work, work / "warm", args.batches)
    loop_wall = results["loop"]["wall"][0]
    print(f"{args.trials} digits trials of {args.batches} batches, one at a time "
          f"(load average after: {os.getloadavg()[0]:.2f})")
    print(f"{'way':<6}{'wall s':>9}{'x loop':>8}{'start-up s (median, max)':>28}{'after training s (median, max)':>34}")
    for way, found in results.items():
        print(f"{way:<6}{found['wall'][0]:>9.1f}{found['wall'][0] / loop_wall:>8.2f}"
              f"{statistics.median(found['startup']):>19.3f}, {max(found['startup']):.3f}"
              f"{statistics.median(found['after']):>25.3f}, {max(found['after']):.3f}")


if __name__ == "__main__":
    main()
