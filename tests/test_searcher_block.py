"""The searcher block as Determined 0.38 reads it, through the commands a user types: ``hookdet
run``, ``hookdet run --resume SEARCH_DIR`` and ``hookdet search preview`` (real drivers and trial
processes). A ``null`` is "not set"; what Determined refuses is refused in one line naming the
field; a search resumes only with the experiment it was started with."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import List

import pytest
import yaml

from tests.support import hookdet_process
from tests.test_search_run import FIXTURES, env, not_warnings, summary

pytest.importorskip("optuna")


def hookdet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return hookdet_process.run(*args, cwd=tmp_path, env=env(tmp_path))


def experiment(tmp_path: Path, file: str, searcher: dict, **fields: object) -> Path:
    """An experiment file of the line-fitting search trial with this ``searcher`` block."""
    path = tmp_path / file
    path.write_text(yaml.safe_dump({
        "name": "line", "entrypoint": "search_trial:LineTrial",
        "hyperparameters": {"global_batch_size": 8,
                            "optimizer": {"lr": {"type": "categorical", "vals": [0.3, 0.01]}}},
        "min_validation_period": {"batches": 2}, "searcher": searcher, **fields}))
    return path


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The one line a refusal prints (warnings aside), with no traceback."""
    lines: List[str] = not_warnings(result.stderr)
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


GRID = {"name": "grid", "metric": "validation_loss", "max_length": {"batches": 2}}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_null_is_not_set_so_a_search_minimises_and_takes_determineds_defaults(tmp_path: Path) -> None:
    """``smaller_is_better: null`` is Determined's default (smaller is better): the search
    minimises, its best trial is the lowest loss; ``max_concurrent_trials: null`` and
    ``max_restarts: null`` are their defaults too. The same through preview and --resume."""
    config = experiment(tmp_path, "nulls.yaml", {**GRID, "smaller_is_better": None,
                                                 "max_concurrent_trials": None}, max_restarts=None)
    preview = hookdet(tmp_path, "search", "preview", str(config))
    assert preview.returncode == 0, preview.stderr
    assert "(smaller is better)" in preview.stdout
    ran = hookdet(tmp_path, "run", str(config), "--run-dir", "nulls", "--model-dir", str(FIXTURES))
    assert ran.returncode == 0, ran.stderr[-3000:]
    rows = summary(tmp_path / "nulls")
    lowest = min(rows, key=lambda row: float(row["best"]))
    assert max(float(row["best"]) for row in rows) > float(lowest["best"])  # the trials differ
    assert f"best: trial {lowest['trial']} (completed)" in ran.stdout
    assert json.loads((tmp_path / "nulls" / "search.json").read_text())["smaller_is_better"] is True
    resumed = hookdet(tmp_path, "run", str(config), "--resume", "nulls", "--model-dir", str(FIXTURES))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"best: trial {lowest['trial']} (completed)" in resumed.stdout


def test_asha_fields_set_to_null_take_determineds_defaults(tmp_path: Path) -> None:
    """``divisor: null``, ``max_rungs: null`` and ``mode: null`` preview exactly as the same
    block without them (divisor 4, 5 rungs at most, standard mode)."""
    asha = {"name": "adaptive_asha", "metric": "validation_loss", "max_trials": 16,
            "time_metric": "batches", "max_time": 256}
    plain = hookdet(tmp_path, "search", "preview", str(experiment(tmp_path, "plain.yaml", asha)))
    nulls = hookdet(tmp_path, "search", "preview", str(experiment(
        tmp_path, "nulls.yaml", {**asha, "divisor": None, "max_rungs": None, "mode": None})))
    assert plain.returncode == 0 and nulls.returncode == 0, plain.stderr + nulls.stderr
    assert nulls.stdout.replace("nulls.yaml", "plain.yaml") == plain.stdout
    assert "rungs at [16, 64, 256] batches" in plain.stdout


@pytest.mark.parametrize("searcher, expected", [
    ({"name": "adaptive_asha", "metric": "validation_loss", "max_trials": 4, "time_metric": "batches",
      "max_time": 8, "bracket_rungs": ["2", "3"]},
     "searcher.bracket_rungs must be a list of whole numbers of rungs (at least 1 each), one per "
     "bracket, e.g. [3, 2]; got ['2', '3']"),
    ({"metric": "validation_loss", "max_trials": 2, "max_length": {"batches": 4}},
     "searcher.name is required (as Determined requires it)"),
    ({"name": "random", "metric": "validation_loss", "max_trials": 2, "max_length": 100},
     "searcher.max_length: a bare number has no unit: write {batches: 100}, {epochs: 100} or "
     "{records: 100}"),
])
def test_what_determined_refuses_is_one_line_naming_the_field(tmp_path: Path, searcher: dict,
                                                             expected: str) -> None:
    config = experiment(tmp_path, "bad.yaml", searcher)
    for command in (["run", str(config), "--run-dir", "bad"], ["search", "preview", str(config)]):
        line = one_error_line(hookdet(tmp_path, *command))
        assert line.startswith("hookdet: error: ") and expected in line, line
    assert not (tmp_path / "bad").exists()  # refused before anything was made


