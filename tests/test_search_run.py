"""Searches run end to end: real ``hookdet run`` driver processes, real trial processes, a real
Optuna store (SQLite; SQLite, the journal file and a PostgreSQL server each shared by workers, one
of them under another host name)."""
from __future__ import annotations

import contextlib
import csv
import json
import re
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from hookdet.search.report import read_search
from tests.builtin_plugins.test_progress import open_terminal, read_until_closed, screen_lines
from tests.support import hookdet_process
from tests.support.postgres_fixture import postgres_server
from tests.support.s3_fixture import s3_server  # noqa: F401  (a fixture)

pytest.importorskip("optuna")

from hookdet.search import methods  # noqa: E402
from hookdet.search.store import attrs_of  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "search"
HOOKDET = [sys.executable, "-m", "hookdet"]


def env(tmp_path: Path, threads: Optional[str] = "1") -> Dict[str, Optional[str]]:
    """The environment of a search in ``tmp_path``: ``OMP_NUM_THREADS=threads`` (None: unset, as
    :func:`tests.support.hookdet_process.child_env` reads it)."""
    return {**os.environ, "OMP_NUM_THREADS": threads, "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "MLFLOW_DISABLE_TELEMETRY": "true", "SEARCH_TEST_LOG": str(tmp_path / "trials.log")}


def search(tmp_path: Path, config: str, *args: str, timeout: int = 600,
           threads: Optional[str] = "1") -> subprocess.CompletedProcess:
    return hookdet_process.run("run", FIXTURES / config, *args, cwd=tmp_path, env=env(tmp_path, threads),
                               timeout=timeout)


def not_warnings(stderr: str) -> List[str]:
    """The lines of ``stderr`` but warnings (the fixtures' legacy ``max_length`` draws
    Determined's deprecation warning)."""
    return [line for line in stderr.splitlines() if not line.startswith("hookdet: warning:")]


def summary(search_dir: Path, drop=("restarts",)) -> List[Dict[str, str]]:
    with open(search_dir / "summary.csv") as handle:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(handle)]


def segments(search_dir: Path) -> list:
    from hookdet.search.store import Queue

    meta = json.loads((search_dir / "search.json").read_text())
    return Queue(meta["storage"], meta["study"]).segments()


