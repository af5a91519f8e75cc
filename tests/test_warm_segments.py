"""Warm trial processes (``hookdet/search/warm_start.py``): a search's segments are forked from a
process that has imported torch and hookdet, train bit for bit as segments started as new
interpreters (``HOOKDET_COLD_SEGMENTS=1``), and stay processes of their own; a script
entrypoint's script is forked from its segment (``hookdet/search/warm_script.py``) and trains as
a new interpreter would. Real ``hookdet run`` drivers, real trial processes, a real Optuna store."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from tests.support.states import assert_states_equal
from tests.support import hookdet_process
from tests.test_search_run import FIXTURES, env, summary, wait_on_search

pytest.importorskip("optuna")


def run_search(workdir: Path, config: Path, *args: str, cold: bool = False, resume: bool = False) -> Dict[str, Any]:
    """Run search ``config`` in ``workdir/search`` (trial log ``workdir/trials.log``), or
    continue it (``resume``); its driver's pid and the trials' start records."""
    driver = start_search(workdir, config, *args, cold=cold, resume=resume)
    driver.wait(timeout=600)
    starts = [json.loads(line) for line in (workdir / "trials.log").read_text().splitlines()]
    parents = {record["ppid"] for record in starts}
    lingering = [pid for pid in parents if running(pid)]  # as the driver's exit is seen
    _, stderr = driver.communicate()
    assert driver.returncode == 0, stderr[-3000:]
    return {"pid": driver.pid, "starts": [r for r in starts if r["event"] == "start"], "stderr": stderr,
            "lingering": lingering}


def start_search(workdir: Path, config: Path, *args: str, cold: bool = False,
                 resume: bool = False) -> hookdet_process.Hookdet:
    """Start ``hookdet run config`` for ``workdir/search`` (see :func:`run_search`), its trials
    writing their unclosed log (``SEARCH_TEST_UNCLOSED``) to ``workdir/unclosed.log``."""
    workdir.mkdir(parents=True, exist_ok=True)
    environment = dict(env(workdir), SEARCH_TEST_UNCLOSED=str(workdir / "unclosed.log"))
    if cold:
        environment["HOOKDET_COLD_SEGMENTS"] = "1"
    else:
        environment.pop("HOOKDET_COLD_SEGMENTS", None)
    return hookdet_process.start("run", config, "--resume" if resume else "--run-dir", "search", *args, cwd=workdir,
                                 env=environment)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


#: What a checkpoint holds of the training (the plugins' part names checkpoints by their ids).
TRAINING_STATE = ("models_state_dict", "optimizers_state_dict", "lr_schedulers_state_dict",
                  "callbacks", "trial_state", "rng_state")


def newest_state(trial_dir: Path) -> Dict[str, Any]:
    """The newest checkpoint's training state (weights, optimizer, every RNG stream, the trial's
    position) of a trial."""
    metadata = max((trial_dir / "checkpoints").glob("*/metadata.json"),
                   key=lambda path: json.loads(path.read_text())["steps_completed"])
    state = torch.load(metadata.parent / "state_dict.pth", weights_only=True)
    state["trial_state"].pop("latest_checkpoint")  # an id, new for every checkpoint written
    return {key: state[key] for key in TRAINING_STATE}


def reports(trial_dir: Path) -> List[tuple]:
    records = [json.loads(line) for line in (trial_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["group"], r["steps_completed"], r["metrics"]) for r in records]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_warm_segments_train_bit_for_bit_as_cold_ones(tmp_path: Path) -> None:
    """An ASHA search (trials continued from their rung-0 checkpoints) run warm and cold: the
    same decisions, every trial's metrics.jsonl and its newest checkpoint (weights, optimizer,
    every RNG stream) equal bit for bit. Warm segments are children of one fork server, not of
    the driver, which ends it before it exits; cold ones are the driver's own. Either way a
    segment trains on the user's ``OMP_NUM_THREADS=1`` (torch and BLAS), not on its worker's two
    cores, and what a trial wrote to a file it never closed is on disk after its segment ends."""
    # Three trials (the fixture's four less one, for the cold search's sake): one stopped at its
    # rung, one continued from its checkpoint.
    options = ("--workers", "1", "--config", "searcher.max_trials=3")
    warm = run_search(tmp_path / "warm", FIXTURES / "asha.yaml", *options)
    cold = run_search(tmp_path / "cold", FIXTURES / "asha.yaml", *options, cold=True)
    assert summary(tmp_path / "warm" / "search") == summary(tmp_path / "cold" / "search")
    assert {row["state"] for row in summary(tmp_path / "warm" / "search")} == {"completed", "stopped"}
    trials = sorted(path.name for path in (tmp_path / "warm" / "search").glob("trial-*") if path.is_dir())
    assert len(trials) == 3
    for name in trials:
        warm_dir, cold_dir = tmp_path / "warm" / "search" / name, tmp_path / "cold" / "search" / name
        assert reports(warm_dir) == reports(cold_dir), name
        assert_states_equal(newest_state(warm_dir), newest_state(cold_dir), name)
    assert len(warm["starts"]) == len(cold["starts"]) > len(trials)  # continued trials started twice
    fork_servers = {record["ppid"] for record in warm["starts"]}
    assert len(fork_servers) == 1 and warm["pid"] not in fork_servers
    assert warm["lingering"] == []  # the warm process ended with the search, not a second after it
    assert {record["ppid"] for record in cold["starts"]} == {cold["pid"]}
    assert len({record["pid"] for record in warm["starts"]}) == len(warm["starts"])
    assert {(r["threads"], tuple(r["blas_threads"])) for r in warm["starts"] + cold["starts"]} == {(1, (1,))}
    unclosed = {way: sorted((tmp_path / way / "unclosed.log").read_text().splitlines()) for way in ("warm", "cold")}
    assert len(unclosed["cold"]) > 0 and unclosed["warm"] == unclosed["cold"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_trial_that_leaks_a_global_or_segfaults_touches_no_other(tmp_path: Path) -> None:
    """One worker runs a grid in order: a trial that leaves a global in torch, one that dies of
    SIGSEGV, then an ordinary one. The segfault fails its own trial only (its exit status is the
    signal's); no later trial sees the leaked global."""
    config = tmp_path / "misbehave.yaml"
    config.write_text(
        "name: misbehave\nentrypoint: search_trial:LineTrial\nmax_restarts: 0\n"
        "hyperparameters:\n  global_batch_size: 8\n  optimizer: {lr: 0.05}\n"
        "  misbehave: {type: categorical, vals: [none, segfault, leak]}\n"
        "searcher: {name: grid, metric: validation_loss, max_concurrent_trials: 1, max_length: {batches: 4}}\n"
        "min_validation_period: {batches: 4}\n")
    result = run_search(tmp_path, config, "--workers", "1", "--model-dir", str(FIXTURES))
    rows = {row["hp.misbehave"]: row["state"] for row in summary(tmp_path / "search")}
    assert rows == {"leak": "completed", "segfault": "errored", "none": "completed"}
    # Determined's grid order (the last value first): the leak comes before the other two.
    assert [record["hparams"]["misbehave"] for record in result["starts"]] == ["leak", "segfault", "none"]
    assert not any(record["leak_seen"] for record in result["starts"])
    segfaulted = (tmp_path / "search" / "trial-002.log").read_text()
    assert "Traceback" not in segfaulted
    from hookdet.search.store import attrs_of
    from tests.test_search_run import segments

    statuses = [attrs_of(s).get("exit_code") for s in segments(tmp_path / "search")]
    assert -signal.SIGSEGV in statuses


#: Put first in a copy of the Trainer-API script: how its process began, one line to the trials' log.
SCRIPT_PROBE = '''import json as _json, multiprocessing as _mp, os as _os, sys as _sys
with open(_os.environ["SEARCH_TEST_LOG"], "a") as _log:
    _log.write(_json.dumps({"event": "script", "pid": _os.getpid(), "ppid": _os.getppid(),
                            "torch_imported": "torch" in _sys.modules, "argv": _sys.argv,
                            "process_name": _mp.current_process().name,
                            "leads_its_session": _os.getsid(0) == _os.getpid(), "name": __name__,
                            "file": __file__, "path0": _sys.path[0]}) + "\\n")
'''


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_scripts_segments_fork_the_script_and_train_bit_for_bit_as_cold_ones(tmp_path: Path) -> None:
    """An ASHA search of a Trainer-API script (``python3 train.py ...``; one trial, continued
    from its rung's checkpoint through ``latest_checkpoint``) run warm, stopped by a
    SIGTERM as its first script trains and resumed, and cold: the same decisions, metrics,
    checkpoints and final weights. Warm, the script's process is forked from its
    segment (torch is imported before its first line); cold, it is a new interpreter; either
    way it leads its own session and sees the same ``sys.argv``, ``__file__``, ``sys.path[0]`` and
    process name."""
    from tests.test_search_run import SCRIPT_ASHA, SCRIPT_DIR

    model = tmp_path / "model"
    shutil.copytree(SCRIPT_DIR, model, ignore=shutil.ignore_patterns("__pycache__"))
    (model / "train.py").write_text(SCRIPT_PROBE + (SCRIPT_DIR / "train.py").read_text())
    config = tmp_path / "script.yaml"
    config.write_text(SCRIPT_ASHA)
    options = ("--workers", "1", "--model-dir", str(model), "--config", "searcher.max_trials=1",
               "--config", "hyperparameters.seconds_per_batch=0.1")
    interrupted = start_search(tmp_path / "warm", config, *options)
    # SIGTERM once the script trains (its first report at batch 3; it pauses at 9): passed on to
    # the forked script, which checkpoints and stops.
    reports_file = tmp_path / "warm" / "search" / "trial-001" / "metrics.jsonl"
    wait_on_search(reports_file.exists, interrupted, "the first script's first report")
    interrupted.send_signal(signal.SIGTERM)
    assert interrupted.wait(timeout=300) == 75, interrupted.communicate()[1][-3000:]
    assert "hookdet: preempted after " in (tmp_path / "warm" / "search" / "trial-001.log").read_text()
    run_search(tmp_path / "warm", config, *options, resume=True)
    cold = run_search(tmp_path / "cold", config, *options, cold=True)
    assert summary(tmp_path / "warm" / "search") == summary(tmp_path / "cold" / "search")
    assert [row["state"] for row in summary(tmp_path / "warm" / "search")] == ["completed"]
    for name in ("trial-001",):
        warm_dir, cold_dir = tmp_path / "warm" / "search" / name, tmp_path / "cold" / "search" / name
        assert reports(warm_dir) == reports(cold_dir), name
        assert_states_equal(newest_state(warm_dir), newest_state(cold_dir), name)
        results = [warm_dir.with_name(name + ".log").read_text(), cold_dir.with_name(name + ".log").read_text()]
        weights = [[line.split('"weights": ')[1] for line in log.splitlines() if line.startswith("RESULT ")][-1]
                   for log in results]  # as the trial's last segment ended
        assert weights[0] == weights[1], name
    probes = {way: [json.loads(line) for line in (tmp_path / way / "trials.log").read_text().splitlines()
                    if json.loads(line)["event"] == "script"] for way in ("warm", "cold")}
    assert len(probes["cold"]) == 2 and len(probes["warm"]) == 3  # the trial continued past its rung
    # (and its first segment warm, stopped by SIGTERM, started again)
    assert {probe["torch_imported"] for probe in probes["warm"]} == {True}
    assert {probe["torch_imported"] for probe in probes["cold"]} == {False}
    # Each search runs its snapshot of the model directory (SEARCH_DIR/model), the same paths in it.
    seen = [{key: value.replace(str(tmp_path / way / "search" / "model"), "SNAPSHOT") if isinstance(value, str) else value
             for key, value in probe.items() if key not in ("torch_imported", "pid", "ppid")}
            for way in ("warm", "cold") for probe in probes[way]]
    assert all(probe == seen[0] for probe in seen), seen
    assert seen[0]["leads_its_session"] and seen[0]["name"] == "__main__" and seen[0]["process_name"] == "MainProcess"
    assert seen[0]["argv"][0] == "train.py" and seen[0]["file"] == "SNAPSHOT/train.py"
    assert seen[0]["path0"] == "SNAPSHOT"


#: The grace period of the SIGKILL test: past it, Optuna's stale-heartbeat cleanup fails a segment.
GRACE_SECONDS = 4


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sigkill_of_the_driver_stops_its_warm_segment_with_a_checkpoint(tmp_path: Path) -> None:
    """``kill -9`` of a search's driver (its one worker runs in it): the warm process ends with
    it, so the segment it was training gets its parent-death signal, SIGTERM, checkpoints and
    stops, as the docs say, instead of training on, orphaned, into the search's directory. Resumed
    after the grace period (Optuna's cleanup fails the segment as the driver starts), the search
    continues the trial from that checkpoint to its end, charging it no restart: the search was
    killed, not the trial."""
    from hookdet.search.store import attrs_of
    from tests.test_search_run import segments

    environment = dict(env(tmp_path), SEARCH_TEST_SECONDS_PER_BATCH="0.5",
                       HOOKDET_SEARCH_GRACE_SECONDS=str(GRACE_SECONDS))
    # Its first rung at batch 8, 4 s in: on a busy machine the kill's chain (driver, warm process,
    # the segment's parent-death signal) has seconds before a rung would pause the segment anyway.
    options = ("--workers", "1", "--config", "searcher.max_trials=1", "--config", "searcher.max_time=16")
    driver = hookdet_process.start("run", FIXTURES / "asha.yaml", "--run-dir", "search", *options, cwd=tmp_path,
                                   env=environment)
    reports_file = tmp_path / "search" / "trial-001" / "metrics.jsonl"
    wait_on_search(reports_file.exists, driver, "the trial's first report")
    (pid,) = [attrs_of(s)["child_pid"] for s in segments(tmp_path / "search") if s.state.name == "RUNNING"]
    driver.send_signal(signal.SIGKILL)  # the driver alone, as kill -9 PID does
    killed = time.monotonic()
    driver.wait()
    deadline = time.monotonic() + 120
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(pid), "the segment trains on after its driver's SIGKILL"
    assert "hookdet: preempted after " in (tmp_path / "search" / "trial-001.log").read_text()
    while time.monotonic() < killed + GRACE_SECONDS + 1:  # the last beat came before the kill
        time.sleep(0.1)
    resumed = hookdet_process.run("run", FIXTURES / "asha.yaml", "--resume", "search", *options, cwd=tmp_path,
                                  env=dict(environment, SEARCH_TEST_SECONDS_PER_BATCH="0"), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (row,) = summary(tmp_path / "search", drop=())
    assert (row["state"], row["restarts"]) == ("completed", "0")
    assert "resumed from checkpoint" in (tmp_path / "search" / "trial-001.log").read_text()


#: A trial whose module imports ``probe_lib`` (a package on ``PYTHONPATH``, as an editable
#: install is: the warm process preloads it) and draws from NumPy's global generator as it is
#: imported; each trial logs both, and the second waits for the test's word (a file) to go on.
PROBE_TRIAL = '''import json, os, time
import numpy
import probe_lib
from search_trial import LineTrial

DRAWN = int(numpy.random.randint(2**31))
MARK = "as the search started"


class ProbeTrial(LineTrial):
    def __init__(self, context):
        log = os.environ["SEARCH_TEST_LOG"]
        with open(log, "a") as handle:
            handle.write(json.dumps({"event": "probe", "version": probe_lib.VERSION, "drawn": DRAWN, "mark": MARK,
                                     "cwd": os.getcwd()}) + "\\n")
        with open(log) as handle:
            probes = sum('"event": "probe"' in line for line in handle)
        while probes == 2 and not os.path.exists(os.environ["PROBE_GO"]):
            time.sleep(0.01)
        super().__init__(context)
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_segment_runs_the_code_as_it_is_now_and_draws_as_a_new_interpreter(tmp_path: Path) -> None:
    """A grid of three trials on one worker, their module importing a package from ``PYTHONPATH``
    that the warm process preloaded. The package is edited while the second trial trains: the
    third runs the edited code (its segment starts as a new interpreter, and its log says why),
    as a cold search would. The trial's own module, edited in the model directory at the same
    moment, is not: every trial runs the search's snapshot of the model directory, taken as it
    started. Two warm trials' draws from NumPy's global generator at import are not the warm
    process's one draw."""
    model, library = tmp_path / "model", tmp_path / "lib"
    shutil.copytree(FIXTURES, model, ignore=shutil.ignore_patterns("__pycache__", "*.yaml"))
    (model / "probe_trial.py").write_text(PROBE_TRIAL)
    library.mkdir()
    (library / "probe_lib.py").write_text("VERSION = 1\n")
    config = tmp_path / "probe.yaml"
    config.write_text(
        "name: probe\nentrypoint: probe_trial:ProbeTrial\nmax_restarts: 0\n"
        "hyperparameters:\n  global_batch_size: 8\n  optimizer:\n    lr: {type: categorical, vals: [0.01, 0.02, 0.03]}\n"
        "searcher: {name: grid, metric: validation_loss, max_concurrent_trials: 1, max_length: {batches: 2}}\n"
        "min_validation_period: {batches: 2}\n")
    environment = dict(env(tmp_path), PYTHONPATH=f"{library}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                       PROBE_GO=str(tmp_path / "go"))
    driver = hookdet_process.start("run", config, "--run-dir", "search", "--workers", "1", "--model-dir", model,
                                   cwd=tmp_path, env=environment)

    def probes() -> List[Dict[str, Any]]:
        lines = (tmp_path / "trials.log").read_text().splitlines() if (tmp_path / "trials.log").exists() else []
        return [record for record in map(json.loads, lines) if record["event"] == "probe"]

    wait_on_search(lambda: len(probes()) == 2, driver, "the second trial")
    (library / "probe_lib.py").write_text("VERSION = 2  # edited while the search runs\n")
    trial_module = model / "probe_trial.py"
    trial_module.write_text(trial_module.read_text().replace('MARK = "as the search started"', 'MARK = "edited"'))
    (tmp_path / "go").touch()
    _, stderr = driver.communicate(timeout=300)
    assert driver.returncode == 0, stderr[-3000:]
    seen = probes()
    assert [probe["version"] for probe in seen] == [1, 1, 2]
    snapshot = str(tmp_path / "search" / "model")
    assert {(probe["mark"], probe["cwd"]) for probe in seen} == {("as the search started", snapshot)}
    assert seen[0]["drawn"] != seen[1]["drawn"]
    logs = [(tmp_path / "search" / f"trial-00{n}.log").read_text() for n in (1, 2, 3)]
    changed = f"hookdet: warning: {library / 'probe_lib.py'} changed since the warm process imported it"
    assert [changed in log for log in logs] == [False, False, True]