def test_a_searcher_field_of_the_wrong_type_is_refused_at_its_line(tmp_path: Path) -> None:
    """``max_trials: four`` names the file's line, as every other field error does; the same
    value from ``--config`` names no line (the file's line holds another value)."""
    config = experiment(tmp_path, "four.yaml", {"name": "random", "metric": "validation_loss",
                                                "max_trials": "four", "max_length": {"batches": 4}})
    line_no = next(number for number, text in enumerate(config.read_text().splitlines(), 1)
                   if "max_trials" in text)
    for command in (["run", str(config), "--run-dir", "bad"], ["search", "preview", str(config)]):
        line = one_error_line(hookdet(tmp_path, *command))
        assert line == (f"hookdet: error: {config}:{line_no}: searcher.max_trials must be a whole "
                        "number of at least 1; got 'four'"), line
    overridden = experiment(tmp_path, "two.yaml", {"name": "random", "metric": "validation_loss",
                                                   "max_trials": 2, "max_length": {"batches": 4}})
    line = one_error_line(hookdet(tmp_path, "search", "preview", str(overridden),
                                  "--config", "searcher.max_trials=four"))
    assert line.startswith(f"hookdet: error: {overridden}: searcher.max_trials"), line


def test_a_single_run_refuses_a_bare_max_length_too(tmp_path: Path) -> None:
    config = experiment(tmp_path, "single.yaml", {"name": "single", "metric": "validation_loss",
                                                  "max_length": 8})
    line = one_error_line(hookdet(tmp_path, "run", str(config), "--run-dir", "run", "--model-dir", str(FIXTURES)))
    assert "single.yaml:" in line and "searcher.max_length: a bare number has no unit" in line


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_search_resumes_only_with_the_experiment_it_started_with(tmp_path: Path) -> None:
    """Another experiment file, or the same without the ``--config`` options the search started
    with, is refused in one line naming the field that differs; the search is untouched and
    resumes with what it started with."""
    config = experiment(tmp_path, "grid.yaml", GRID)
    options = ("--config", "hyperparameters.global_batch_size=4")
    started = hookdet(tmp_path, "run", str(config), "--run-dir", "grid", "--model-dir", str(FIXTURES), *options)
    assert started.returncode == 0, started.stderr[-3000:]
    meta_before = (tmp_path / "grid" / "search.json").read_text()
    other = experiment(tmp_path, "other.yaml", {"name": "adaptive_asha", "metric": "validation_loss",
                                                "max_trials": 2, "time_metric": "batches", "max_time": 4})
    line = one_error_line(hookdet(tmp_path, "run", str(other), "--resume", "grid", "--model-dir", str(FIXTURES), *options))
    assert "cannot resume search" in line and "more field(s)" in line
    assert "searcher.max_length.batches is null here but was 2 when the search started" in line
    line = one_error_line(hookdet(tmp_path, "run", str(config), "--resume", "grid", "--model-dir", str(FIXTURES)))
    assert "hyperparameters.global_batch_size is 8 here but was 4 when the search started" in line
    assert (tmp_path / "grid" / "search.json").read_text() == meta_before
    again = hookdet(tmp_path, "run", str(config), "--resume", "grid", "--model-dir", str(FIXTURES), *options)
    assert again.returncode == 0, again.stderr[-3000:]


def test_a_warm_start_source_that_names_no_checkpoint_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """Determined refuses the experiment at creation; hookdet started every trial, each failing
    and retried ``max_restarts`` times."""
    config = experiment(tmp_path, "warm.yaml", {**GRID, "source_checkpoint_uuid": "no-such-checkpoint"})
    line = one_error_line(hookdet(tmp_path, "run", str(config), "--run-dir", "warm", "--model-dir", str(FIXTURES)))
    assert "searcher.source_checkpoint_uuid 'no-such-checkpoint' names no checkpoint" in line
    assert not (tmp_path / "warm").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_segment_that_hookdet_run_refuses_is_not_retried(tmp_path: Path) -> None:
    """A usage error (here a warm-start source that is a file, not a checkpoint) fails the same
    way every time: each trial errors at its first start, with the refusal in the driver's
    output, instead of being retried ``max_restarts`` times."""
    config = experiment(tmp_path, "warm.yaml", {**GRID, "source_checkpoint_uuid": "search_trial.py"},
                        max_restarts=5)
    result = hookdet(tmp_path, "run", str(config), "--run-dir", "warm", "--model-dir", str(FIXTURES))
    assert result.returncode == 1, result.stderr[-3000:]  # every trial errored
    rows = summary(tmp_path / "warm", drop=())
    assert [(row["state"], row["restarts"]) for row in rows] == [("errored", "0"), ("errored", "0")]
    for row in rows:
        log = (tmp_path / "warm" / f"trial-{int(row['trial']):03d}.log").read_text()
        assert log.count("hookdet: error: search_trial.py is a file") == 1  # started once
        assert (f"trial {row['trial']}: search_trial.py is a file; give a checkpoint directory or a run "
                "directory (a usage error: not retried") in result.stderr