def max_overlap(intervals: List[tuple]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_random_search_replaces_invalid_trials_and_two_workers_match_one(tmp_path: Path) -> None:
    """A random search with invalid trials, run by two workers and by one, without
    ``OMP_NUM_THREADS``: the same trials; each worker trains on its own cores, with as many
    threads in torch and in NumPy's BLAS (which the warm process loaded for the whole machine)."""
    two = search(tmp_path, "random.yaml", "--run-dir", "two", "--workers", "2", threads=None)
    assert two.returncode == 0, two.stderr[-3000:]
    rows = summary(tmp_path / "two")
    # experiment_seed 14 draws invalid = F, T, T, F: both invalid trials are replaced
    assert [row["state"] for row in rows] == ["completed", "invalid_hp", "invalid_hp",
                                              "completed"]
    assert [row["hp.invalid"] for row in rows] == ["False", "True", "True", "False"]
    assert (tmp_path / "two" / "searcher-metric.png").stat().st_size > 1000
    assert "best validation_loss" in two.stdout

    ran = [a for a in map(attrs_of, segments(tmp_path / "two")) if "started" in a]
    assert max_overlap([(a["started"], a["ended"]) for a in ran]) == 2
    assert {tuple(a["slot"]["cpus"]) for a in ran} == {(0,), (1,)}  # each worker its own core
    starts = [json.loads(line) for line in (tmp_path / "trials.log").read_text().splitlines()]
    assert {tuple(s["cpus"]) for s in starts} == {(0,), (1,)}
    assert {(s["threads"], tuple(s["blas_threads"])) for s in starts} == {(1, (1,))}
    assert {s["seed"] for s in starts} == {int(row["seed"]) for row in rows}
    # Inside a trial, its id is its number in the search (as on a Determined cluster), not 1.
    assert {s["trial_id"] for s in starts} == {s["cluster_trial_id"] for s in starts} == {int(row["trial"]) for row in rows}

    one = search(tmp_path, "random.yaml", "--run-dir", "one", "--workers", "1", threads=None)
    assert one.returncode == 0, one.stderr[-3000:]
    assert summary(tmp_path / "one") == rows
    alone = [json.loads(line) for line in (tmp_path / "trials.log").read_text().splitlines()][len(starts):]
    assert {(s["threads"], tuple(s["blas_threads"])) for s in alone} == {(2, (2,))}  # the one worker's two cores
    assert_optuna_dashboard_reads(tmp_path / "one")


def assert_optuna_dashboard_reads(search_dir: Path) -> None:
    """optuna-dashboard, started on the search's store, lists its study and every segment."""
    import socket
    import urllib.request

    storage = json.loads((search_dir / "search.json").read_text())["storage"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dashboard = subprocess.Popen([str(Path(sys.executable).parent / "optuna-dashboard"), storage, "--host",
                                  "127.0.0.1", "--port", str(port), "--quiet"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, studies = time.time() + 60, None
        while studies is None and time.time() < deadline and dashboard.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as answer:
                    studies = json.load(answer)["study_summaries"]
            except OSError:
                time.sleep(0.3)
        assert studies is not None, dashboard.stderr.read() if dashboard.poll() is not None else "no answer"
        (study,) = [study for study in studies if not study["study_name"].endswith(":trials")]
        (view,) = [each for each in studies if each["study_name"] == study["study_name"] + ":trials"]

        def trials_of(one: Dict[str, Any]) -> List[Dict[str, Any]]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{one['study_id']}", timeout=30) as answer:
                return json.load(answer)["trials"]

        stored = segments(search_dir)
        assert [(t["number"], t["state"]) for t in trials_of(study)] == [(s.number, s.state.name.capitalize()) for s in stored]
        # the view: one Optuna trial per hookdet trial, its hyperparameters as parameters, its
        # validations as intermediate values, stopped trials pruned, the others complete
        state = read_search(search_dir)[1]
        hookdet_trials = sorted(state["trials"].values(), key=lambda trial: trial["number"])
        view_trials = trials_of(view)
        assert len(view_trials) == len(hookdet_trials)
        expected_state = {"completed": "Complete", "stopped": "Pruned", "invalid_hp": "Fail", "errored": "Fail"}
        # the dashboard's importance plot has what it needs: every searched hyperparameter ranked
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{view['study_id']}/param_importances",
                                    timeout=120) as answer:
            (importances,) = json.load(answer)["param_importances"]
        assert {entry["name"] for entry in importances} == {param["name"] for param in view_trials[0]["params"]}
        by_trial = {int(next(a["value"] for a in seen["user_attrs"] if a["key"] == "hookdet_trial")): seen
                    for seen in view_trials}
        for trial in hookdet_trials:
            seen = by_trial[trial["number"]]
            assert seen["state"] == expected_state[trial["state"]], (seen, trial)
            assert seen["params"] and all(param["name"] for param in seen["params"]), seen
            steps = [value["step"] for value in seen["intermediate_values"]]
            assert steps == sorted(steps) and (max(steps) == trial["batches"] if trial["validations"] else not steps), \
                (seen, trial)
    finally:
        dashboard.kill()
        dashboard.wait()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_asha_stops_by_determineds_rule_and_a_continued_trial_equals_an_uninterrupted_run(
        tmp_path: Path) -> None:
    result = search(tmp_path, "asha.yaml", "--run-dir", "asha", "--workers", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    search_dir = tmp_path / "asha"
    state = read_search(search_dir)[1]
    by_key = {attrs["key"]: attrs for attrs in map(attrs_of, segments(search_dir))}
    units = methods.rung_units(2, 2.0, 8)
    assert units == [4, 8]

    # Replay the validations in the order the driver took them through the rule.
    seen: Dict[int, list] = {0: [], 1: []}
    expected = {}
    for key in state["processed"]:
        attrs = by_key[key]
        rung = units.index(attrs["target"])
        seen[rung].append(attrs["metric"])
        rank = sum(1 for m in seen[rung] if m < attrs["metric"])
        stop = rung == 1 or rank >= max(int(len(seen[rung]) / 2.0), 1)
        expected[attrs["request_id"]] = ("completed" if rung == 1 else
                                         "stopped" if stop else "continued")
    for rid, trial in state["trials"].items():
        assert trial["state"] == expected[rid]
    assert len(state["trials"]) == 4
    finished = [t for t in state["trials"].values() if t["state"] == "completed"]
    assert finished and all(t["batches"] == 8 for t in finished)
    assert all(t["batches"] == 4 for t in state["trials"].values() if t["state"] == "stopped")

    # The continued trial (resumed from its rung-0 checkpoint) equals one run straight through.
    assert_equals_a_straight_run(finished[0], tmp_path)


def assert_equals_a_straight_run(trial: dict, tmp_path: Path, model_dir: Path = FIXTURES, length: int = 8) -> None:
    """The trial's metrics.jsonl, trained in segments, equals one uninterrupted run's."""
    straight = tmp_path / f"straight-{trial['number']}"
    run = hookdet_process.run("run", Path(trial["dir"]) / f"segment-{trial['segments']}.yaml",
                              "--run-dir", straight, "--model-dir", model_dir, cwd=tmp_path,
                              env={**env(tmp_path), "HOOKDET_TRIAL_SEED": str(trial["seed"])})
    assert run.returncode == 0, run.stderr[-3000:]

    def values(path: Path) -> list:
        records = [json.loads(line) for line in path.read_text().splitlines()]
        return [(r["group"], r["steps_completed"], r["metrics"]) for r in records]

    segmented = values(Path(trial["dir"]) / "metrics.jsonl")
    assert segmented == values(straight / "metrics.jsonl")
    assert segmented[-1][1] == length


def script_experiment(name: str, batches: int, searcher: str) -> str:
    """A tutorial-shaped experiment file: ``train.py`` (a Trainer-API script) trained
    ``batches`` batches, validating every 3, under the ``searcher`` block given as YAML lines."""
    return (f"name: {name}\nentrypoint: python3 train.py --batches {batches} --validate-every 3\n"
            "hyperparameters:\n"
            "  learning_rate: {type: log, minval: -1.5, maxval: 0.3, base: 10}\n"
            "  global_batch_size: 32\n  n_hidden: 32\n  dropout: 0.25\n"
            f"searcher:\n{searcher}reproducibility:\n  experiment_seed: 11\n")


SCRIPT_DIR = Path(__file__).parent / "fixtures" / "trainer_script"


def search_script(tmp_path: Path, file_name: str, experiment: str, run_dir: str, workers: int) -> subprocess.CompletedProcess:
    """``hookdet run`` of a script experiment written to ``file_name``, as a user types it."""
    config = tmp_path / file_name
    config.write_text(experiment)
    return hookdet_process.run("run", config, "--run-dir", run_dir, "--model-dir", SCRIPT_DIR,
                               "--workers", str(workers), cwd=tmp_path, env=env(tmp_path), timeout=800)


SCRIPT_ASHA = script_experiment("script-asha", 16, """\
  name: async_halving
  metric: validation_loss
  num_rungs: 2
  divisor: 2
  max_trials: 4
  max_concurrent_trials: 2
  time_metric: batches
  max_time: 16
""")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_asha_stops_a_trainer_api_script_at_the_first_validation_past_its_rung(tmp_path: Path) -> None:
    """A tutorial-shaped Trainer-API script (its own ``fit(max_length=Batch(16))``, validating
    every 3 batches) under ASHA with rungs at 8 and 16: each trial pauses at its first
    validation at or past 8 (batch 9), as Determined decides; a stopped trial trains 9 batches,
    not 16; ``Trainer.fit`` returns and the script ends; a continued trial equals one run
    straight through."""
    result = search_script(tmp_path, "adaptive.yaml", SCRIPT_ASHA, "asha", workers=2)
    assert result.returncode == 0, result.stderr[-3000:]
    state = read_search(tmp_path / "asha")[1]
    trials = list(state["trials"].values())
    assert len(trials) == 4
    stopped = [t for t in trials if t["state"] == "stopped"]
    completed = [t for t in trials if t["state"] == "completed"]
    assert stopped and completed and len(stopped) + len(completed) == 4, [t["state"] for t in trials]
    assert {t["batches"] for t in stopped} == {9} and {t["batches"] for t in completed} == {16}
    # A line per decision while it runs: what the segment reached, its trial's fate, the best.
    progress = [line for line in result.stdout.splitlines() if line.startswith("search: trial ")]
    assert len(progress) == len(state["processed"]) and sum("reached batch 9 " in line for line in progress) == 4
    assert all(" | best: trial " in line for line in progress), progress
    # one row each: the searched hyperparameters only, to 4 significant digits
    assert all(re.search(r" \| best: trial \d+, validation_loss \S+ \(learning_rate=[\d.e-]+\) \|", line)
               for line in progress), progress
    assert all(len(line) <= 200 for line in progress), [len(line) for line in progress]
    assert all(" | ETA at most " in line for line in progress), progress  # 4 trials of 16 batches at most
    assert progress[-1].endswith(" | ETA at most 0s"), progress
    for trial in stopped:
        run_dir = Path(trial["dir"])
        assert json.loads((run_dir / "run.json").read_text())["state"] == "paused"
        reports = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["steps_completed"] for r in reports if r["group"] == "validation"] == [3, 6, 9]
        log = run_dir.with_name(run_dir.name + ".log").read_text()
        assert log.count("RESULT {") == 1, log[-2000:]  # fit returned; the script went on to its end
    assert_equals_a_straight_run(completed[0], tmp_path, model_dir=SCRIPT_DIR, length=16)
    assert_the_run_commands_read_the_search(tmp_path, "asha", state)


def assert_the_run_commands_read_the_search(cwd: Path, search_dir: str, state: Dict) -> None:
    """``hookdet runs`` lists the trials under their search with the search's states (a stopped
    trial's own run.json says ``paused``); ``show``, ``compare`` and ``plot`` take the search."""
    def hookdet(*args: str) -> str:
        done = hookdet_process.run(*args, cwd=cwd, env=env(cwd), timeout=300)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        return done.stdout

    trials = [state["trials"][rid] for rid in state["order"]]
    listing = hookdet("runs", ".").splitlines()  # runs outside the search first, then the search
    [at] = [index for index, line in enumerate(listing) if line.startswith(f"search {search_dir}: ")]
    heading, rows = listing[at], listing[at + 1:]
    assert heading.startswith(f"search {search_dir}: async_halving search on validation_loss, {len(trials)} trials")
    assert all(row.startswith("  ") for row in rows) and len(rows) == len(trials) + 1  # its header, its trials
    for trial in trials:
        [row] = [line for line in rows if line.split()[0] == Path(trial["dir"]).name]
        assert row.startswith("  ") and row.split()[1] == trial["state"], listing
    shown = hookdet("show", search_dir)
    assert shown.splitlines()[0] == heading[len("search "):]
    assert "best: trial " in shown and "summary.csv" in shown
    compared = hookdet("compare", search_dir).splitlines()
    assert compared[0].split() == [Path(trial["dir"]).name for trial in trials]
    hookdet("plot", search_dir, "-o", "search.png")
    assert (cwd / "search.png").stat().st_size > 1000


SCRIPT_RANDOM = script_experiment("script-random", 6, """\
  name: random
  metric: validation_loss
  max_trials: 2
""")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_random_search_without_a_length_trains_each_trial_the_length_its_script_sets(tmp_path: Path) -> None:
    """Determined's tutorial ``dist_random.yaml`` has no ``max_length``: the script's
    ``Trainer.fit(max_length=...)`` is the trial's length, in one segment."""
    result = search_script(tmp_path, "dist_random.yaml", SCRIPT_RANDOM, "random", workers=1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning" not in result.stderr
    state = read_search(tmp_path / "random")[1]
    trials = list(state["trials"].values())
    assert [(t["state"], t["batches"], t["segments"]) for t in trials] == [("completed", 6, 1)] * 2


@pytest.mark.slow
def test_a_grid_without_hyperparameters_has_no_trial(tmp_path: Path) -> None:
    """As in Determined: a grid of no axes has no points, so the search creates no trial."""
    config = tmp_path / "grid.yaml"
    config.write_text("name: empty-grid\nentrypoint: search_trial:LineTrial\n"
                      "searcher: {name: grid, metric: validation_loss, max_length: {batches: 2}}\n")
    result = hookdet_process.run("run", config, "--run-dir", "grid", "--model-dir", FIXTURES, cwd=tmp_path,
                                 env=env(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    state = read_search(tmp_path / "grid")[1]
    assert state["trials"] == {}
    assert summary(tmp_path / "grid") == []
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_asha_with_promotion_resumes_paused_trials_bit_for_bit(tmp_path: Path) -> None:
    result = search(tmp_path, "asha_promote.yaml", "--run-dir", "promote", "--workers", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    state = read_search(tmp_path / "promote")[1]
    trials = state["order"]
    assert len(trials) == 3
    promoted = [state["trials"][rid] for rid in trials if state["trials"][rid]["batches"] == 8]
    assert promoted, "no trial was promoted"
    for trial in promoted:
        assert trial["segments"] == 2
        assert_equals_a_straight_run(trial, tmp_path)
    assert all(state["trials"][rid]["state"] in ("completed", "stopped") for rid in trials)
    # Each trial validated (and, improving, checkpointed) every 2 batches; retention's defaults
    # (save_trial_latest 1, save_trial_best 1) left at most two, paused or stopped trials included.
    for rid in trials:
        kept = list((Path(state["trials"][rid]["dir"]) / "checkpoints").glob("*/metadata.json"))
        assert 1 <= len(kept) <= 2, (rid, state["trials"][rid]["state"], kept)


def trial_death_recorded(search_dir: Path, pid: int) -> object:
    """The exit status the driver's worker recorded for the trial process ``pid`` (waiting for it
    up to 15 s): -9 when the SIGKILL killed it, its own status when it was already exiting."""
    deadline = time.time() + 15
    while time.time() < deadline:
        for segment in segments(search_dir):
            attrs = attrs_of(segment)
            if attrs.get("child_pid") == pid and segment.state.name != "RUNNING":
                return attrs.get("exit_code")
        time.sleep(0.1)
    return None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grid_does_not_replace_invalid_points(tmp_path: Path) -> None:
    clean = search(tmp_path, "grid.yaml", "--run-dir", "clean", "--workers", "2")
    assert clean.returncode == 0, clean.stderr[-3000:]
    rows = summary(tmp_path / "clean")
    assert sorted((row["hp.invalid"], row["state"]) for row in rows) == [
        ("False", "completed"), ("False", "completed"), ("True", "invalid_hp"),
        ("True", "invalid_hp")]


#: ``hookdet run`` as a scheduler's SIGTERM finds a search that has ended: the signal arrives as
#: the search's summary is about to be written (sent by the process to itself, then).
SIGTERM_AS_THE_SUMMARY_IS_WRITTEN = """
import os, signal, sys
from hookdet.search import cli
write = cli.finish
def finish(*args):
    os.kill(os.getpid(), signal.SIGTERM)
    write(*args)
cli.finish = finish
from hookdet.cli.commands import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_sigterm_as_a_finished_search_exits_changes_nothing(tmp_path: Path) -> None:
    """A SIGTERM once the search has ended, before its summary is written: the search still
    writes it and exits 0, instead of dying of the signal (-15) with no summary."""
    ended = subprocess.run([sys.executable, "-c", SIGTERM_AS_THE_SUMMARY_IS_WRITTEN, "run",
                            str(FIXTURES / "grid.yaml"), "--run-dir", "ended", "--workers", "2"],
                           cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True, timeout=600)
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert "received SIGTERM after training ended" in ended.stderr
    assert sorted(row["state"] for row in summary(tmp_path / "ended")) == [
        "completed", "completed", "invalid_hp", "invalid_hp"]


#: An ASHA search with more trials than slots, so which trials stop depends on the order of
#: decisions: the case where a kill or a second worker could change the outcome.
ASHA_ORDER_MATTERS = ("--config", "searcher.max_trials=6")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_asha_ends_alike_with_one_worker_and_with_two_under_ten_kills(tmp_path: Path) -> None:
    """Which trials stop, at which length, and every metric: the same with ``--workers 1`` as
    with ``--workers 2`` under a SIGTERM and ten SIGKILLs of the driver (half the time of a
    trial process first), each followed by ``--resume``."""
    one = search(tmp_path, "asha.yaml", "--run-dir", "one", "--workers", "1", *ASHA_ORDER_MATTERS)
    assert one.returncode == 0, one.stderr[-3000:]
    expected = summary(tmp_path / "one")
    assert {row["state"] for row in expected} == {"completed", "stopped"}  # decisions were taken

    killed_trials = kill_and_resume(tmp_path, "asha.yaml", ASHA_ORDER_MATTERS)
    killed_rows = summary(tmp_path / "killed", drop=())
    assert [{k: v for k, v in row.items() if k != "restarts"} for row in killed_rows] == expected
    assert not [s for s in segments(tmp_path / "killed") if s.state.name in ("RUNNING", "WAITING")]
    restarts = sum(int(row["restarts"]) for row in killed_rows)
    assert restarts >= killed_trials  # a killed trial process counts against max_restarts


def kill_and_resume(tmp_path: Path, config: str, options: tuple) -> int:
    """Run search ``config`` in ``killed``: SIGTERM it once as a trial trains (exit 75), then
    SIGKILL its driver at random moments (half the time a trial process first), resuming each
    time, and resume it to the end. The SIGTERM comes first, while most of the search is ahead:
    later, the segment it finds training might be the search's last, ending as it arrives. Its
    trials train two seconds per batch, so the search outlives the kills. Returns how many
    trial processes the kills ended."""
    rounds = int(os.environ.get("HOOKDET_SEARCH_KILL_ROUNDS", "10"))
    rng = random.Random(7)
    command = ["run", str(FIXTURES / config), "--workers", "2", *options]
    # A kill between a claim and its stamp leaves a segment whose worker is unknown until the
    # grace period passes (60 s by default): 10 s here, so such a round does not stall the test.
    slow = dict(env(tmp_path), SEARCH_TEST_SECONDS_PER_BATCH="2", HOOKDET_SEARCH_GRACE_SECONDS="10")
    terminated = hookdet_process.start(*command, "--run-dir", "killed", cwd=tmp_path, env=slow)
    terminated.first_line(lambda line: "search in" in line)  # the driver is up
    wait_on_search(lambda: [s for s in segments(tmp_path / "killed") if s.state.name == "RUNNING"],
                   terminated, "a trial to train", timeout=120)
    terminated.send_signal(signal.SIGTERM)  # the trials checkpoint and the search exits 75
    assert terminated.wait(timeout=300) == 75, terminated.communicate()[1][-3000:]
    killed_trials, killed_drivers = 0, 0
    for _ in range(rounds):
        driver = hookdet_process.start(*command, "--resume", "killed", cwd=tmp_path, env=slow)
        try:
            driver.wait(timeout=rng.uniform(1.0, 3.0))
            break  # finished before the kill
        except subprocess.TimeoutExpired:
            pass
        if rng.random() < 0.5:  # SIGKILL a trial process: it is restarted from its checkpoint
            running = [attrs_of(s).get("child_pid") for s in segments(tmp_path / "killed")
                       if s.state.name == "RUNNING"]
            for pid in filter(None, running[:1]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                killed_trials += trial_death_recorded(tmp_path / "killed", pid) == -signal.SIGKILL
            try:
                driver.wait(timeout=rng.uniform(0.5, 2.0))
                break
            except subprocess.TimeoutExpired:
                pass
        driver.send_signal(signal.SIGKILL)  # the driver alone, as kill -9 PID does
        driver.wait()
        killed_drivers += 1
    assert killed_drivers == rounds, f"the search finished after {killed_drivers} of {rounds} kills"
    resumed = search(tmp_path, config, "--resume", "killed", "--workers", "2", *options)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return killed_trials


#: The grace period of the shared-store test: a segment unheard of for this long is dead.
GRACE_SECONDS = 4
#: The host name of the shared-store test's "other machine".
OTHER_HOST = "other-machine"


def test_a_segment_that_crashes_after_recording_its_end_is_taken_as_it_recorded(tmp_path: Path) -> None:
    """Each segment's process aborts (SIGABRT) as it exits, after its outcome record says it
    completed (a library's teardown crashing): the worker takes the record, says so once a
    segment, and charges no restart; no segment is trained again."""
    environment = {**env(tmp_path), "SEARCH_TEST_ABORT_AT_EXIT": "1"}
    result = hookdet_process.run("run", FIXTURES / "grid.yaml", "--run-dir", "grid", "--config",
                                 "hyperparameters.invalid=false", cwd=tmp_path, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = summary(tmp_path / "grid", drop=())
    assert [(row["state"], row["restarts"]) for row in rows] == [("completed", "0")] * 2, rows
    told = [line for line in result.stderr.splitlines() if "after it recorded its end" in line]
    assert len(told) == 2 and all("killed by SIGABRT" in line and "(completed, exit status 0)" in line
                                  for line in told), result.stderr[-3000:]
    assert len(segments(tmp_path / "grid")) == 2


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="a worker on a second host name needs unshare -u (root)")
@pytest.mark.parametrize("store", ["sqlite", "journal", "postgresql"])
def test_workers_on_one_shared_store_finish_a_search_and_a_lost_machine_is_retried(tmp_path: Path, store: str) -> None:
    """A driver with no workers of its own and two ``hookdet search worker`` processes on one store.
    The first is on "another machine": a host name of its own (``unshare -u``), so the driver
    cannot see its pid and goes by its beats (Optuna's heartbeats on SQLite and PostgreSQL,
    hookdet's attribute on the journal). It trains slower than the grace period, alive, and is never
    taken for dead; then its machine is lost mid-segment. The second, here, in a terminal, finishes
    the search: the lost segment is failed once the grace period passes and trained again."""
    with contextlib.ExitStack() as stack:
        url = {"sqlite": f"sqlite:///{tmp_path / 'store.db'}", "journal": f"journal:{tmp_path / 'store.log'}"}.get(store) \
            or stack.enter_context(postgres_server())
        environment = {**env(tmp_path), "HOOKDET_SEARCH_GRACE_SECONDS": str(GRACE_SECONDS)}
        # Six trials, the first three invalid at once: the other machine trains them and the
        # fourth, then is lost in the fifth, which the worker here trains again, then the sixth.
        driver = hookdet_process.start("run", FIXTURES / "grid.yaml", "--run-dir", "shared", "--workers", "0",
                                       "--storage", url, "--config", "hyperparameters.optimizer.lr.count=3",
                                       "--config", "hyperparameters.raise_in=init", cwd=tmp_path, env=environment)
        stack.callback(driver.kill)
        # Workers join once the driver has made the study and queued its first trials (its line).
        started = driver.first_line()
        assert started.startswith("hookdet: grid search in"), started
        lost = lose_a_machine_mid_segment(tmp_path, url, driver, environment)
        here, on_terminal = a_worker_in_a_terminal_finishes(tmp_path, url, driver, environment)
        final = segments_of(url)
    assert {attrs_of(s)["worker"] for s in final} == {f"{OTHER_HOST}:{lost['pid']}", f"{os.uname().nodename}:{here}"}
    first = [s for s in final if s.number == lost["completed"]][0]
    assert (first.datetime_complete - first.datetime_start).total_seconds() > GRACE_SECONDS  # slow, alive, kept
    failed = [s for s in final if s.state.name == "FAIL" and attrs_of(s).get("exit_code") is None]
    assert [s.number for s in failed] == [lost["lost"]]  # only the lost machine's segment, never a live one
    again = [s for s in final if attrs_of(s).get("request_id") == lost["request_id"] and s.number > lost["lost"]]
    assert again and not attrs_of(again[-1])["worker"].startswith(OTHER_HOST)
    assert attrs_of(again[-1]).get("exit_code") is not None  # trained again here, to its own end
    assert len(summary(tmp_path / "shared")) == 6
    # each worker says which trial it trains, and how it ended (off a terminal as in one)
    said = lost["said"] + on_terminal
    started_lines = sorted(int(line.split()[2]) for line in said if line.startswith("worker: trial ") and " training " in line)
    ended = [line for line in said if line.startswith("worker: trial ") and " ended at batch " in line]
    assert started_lines == sorted(int(attrs_of(s)["trial"]) for s in final), said
    assert len(ended) == len(final) - 1, said  # all but the lost one
    assert all(re.search(r"ended at batch (\d+ \(validation_loss [\d.e+-]+\)|\?), exit status \d+, after [\d.]+ s$",
                         line) for line in ended), ended
    assert any(" exit status 0," in line for line in ended), ended


def lose_a_machine_mid_segment(tmp_path: Path, url: str, driver: hookdet_process.Hookdet,
                               environment: Dict[str, str]) -> Dict[str, Any]:
    """Start a worker under the host name :data:`OTHER_HOST`, its batches slow enough that a
    segment outlasts the grace period; once one of its segments completed and the next trains,
    kill it with its training process (its machine is lost). What it did, by segment number, and
    what it said (to a pipe)."""
    # cold: the worker runs under unshare, as on a machine with another host name
    worker = " ".join([*HOOKDET, "search", "worker", "--storage", f"'{url}'", "--index", "0", "--of", "2"])
    other = subprocess.Popen(["unshare", "-u", "sh", "-c", f"hostname {OTHER_HOST} && exec {worker}"],
                             cwd=tmp_path, env={**environment, "SEARCH_TEST_SECONDS_PER_BATCH": "0.8"},
                             start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def remote(state: str) -> list:
        return [s for s in segments_of(url) if s.state.name == state and attrs_of(s).get("child_pid")
                and str(attrs_of(s).get("worker", "")).startswith(f"{OTHER_HOST}:")]

    try:
        completed = wait_on_search(lambda: remote("COMPLETE"), driver, "the other machine's first segment to complete")
        training = wait_on_search(lambda: remote("RUNNING"), driver, "its next segment to train")[0]
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        said, _ = other.communicate()
    return {"pid": other.pid, "completed": completed[0].number, "lost": training.number,
            "request_id": attrs_of(training)["request_id"], "said": said.splitlines()}


def a_worker_in_a_terminal_finishes(tmp_path: Path, url: str, driver: hookdet_process.Hookdet,
                                    environment: Dict[str, str]) -> tuple:
    """A worker here, printing to a (pseudo-)terminal, finishes the search; its pid and the
    lines on its screen."""
    controller, terminal = open_terminal(columns=120)
    screens: List[str] = []
    reader = threading.Thread(target=lambda: screens.append(read_until_closed(controller, timeout=600)))
    reader.start()
    # cold: its output goes to a terminal
    worker = subprocess.Popen([*HOOKDET, "search", "worker", "--storage", url, "--index", "1", "--of", "2"],
                              cwd=tmp_path, env=environment, close_fds=True, text=True, stdout=terminal, stderr=terminal)
    os.close(terminal)
    _, err = driver.communicate(timeout=600)
    assert driver.returncode == 0 and not not_warnings(err), err[-3000:]  # nothing but the fixture's warning
    assert worker.wait(timeout=300) == 0
    reader.join(timeout=60)
    return worker.pid, screen_lines(screens[0])


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="a worker on a second host name needs unshare -u (root)")
def test_a_machine_that_freezes_past_the_grace_period_and_wakes_loses_no_trial(tmp_path: Path) -> None:
    """One trial, trained by a worker on "another machine" (its own host name), whose machine
    freezes (SIGSTOP to its processes) mid-segment for longer than the grace period. The driver
    gives the segment up as lost and a worker here takes the retry: it waits for the trial's run
    directory, which the frozen segment still holds, instead of being refused by its lock (which
    the driver took for a usage error: the trial errored). The machine wakes (SIGCONT), its
    segment finishes, and the retry continues from its checkpoint: the trial completes."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    environment = {**env(tmp_path), "HOOKDET_SEARCH_GRACE_SECONDS": str(GRACE_SECONDS)}
    config = tmp_path / "one.yaml"
    config.write_text((FIXTURES / "grid.yaml").read_text().replace("vals: [false, true]", "vals: [false]")
                      .replace("count: 2", "count: 1"))
    driver = hookdet_process.start("run", config, "--run-dir", "search", "--workers", "0", "--storage", url,
                                   "--model-dir", FIXTURES, cwd=tmp_path, env=environment)
    assert driver.first_line().startswith("hookdet: grid search in")
    worker = " ".join([*HOOKDET, "search", "worker", "--storage", f"'{url}'", "--index", "0", "--of", "2"])
    other = subprocess.Popen(["unshare", "-u", "sh", "-c", f"hostname {OTHER_HOST} && exec {worker}"],
                             cwd=tmp_path, env={**environment, "SEARCH_TEST_SECONDS_PER_BATCH": "0.5"},
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_on_search((tmp_path / "search" / "trial-001" / "metrics.jsonl").exists, driver, "its first report")
        os.killpg(other.pid, signal.SIGSTOP)  # the machine freezes, its segment holding the run directory
        here = hookdet_process.start("search", "worker", "--storage", url, "--index", "1", "--of", "2",
                                     cwd=tmp_path, env=environment)
        wait_on_search(lambda: "waits for its run directory" in here.output()[0], driver,
                       "the retry to wait for the frozen segment's run directory")
        os.killpg(other.pid, signal.SIGCONT)
        _, err = driver.communicate(timeout=300)
        assert driver.returncode == 0, err[-3000:]
        said, _ = here.communicate(timeout=120)
        assert here.returncode == 0
    finally:
        os.killpg(other.pid, signal.SIGCONT)
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()
    (row,) = summary(tmp_path / "search", drop=())
    assert row["state"] == "completed", (row, err[-3000:])
    assert "held by pid " in said and f"on host {OTHER_HOST}" in said
    assert "usage error" not in err


def wait_on_search(condition: Any, driver: hookdet_process.Hookdet, what: str, timeout: float = 300) -> Any:
    """Poll ``condition`` until it gives something (which it returns); the driver must not end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        assert driver.poll() is None, f"the driver ended while waiting for {what}: {driver.returncode}"
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_searchers_determined_removed_are_refused_with_its_reason(tmp_path: Path) -> None:
    config = tmp_path / "old.yaml"
    config.write_text((FIXTURES / "grid.yaml").read_text().replace("name: grid", "name: adaptive_simple"))
    result = hookdet_process.run("run", config, cwd=tmp_path, env=env(tmp_path),
                                 timeout=60)
    assert result.returncode == 2
    assert ("searcher.name: the 'adaptive_simple' searcher has been removed and is not valid for "
            "new experiments") in result.stderr
    assert "Traceback" not in result.stderr


def test_a_grid_over_a_range_without_count_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    config = tmp_path / "grid.yaml"
    config.write_text((FIXTURES / "grid.yaml").read_text().replace("      count: 2\n", ""))
    result = hookdet_process.run("run", config, "--run-dir", "grid", cwd=tmp_path,
                                 env=env(tmp_path), timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "hyperparameter(s) optimizer.lr have no count" in result.stderr
    assert not (tmp_path / "grid").exists()


def test_preview_lists_rungs_and_the_first_trials(tmp_path: Path) -> None:
    result = hookdet_process.run("search", "preview", FIXTURES / "asha.yaml",
                                 cwd=tmp_path, env=env(tmp_path), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "4 trials, rungs at [4, 8] batches" in result.stdout
    assert result.stdout.count("    trial ") == 2


def test_preview_takes_config_overrides_as_hookdet_run_does(tmp_path: Path) -> None:
    result = hookdet_process.run("search", "preview", FIXTURES / "asha.yaml",
                                 "--config", "searcher.max_trials=6", "--config", "searcher.max_time=16",
                                 cwd=tmp_path, env=env(tmp_path), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "6 trials, rungs at [8, 16] batches" in result.stdout, result.stdout


@pytest.mark.parametrize("name, expected", [
    ("random.yaml", "6 trials, each trained 3 epochs"),
    ("grid.yaml", "6 grid points, each trained 3 epochs"),
    ("adaptive.yaml", "bracket 1: 3 trials, at most 1 at once, rungs at [180] batches"),
])
def test_the_digits_search_examples_preview(tmp_path: Path, name: str, expected: str) -> None:
    digits = Path(__file__).resolve().parent.parent / "examples" / "digits"
    result = hookdet_process.run("search", "preview", digits / name, cwd=tmp_path,
                                 env=env(tmp_path), timeout=60)
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout


def test_a_search_without_the_extra_names_it(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['optuna'] = None; from hookdet.cli.commands import main; "
            f"sys.exit(main(['run', {str(FIXTURES / 'grid.yaml')!r}, '--run-dir', 'x']))")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env(tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "install the 'search' extra: pip install 'hookdet[search]'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_single_run_of_a_space_trains_trial_one_with_its_seed(tmp_path: Path) -> None:
    from hookdet.config import load_experiment_config
    from hookdet.search.space import MasterRandom, draw_trial

    config = tmp_path / "single.yaml"
    config.write_text((FIXTURES / "asha.yaml").read_text().replace(
        "name: async_halving", "name: single\n  max_length: {batches: 4}").replace(
        "  num_rungs: 2\n", "").replace("  divisor: 2\n", "").replace("  max_trials: 4\n", "")
        .replace("  max_concurrent_trials: 2\n", "").replace("  time_metric: batches\n", "")
        .replace("  max_time: 8\n", ""))
    result = hookdet_process.run("run", config, "--run-dir", "run", "--model-dir", FIXTURES, cwd=tmp_path,
                                 env=env(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    [started] = [json.loads(line) for line in (tmp_path / "trials.log").read_text().splitlines()]
    draw = draw_trial(load_experiment_config(config).hyperparameter_space, MasterRandom(5))
    assert started["hparams"] == draw.hparams
    assert started["seed"] == draw.seed


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_searches_share_a_store_each_with_its_study_direction_and_one_driver(tmp_path: Path) -> None:
    """Two searches at once on one store: one study each, named by its directory, each with its
    searcher's direction, so Optuna's best trial is the best (larger is better in one); a second
    driver on a live search is refused in one line; a damaged store or search state is one line."""
    import optuna

    url = f"journal:{tmp_path / 'store.log'}"

    def start(run_dir: str, *options: str) -> hookdet_process.Hookdet:
        return hookdet_process.start("run", FIXTURES / "random.yaml", "--run-dir", run_dir, "--storage", url,
                                     *options, cwd=tmp_path, env=env(tmp_path))

    larger_options = ("--config", "searcher.smaller_is_better=false", "--config", "hyperparameters.sleep=0.2")
    larger = start("larger", *larger_options)
    assert larger.first_line().startswith("hookdet: random search in")
    second = search(tmp_path, "random.yaml", "--resume", "larger", *larger_options)
    assert second.returncode == 2 and len(not_warnings(second.stderr)) == 1, second.stderr
    assert "larger is running (pid" in second.stderr and "hookdet search worker" in second.stderr
    smaller = start("smaller")
    printed = {}
    for name, driver in (("larger", larger), ("smaller", smaller)):
        out, err = driver.communicate(timeout=600)
        assert driver.returncode == 0, err[-3000:]
        printed[name] = out

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "store.log")))
    for run_dir, direction, pick in (("larger", "MAXIMIZE", max), ("smaller", "MINIMIZE", min)):
        meta = json.loads((tmp_path / run_dir / "search.json").read_text())
        assert meta["study"].startswith(f"hookdet:{run_dir}:")
        study = optuna.load_study(study_name=meta["study"], storage=storage)
        assert study.direction.name == direction
        done = [s for s in study.trials if s.state.name == "COMPLETE"]
        assert done and study.best_trial.value == pick(s.value for s in done)
        rows = [row for row in summary(tmp_path / run_dir) if row["best"]]
        # A study's value is its segment's last validation; the summary's best is over all.
        best_last = pick(rows, key=lambda row: float(row["last"]))
        assert attrs_of(study.best_trial)["trial"] == int(best_last["trial"])
        best_row = pick(rows, key=lambda row: float(row["best"]))
        assert (f"best: trial {best_row['trial']} (completed), validation_loss {float(best_row['best']):.6g}, "
                f"hyperparameters {{") in printed[run_dir]
    assert len(optuna.get_all_study_names(storage)) == 4  # each search's segments and its trial view
    for run_dir, direction, pick in (("larger", "MAXIMIZE", max), ("smaller", "MINIMIZE", min)):
        view = optuna.load_study(study_name=json.loads((tmp_path / run_dir / "search.json").read_text())["study"]
                                 + ":trials", storage=storage)
        rows = [row for row in summary(tmp_path / run_dir) if row["best"]]
        assert view.direction.name == direction
        assert view.best_trial.user_attrs["hookdet_trial"] == int(pick(rows, key=lambda row: float(row["best"]))["trial"])

    (tmp_path / "smaller" / "search-state.json").write_text("{not json")
    damaged = search(tmp_path, "random.yaml", "--resume", "smaller")
    assert damaged.returncode == 2 and len(not_warnings(damaged.stderr)) == 1, damaged.stderr
    assert "search-state.json: not a search state hookdet wrote" in damaged.stderr
    (tmp_path / "garbage.db").write_bytes(b"this is not a database" * 100)
    meta = json.loads((tmp_path / "larger" / "search.json").read_text())
    (tmp_path / "larger" / "search.json").write_text(json.dumps(dict(meta, storage=f"sqlite:///{tmp_path / 'garbage.db'}")))
    unreadable = search(tmp_path, "random.yaml", "--resume", "larger", *larger_options)
    assert unreadable.returncode == 2 and len(not_warnings(unreadable.stderr)) == 1, unreadable.stderr
    assert "garbage.db cannot be read" in unreadable.stderr
    worker = hookdet_process.run("search", "worker", "--storage", url, cwd=tmp_path, env=env(tmp_path), timeout=120)
    assert worker.returncode == 2 and "holds 2 searches" in worker.stderr and "--study" in worker.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_tpe_search_with_hyperband_ends_alike_with_two_workers_and_a_driver_kill(tmp_path: Path) -> None:
    """``searcher: {name: optuna, sampler: tpe, pruner: hyperband}`` through ``hookdet run``: the
    pruner stops a trial at its first rung, TPE draws from the trials that ended, and the summary
    (trials, hyperparameters, seeds, states, lengths, metrics) is the same with ``--workers 1``
    as with ``--workers 2`` and a SIGKILL of the driver after its first decision, then
    ``--resume``; the best-trial line names the summary's best."""
    one = search(tmp_path, "optuna.yaml", "--run-dir", "one", "--workers", "1")
    assert one.returncode == 0, one.stderr[-3000:]
    expected = summary(tmp_path / "one")
    assert {row["state"] for row in expected} == {"completed", "stopped"}, expected  # the pruner decided
    assert {row["batches"] for row in expected if row["state"] == "stopped"} == {"4"}  # at the first rung
    best = min((row for row in expected if row["best"]), key=lambda row: float(row["best"]))
    assert f"best: trial {best['trial']} (completed), validation_loss {float(best['best']):.6g}" in one.stdout

    driver = hookdet_process.start("run", FIXTURES / "optuna.yaml", "--workers", "2", "--run-dir", "killed",
                                   cwd=tmp_path, env=env(tmp_path))
    driver.first_line(lambda line: line.startswith("search: trial"))  # its first decision is saved: kill it now
    driver.send_signal(signal.SIGKILL)  # the driver alone, as kill -9 PID does
    driver.wait()
    resumed = search(tmp_path, "optuna.yaml", "--resume", "killed", "--workers", "2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert summary(tmp_path / "killed") == expected


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_workers_that_share_only_postgresql_and_s3_finish_a_search(tmp_path: Path, s3_server: Dict[str, str]) -> None:
    """Two ``hookdet search worker --work-dir`` processes, each in a directory and HOME of its
    own with its own copy of the model code, share only a PostgreSQL store and an S3 bucket with
    the driver: worker 0 is stopped (SIGTERM) while it trains, worker 1 resumes that trial from its
    checkpoint in S3, both finish the search, and the summary equals one worker's on one disk."""

    import yaml

    config = yaml.safe_load((FIXTURES / "asha.yaml").read_text())
    config["checkpoint_storage"] = {"type": "s3", "bucket": s3_server["bucket"], "prefix": "search",
                                    "endpoint_url": s3_server["endpoint_url"]}
    homes = {}
    for name in ("driver", "one", "w0", "w1"):
        homes[name] = tmp_path / name
        shutil.copytree(FIXTURES, homes[name] / "model", ignore=shutil.ignore_patterns("*.yaml", "__pycache__"))
    (homes["driver"] / "model" / "asha-s3.yaml").write_text(yaml.safe_dump(config))

    def env_of(name: str) -> Dict[str, str]:
        return {**env(tmp_path), "HOME": str(homes[name]), "SEARCH_TEST_SECONDS_PER_BATCH": "0.2"}

    experiment = str(homes["driver"] / "model" / "asha-s3.yaml")
    one = hookdet_process.run("run", experiment, "--run-dir", homes["one"] / "search", "--workers", "1",
                              cwd=homes["one"], env=env(tmp_path))
    assert one.returncode == 0, one.stderr[-3000:]

    def worker(name: str) -> hookdet_process.Hookdet:
        return hookdet_process.start("search", "worker", "--storage", url, "--work-dir", "trials",
                                     "--model-dir", "model", cwd=homes[name], env=env_of(name))

    with postgres_server() as url:
        driver = hookdet_process.start("run", experiment, "--run-dir", "search", "--workers", "0", "--storage", url,
                                       cwd=homes["driver"], env=env_of("driver"))
        assert driver.first_line().startswith("hookdet: async_halving search in")
        first = worker("w0")
        # a first decision: worker 0 has trained a segment, and trains the next
        driver.first_line(lambda line: line.startswith("search: trial"))
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=300) == 75, first.output()[1][-3000:]
        second = worker("w1")
        deadline = time.time() + 120
        while not [s for s in segments_of(url) if s.state.name == "RUNNING"] and time.time() < deadline:
            time.sleep(0.2)  # worker 1 takes the preempted segment first (the lowest number)
        again = worker("w0")
        driver.communicate(timeout=600)
        assert driver.returncode == 0
        for each in (second, again):
            assert each.wait(timeout=300) == 0, each.output()[1][-3000:]
        done = segments_of(url)
    assert summary(homes["driver"] / "search") == summary(homes["one"] / "search")
    by_trial: Dict[int, List[dict]] = {}
    for segment in sorted(done, key=lambda s: s.number):
        by_trial.setdefault(attrs_of(segment)["trial"], []).append(attrs_of(segment))
    moved = [number for number, attrs in by_trial.items()
             if len({a.get("worker") for a in attrs}) > 1 and any(a.get("resumed_at") for a in attrs)]
    assert moved, by_trial  # a trial resumed on another worker, from S3
    assert {a["worker"].rsplit(":", 1)[1] for attrs in by_trial.values() for a in attrs if a.get("exit_code") == 0} \
        >= {str(second.pid), str(again.pid)}
    # Nothing of the trials' training reached the driver's directory; each worker's is its own.
    assert not list((homes["driver"] / "search").rglob("metrics.jsonl"))
    assert list((homes["w1"] / "trials").rglob("metrics.jsonl"))


def segments_of(url: str) -> list:
    from hookdet.search.store import Queue

    return Queue(url).segments()


def test_a_trial_whose_validation_is_nan_ends_and_is_never_the_best(tmp_path: Path) -> None:
    """Two trials of the Core API exact script, one diverging (lr 5: every validation NaN):
    the search ends (Optuna keeps no NaN value: its store crashed the search at its next read),
    the NaN trial's row says nan, and the best trial is the one with a number."""
    folder = Path(shutil.copytree(Path(__file__).parent / "fixtures" / "core_api_exact", tmp_path / "exact"))
    finished = hookdet_process.run("run", "nan.yaml", "--run-dir", "nan", cwd=folder, env=env(tmp_path))
    assert finished.returncode == 0, finished.stderr[-3000:]
    rows = {row["hp.lr"]: row for row in summary(folder / "nan")}
    assert rows["5.0"]["best"] == "nan" and rows["5.0"]["state"] == "completed"
    assert float(rows["0.01"]["best"]) < 1
    assert f"best: trial {rows['0.01']['trial']} (completed)" in finished.stdout