def tree_digest(root: Path) -> dict:
    """Every file under ``root`` with its size and contents' digest."""
    import hashlib

    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file() and not path.name.endswith("-lock")}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_copied_search_directory_resumes_on_its_own_store_and_trials(tmp_path: Path) -> None:
    """A search stopped (SIGTERM) while its second trial trains, copied elsewhere, and the copy
    resumed to the end: the copy uses its own store and trial directories (its trials resume
    from their own checkpoints) and leaves the original byte for byte as it was."""
    import shutil
    import signal
    import time

    config = experiment(tmp_path, "grid.yaml", {**GRID, "max_length": {"batches": 6},
                                                "max_concurrent_trials": 1})
    slow = dict(env(tmp_path), SEARCH_TEST_SECONDS_PER_BATCH="0.3")
    driver = hookdet_process.start("run", config, "--run-dir", "original", "--model-dir", FIXTURES, cwd=tmp_path, env=slow)
    checkpoints = tmp_path / "original" / "trial-002" / "checkpoints"
    deadline = time.time() + 120
    while not list(checkpoints.glob("*/metadata.json")) and time.time() < deadline and driver.poll() is None:
        time.sleep(0.05)  # trial 2 has checkpointed once (at batch 2): stop it mid-way
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=120) == 75, driver.communicate()[1][-3000:]
    shutil.copytree(tmp_path / "original", tmp_path / "copy")
    before = tree_digest(tmp_path / "original")
    # The state records trial directories relative to the search: read in the copy, they are the copy's.
    from hookdet.search.report import read_search

    raw = json.loads((tmp_path / "copy" / "search-state.json").read_text())
    assert sorted(trial["dir"] for trial in raw["trials"].values()) == ["trial-001", "trial-002"]
    assert all(Path(trial["dir"]).parent == tmp_path / "copy" for trial in read_search(tmp_path / "copy")[1]["trials"].values())

    resumed = hookdet(tmp_path, "run", str(config), "--resume", "copy", "--model-dir", str(FIXTURES))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert tree_digest(tmp_path / "original") == before
    meta = json.loads((tmp_path / "copy" / "search.json").read_text())
    assert meta["storage"] == f"sqlite:///{(tmp_path / 'copy' / 'search.db').resolve()}"
    assert [row["state"] for row in summary(tmp_path / "copy")] == ["completed", "completed"]
    log = (tmp_path / "copy" / "trial-002.log").read_text()
    assert f"resumed from checkpoint {(tmp_path / 'copy' / 'trial-002' / 'checkpoints').resolve()}/" in log, log[-2000:]


@pytest.mark.parametrize("period, warned", [(None, "trials validate only at their end (no min_validation_period)"),
                                            ({"batches": 16}, "trials validate every 16 batches (min_validation_period)"),
                                            ({"batches": 4}, None)])
def test_an_asha_whose_rungs_can_only_be_decided_at_the_end_is_warned_about(tmp_path: Path, period: object,
                                                                             warned: object) -> None:
    """A legacy ASHA file converted to time_metric/max_time whose trials validate only at the
    end stops nothing: said once, by preview and by the search, naming the fix."""
    asha = {"name": "adaptive_asha", "metric": "validation_loss", "max_trials": 4, "divisor": 2,
            "max_rungs": 3, "time_metric": "batches", "max_time": 16}
    path = experiment(tmp_path, "asha.yaml", asha)
    data = yaml.safe_load(path.read_text())
    data.pop("min_validation_period")
    if period is not None:
        data["min_validation_period"] = period
    path.write_text(yaml.safe_dump(data))
    preview = hookdet(tmp_path, "search", "preview", str(path))
    assert preview.returncode == 0, preview.stderr
    said = [line for line in preview.stderr.splitlines() if "no rung can be decided" in line]
    if warned is None:
        assert said == []
    else:
        assert said == [f"hookdet: warning: {path}: searcher: no rung can be decided before a trial's end, "
                        f"so no trial stops early: {warned}, and a rung is decided at the first validation "
                        "at or past it (rungs at [4, 8] batches); set min_validation_period to at most "
                        "{batches: 4}"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_searcher_metric_no_validation_reports_stops_each_trial_at_its_first_validation(tmp_path: Path) -> None:
    """``metric: validation_los`` (the trial reports ``validation_loss``): each trial stops at
    its first validation, naming what it reported and the closest name, and is not retried."""
    config = experiment(tmp_path, "typo.yaml", {**GRID, "metric": "validation_los"}, max_restarts=5)
    result = hookdet(tmp_path, "run", str(config), "--run-dir", "typo", "--model-dir", str(FIXTURES))
    assert result.returncode == 1, result.stderr[-3000:]
    rows = summary(tmp_path / "typo", drop=())
    assert [(row["state"], row["restarts"]) for row in rows] == [("errored", "0"), ("errored", "0")]
    assert result.stderr.count("searcher.metric 'validation_los' is not among the validation metrics the "
                               "trial reported (validation_loss); did you mean 'validation_loss'?") == 2
