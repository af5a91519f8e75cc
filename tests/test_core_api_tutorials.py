"""Determined's Core API tutorial, stage by stage, under ``hookdet run`` as a user types it.

The stages are Determined 0.38.1's ``examples/tutorials/core_api`` (kept verbatim in
tests/fixtures/determined_core_api with their licence); ``examples/core_api`` holds them with only
the import changed, which the first test checks. Each stage sleeps 0.1 s a batch for 100
batches, so each run takes about 10 s of waiting and little CPU.
"""
from __future__ import annotations

import csv
import json
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from hookdet.search.report import read_search
from hookdet.exit_codes import PREEMPTED_EXIT_CODE
from hookdet.runs.metrics import read_reports
from hookdet.runs.record import read_history, read_record
from tests.support import hookdet_process
from tests.support.s3_fixture import recording, s3_server  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[1]
ORIGINALS = REPO / "tests" / "fixtures" / "determined_core_api"
EXAMPLES = REPO / "examples" / "core_api"

#: What the stages report over 100 batches: training x every 10 batches, one validation at the end.
STAGE_REPORTS = [("training", steps, {"x": steps}) for steps in range(10, 101, 10)] + [("validation", 100, {"x": 100})]


def with_only_the_import_changed(text: str) -> str:
    return (text.replace("\nimport determined as det\n", "\nimport hookdet as det\n")
            .replace('"determined.launch.wrap_rank"', '"hookdet.launch.wrap_rank"'))


def test_the_examples_are_the_tutorial_with_only_the_import_changed() -> None:
    stages = sorted(path.name for path in ORIGINALS.iterdir() if path.suffix in (".py", ".yaml"))
    assert len(stages) == 10
    for name in stages:
        assert (EXAMPLES / name).read_text() == with_only_the_import_changed((ORIGINALS / name).read_text()), name
    assert (EXAMPLES / "LICENSE").read_bytes() == (ORIGINALS / "LICENSE").read_bytes()


@pytest.fixture
def tutorial(tmp_path: Path) -> Path:
    """A copy of examples/core_api to run in (the runs go under it)."""
    return Path(shutil.copytree(EXAMPLES, tmp_path / "core_api"))


@pytest.mark.slow
def test_stage_0_a_script_that_never_calls_hookdet_still_leaves_a_run_record(tutorial: Path) -> None:
    finished = hookdet_process.run("run", "0_start.yaml", "--run-dir", "stage0", cwd=tutorial)
    assert finished.returncode == 0, finished.stderr[-2000:]
    run_dir = tutorial / "stage0"
    record = read_record(run_dir)
    assert (record["state"], record["exit_status"], record["entrypoint"]) == ("completed", 0, "python3 0_start.py")
    assert json.loads((run_dir / "config.json").read_text())["name"] == "core-api-stage-0"
    assert [entry["event"] for entry in read_history(run_dir)] == ["started", "completed"]
    assert f"run directory: {run_dir.resolve()}" in finished.stdout
    assert "x is now 100" in finished.stdout
    logged = hookdet_process.run("logs", "stage0", cwd=tutorial).stdout.splitlines()
    assert [line.split("] ", 3)[-1] for line in logged] == [f"x is now {x}" for x in range(1, 101)]


@pytest.mark.slow
def test_stage_1_metrics_and_progress_reach_the_run(tutorial: Path) -> None:
    finished = hookdet_process.run("run", "1_metrics.yaml", "--run-dir", "stage1", cwd=tutorial)
    assert finished.returncode == 0, finished.stderr[-2000:]
    run_dir = tutorial / "stage1"
    assert [(r["group"], r["steps_completed"], r["metrics"]) for r in read_reports(run_dir)] == STAGE_REPORTS
    record = read_record(run_dir)
    assert (record["state"], record["batches_trained"], record["progress"], record["best_validation"]) == (
        "completed", 100, 1.0, 100)
    assert "hookdet: completed after 100 batches" in finished.stdout
    shown = hookdet_process.run("show", "stage1", cwd=tutorial)  # read like any other run
    assert shown.returncode == 0 and "state: completed" in shown.stdout and "batches: 100" in shown.stdout, shown
    logs = hookdet_process.run("logs", "stage1", cwd=tutorial)
    assert logs.returncode == 0 and "x is now 100" in logs.stdout, logs.stderr[-2000:]


def wait_for_a_checkpoint(run_dir: Path, process: hookdet_process.Hookdet, timeout: float = 120) -> None:
    """Until the run has a complete checkpoint (its metadata.json is in place)."""
    deadline = time.monotonic() + timeout
    while not list((run_dir / "checkpoints").glob("*/metadata.json")):
        assert process.poll() is None, process.output()
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.05)


@pytest.mark.slow
def test_stage_2_stops_at_sigterm_with_a_checkpoint_and_resumes_at_its_batch(tutorial: Path) -> None:
    run_dir = tutorial / "stage2"
    started = hookdet_process.start("run", "2_checkpoints.yaml", "--run-dir", "stage2", cwd=tutorial)
    wait_for_a_checkpoint(run_dir, started)
    started.send_signal(signal.SIGTERM)
    stopped = started.completed(timeout=120)
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.stderr[-2000:]
    record = read_record(run_dir)
    assert record["state"] == "preempted"
    stopped_at, checkpoint = record["batches_trained"], record["latest_checkpoint"]
    assert stopped_at % 10 == 0 and 10 <= stopped_at < 100

    resumed = hookdet_process.run("run", "2_checkpoints.yaml", "--resume", "stage2", cwd=tutorial)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [(r["group"], r["steps_completed"], r["metrics"]) for r in read_reports(run_dir)] == [
        *[row for row in STAGE_REPORTS if row[0] == "training"], ("validation", 100, {"x": 100})]
    printed = [line for line in resumed.stderr.splitlines() if "x is now" in line]
    assert len(printed) == 100 - stopped_at and printed[0].endswith(f"x is now {stopped_at + 1}")
    history = read_history(run_dir)
    assert [entry["event"] for entry in history] == ["started", "preempted", "resumed", "completed"]
    assert history[2]["resumed_from"] == checkpoint  # info.latest_checkpoint: the id of the newest checkpoint
    assert read_record(run_dir)["state"] == "completed"


@pytest.mark.slow
def test_stage_4_workers_the_script_starts_itself_agree_through_their_own_contexts(tutorial: Path) -> None:
    """The stage's launcher starts one worker per slot (two here, of the file's eight, to spare
    the suite's CPUs: the note has the eight-slot run), each through hookdet.launch.wrap_rank
    and with a DistributedContext it builds itself; x grows by every worker's increment."""
    finished = hookdet_process.run("run", "4_distributed.yaml", "--slots", "2", "--run-dir", "stage4", cwd=tutorial)
    assert finished.returncode == 0, finished.stderr[-3000:]
    run_dir = tutorial / "stage4"
    increment = json.loads((run_dir / "config.json").read_text())["hyperparameters"]["increment_by"]
    reports = [(r["group"], r["steps_completed"], r["metrics"]) for r in read_reports(run_dir)]
    assert reports[-2:] == [("training", 100, {"x": 100 * 2 * increment}), ("validation", 100, {"x": 100 * 2 * increment})]
    assert sorted(path.name for path in (run_dir / "logs").iterdir()) == ["rank-0.log", "rank-1.log"]
    assert "[rank=1] " in finished.stdout + finished.stderr and "[rank=0] " in finished.stdout + finished.stderr
    assert read_record(run_dir)["state"] == "completed"


MNIST = REPO / "tests" / "fixtures" / "determined_core_api_mnist"
TORCHVISION_STANDIN = REPO / "tests" / "fixtures" / "torchvision_standin"


@pytest.fixture
def mnist_tutorial(tmp_path: Path) -> Path:
    """Determined's Core API MNIST steps, only the import changed, in a folder of their own."""
    folder = tmp_path / "mnist"
    folder.mkdir()
    for original in MNIST.iterdir():
        if original.suffix in (".py", ".yaml"):
            (folder / original.name).write_text(with_only_the_import_changed(original.read_text()))
    return folder


def run_mnist(folder: Path, *args: str) -> "hookdet_process.subprocess.CompletedProcess":
    import os

    env = dict(os.environ, PYTHONPATH=str(TORCHVISION_STANDIN))
    return hookdet_process.run("run", *args, cwd=folder, env=env)


@pytest.mark.slow
def test_mnist_steps_run_unchanged_but_the_import(mnist_tutorial: Path) -> None:
    """The plain script (no Determined in it), then the metrics step: one epoch each."""
    plain = run_mnist(mnist_tutorial, "const.yaml", "--config", "entrypoint=python3 model_def.py --epochs 1",
                      "--run-dir", "const")
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "Test set: Average loss" in plain.stdout and read_record(mnist_tutorial / "const")["state"] == "completed"
    metrics = run_mnist(mnist_tutorial, "metrics.yaml", "--config", "entrypoint=python3 model_def_metrics.py --epochs 1",
                        "--run-dir", "metrics")
    assert metrics.returncode == 0, metrics.stderr[-3000:]
    (validation,) = [r for r in read_reports(mnist_tutorial / "metrics") if r["group"] == "validation"]
    assert validation["steps_completed"] == 23 and 0 < validation["metrics"]["test_loss"] < 3


@pytest.mark.slow
def test_mnist_checkpoints_step_resumes_from_its_latest_checkpoint(mnist_tutorial: Path) -> None:
    first = run_mnist(mnist_tutorial, "checkpoints.yaml", "--config",
                      "entrypoint=python3 model_def_checkpoints.py --epochs 1", "--run-dir", "ckpt")
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = mnist_tutorial / "ckpt"
    checkpoint = read_record(run_dir)["latest_checkpoint"]
    resumed = run_mnist(mnist_tutorial, "checkpoints.yaml", "--config",
                        "entrypoint=python3 model_def_checkpoints.py --epochs 2", "--resume", "ckpt")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("Test set: Average loss") == 1  # epoch 2 only: epoch 1 came from the checkpoint
    assert [r["steps_completed"] for r in read_reports(run_dir) if r["group"] == "validation"] == [23, 46]
    assert read_history(run_dir)[2]["resumed_from"] == checkpoint


@pytest.mark.slow
def test_mnist_adaptive_step_searches_on_the_epochs_it_reports(mnist_tutorial: Path) -> None:
    """The tutorial's adaptive ASHA search, made small (4 trials, 4 epochs, where the file says 50
    and 20): the searcher decides on the ``epochs`` the script reports beside ``test_loss``
    (``time_metric: epochs``), and stops some trials at the first rung; the others train to the end."""
    search = run_mnist(mnist_tutorial, "adaptive.yaml", "--workers", "2", "--run-dir", "search",
                       "--config", "searcher.max_trials=4", "--config", "searcher.max_time=4",
                       "--config", "entrypoint=python3 model_def_adaptive.py --epochs 4")
    assert search.returncode == 0, search.stderr[-3000:]
    rows = list(csv.DictReader(open(mnist_tutorial / "search" / "summary.csv")))
    assert len(rows) == 4 and {row["state"] for row in rows} <= {"completed", "stopped"}
    assert "stopped" in {row["state"] for row in rows}
    for row in rows:
        epochs = [r["metrics"]["epochs"] for r in read_reports(mnist_tutorial / "search" / f"trial-{int(row['trial']):03d}")
                  if r["group"] == "validation"]
        assert epochs == list(range(1, len(epochs) + 1))
        # A stopped trial ends at its next check after the rung (or trained to the end first, on a busy machine).
        assert len(epochs) == 4 if row["state"] == "completed" else 1 <= len(epochs) <= 4, (row, epochs)


@pytest.mark.slow
def test_stage_3_asha_stops_the_trials_determineds_rule_stops_while_they_train(tutorial: Path) -> None:
    """The tutorial's adaptive ASHA search (10 trials, time_metric batches, max_time 100): each
    trial is one process that never pauses; at the first validation at or past a rung the search
    decides, and a trial it stops sees should_preempt() and ends stopped. The stops are those of
    Determined's stop-once rule for the values the scripts reported (x = batches * increment_by),
    taken in the trials' order: the n-th trial at a rung goes on only within the best
    max(n // divisor, 1) so far."""
    finished = hookdet_process.run("run", "3_hpsearch.yaml", "--workers", "3", "--run-dir", "search", cwd=tutorial)
    assert finished.returncode == 0, finished.stderr[-3000:]
    state = read_search(tutorial / "search")[1]
    trials = [state["trials"][request] for request in state["order"]]
    assert len(trials) == 10
    first_rung = state["method"]["brackets"][0]["rungs"][0]["units"]
    at_rung, expected_stopped = [], set()
    for trial in (t for t in trials if t["bracket"] == 0):  # Determined's rule, by hand
        steps = next(s for s in range(10, 101, 10) if s >= first_rung)
        value = steps * trial["hparams"]["increment_by"]
        at_rung.append(value)
        keep = max(len(at_rung) // 4, 1)  # adaptive_asha's default divisor
        if sorted(at_rung).index(value) >= keep:  # inserted before an equal value, as Go's sort.Search
            expected_stopped.add(trial["number"])
    stopped = {trial["number"] for trial in trials if trial["state"] == "stopped"}
    assert stopped == expected_stopped and stopped, (stopped, expected_stopped)
    for trial in trials:
        record = read_record(Path(trial["dir"]))
        if trial["number"] in stopped:  # stopped in its own process at its next check past the rung, unless
            # it had trained to its end first (its rung was decided after earlier trials': a busy machine)
            assert (record["state"] == "stopped" and first_rung <= record["batches_trained"] < 100) or (
                record["state"], record["batches_trained"]) == ("completed", 100), record
        else:
            assert (trial["state"], record["state"], record["batches_trained"]) == ("completed", "completed", 100)
        history = read_history(Path(trial["dir"]))
        assert [entry["event"] for entry in history][:1] == ["started"] and len(history) == 2  # never paused


EXACT = REPO / "tests" / "fixtures" / "core_api_exact"


def final_weights(run_dir: Path) -> Dict[str, Any]:
    import torch

    latest = read_record(run_dir)["latest_checkpoint"]
    return torch.load(run_dir / "checkpoints" / latest / "state.pt")["model"]


@pytest.mark.slow
def test_a_core_api_trial_stopped_by_sigterm_and_resumed_ends_bit_for_bit_as_one_never_stopped(
        tmp_path: Path) -> None:
    """The script checkpoints its model, optimizer, RNGs and data position with store_path; SIGTERM
    mid-run (should_preempt() then returns), ``--resume RUN_DIR``: the final weights are equal to an
    uninterrupted run's (torch.equal) and metrics.jsonl holds the same rows, value for value."""
    import torch

    folder = Path(shutil.copytree(EXACT, tmp_path / "exact"))
    whole = hookdet_process.run("run", "const.yaml", "--run-dir", "whole", cwd=folder)
    assert whole.returncode == 0, whole.stderr[-3000:]
    slow = ["--config", "hyperparameters.seconds_per_batch=0.05"]
    started = hookdet_process.start("run", "const.yaml", *slow, "--run-dir", "stopped", cwd=folder)
    wait_for_a_checkpoint(folder / "stopped", started)
    started.send_signal(signal.SIGTERM)
    assert started.completed(timeout=120).returncode == PREEMPTED_EXIT_CODE
    assert read_record(folder / "stopped")["batches_trained"] < 40
    resumed = hookdet_process.run("run", "const.yaml", *slow, "--resume", "stopped", cwd=folder)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = final_weights(folder / "whole"), final_weights(folder / "stopped")
    assert expected.keys() == got.keys() and all(torch.equal(expected[name], got[name]) for name in expected)
    rows = [[(r["group"], r["steps_completed"], r["metrics"]) for r in read_reports(folder / run)]
            for run in ("whole", "stopped")]
    assert rows[0] == rows[1] and len(rows[0]) == 15


@pytest.mark.slow
def test_a_resume_from_s3_fetches_the_newest_checkpoint_once(tmp_path: Path, s3_server: Dict[str, str]) -> None:  # noqa: F811
    """``--resume RUN_DIR`` of a script whose checkpoints are in S3: ``hookdet run`` fetches the
    newest to verify it and hands that download to the script, whose ``restore_path`` takes it
    (its state file is fetched once, not once to verify and again to restore)."""
    folder = Path(shutil.copytree(EXACT, tmp_path / "exact"))
    storage = {"type": "s3", "bucket": s3_server["bucket"], "endpoint_url": s3_server["endpoint_url"], "prefix": "core"}
    config = yaml.safe_load((folder / "const.yaml").read_text())
    (folder / "s3.yaml").write_text(yaml.safe_dump(dict(config, checkpoint_storage=dict(storage, save_trial_latest=10))))
    first = hookdet_process.run("run", "s3.yaml", "--run-dir", "run", cwd=folder)
    assert first.returncode == 0, first.stderr[-3000:]
    assert not (folder / "run" / "checkpoints").exists()
    with recording(s3_server["endpoint_url"]) as requests_made:
        resumed = hookdet_process.run("run", "s3.yaml", "--resume", "run", cwd=folder)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    gets = [url.split("?")[0] for method, url in requests_made if method == "GET" and "/core/" in url]
    assert len([url for url in gets if url.endswith("/state.pt")]) == 1, requests_made
    assert [entry["event"] for entry in read_history(folder / "run")] == ["started", "completed", "resumed", "completed"]


def rows_of(run_dir: Path) -> list:
    return [(r["group"], r["steps_completed"], r["metrics"]) for r in read_reports(run_dir)]


def wait_for_a_validation(run_dir: Path, steps: int, process: Any, timeout: float = 300) -> None:
    """Until the run has reported its validation at ``steps``."""
    deadline = time.monotonic() + timeout
    while (("validation", steps) not in [row[:2] for row in rows_of(run_dir)] if (run_dir / "metrics.jsonl").exists()
           else True):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.05)


@pytest.mark.slow
def test_a_core_api_trial_continued_past_its_rung_and_stopped_with_its_search_resumes_bit_for_bit(
        tmp_path: Path) -> None:
    """An adaptive ASHA search of the exact script (3 trials, rungs at 20 and 40 batches): the first
    trial at the rung goes on in its process; SIGTERM to the search once it has passed the rung
    (its validation at 24): the trial checkpoints and the search exits 75; ``--resume`` continues the
    trial from that checkpoint in the search. Its final weights are torch.equal to an uninterrupted
    search's first trial, its metrics.jsonl rows equal; the trials the search stopped (at their next
    check after the rung, when that came depends on timing) reported the same rows as far as both went."""
    import torch

    folder = Path(shutil.copytree(EXACT, tmp_path / "exact"))
    whole = hookdet_process.run("run", "asha.yaml", "--workers", "1", "--run-dir", "whole", cwd=folder)
    assert whole.returncode == 0, whole.stderr[-3000:]
    import os

    slow = dict(os.environ, EXACT_SECONDS_PER_BATCH="0.2")  # until the stop; the resume trains at full speed
    search = hookdet_process.start("run", "asha.yaml", "--workers", "1", "--run-dir", "killed", cwd=folder, env=slow)
    wait_for_a_validation(folder / "killed" / "trial-001", 24, search)
    search.send_signal(signal.SIGTERM)
    assert search.completed(timeout=300).returncode == PREEMPTED_EXIT_CODE
    trial = folder / "killed" / "trial-001"
    assert [entry["event"] for entry in read_history(trial)] == ["started", "preempted"]
    assert 24 <= read_record(trial)["batches_trained"] < 40
    resumed = hookdet_process.run("run", "asha.yaml", "--workers", "1", "--resume", "killed", cwd=folder)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [entry["event"] for entry in read_history(trial)] == ["started", "preempted", "resumed", "completed"]
    expected, got = final_weights(folder / "whole" / "trial-001"), final_weights(trial)
    assert expected.keys() == got.keys() and all(torch.equal(expected[name], got[name]) for name in expected)
    assert rows_of(folder / "whole" / "trial-001") == rows_of(trial) and len(rows_of(trial)) == 15
    for number in ("002", "003"):
        uninterrupted, interrupted = (rows_of(folder / run / f"trial-{number}") for run in ("whole", "killed"))
        both = min(len(uninterrupted), len(interrupted))
        assert both >= 9 and uninterrupted[:both] == interrupted[:both]  # past the rung's validation at 24
    states = {row["trial"]: row["state"] for row in csv.DictReader(open(folder / "killed" / "summary.csv"))}
    assert states == {"1": "completed", "2": "stopped", "3": "stopped"}


@pytest.mark.slow
def test_sharded_checkpoints_on_two_ranks_merge_their_files_and_refuse_conflicts(tmp_path: Path) -> None:
    """Under the torch_distributed launch layer (two ranks, gloo): every rank stores its own file
    with store_path(shard=True) into one checkpoint, their metadata merged; a file both ranks
    write refuses the checkpoint on both, naming the ranks, and leaves nothing in the storage."""
    folder = Path(shutil.copytree(EXACT, tmp_path / "exact"))
    finished = hookdet_process.run("run", "sharded.yaml", "--run-dir", "run", cwd=folder)
    assert finished.returncode == 0, finished.stderr[-3000:]
    (line,) = [line for line in finished.stdout.splitlines() if "SHARDED " in line]
    seen = json.loads(line.split("SHARDED ", 1)[1])
    conflict = "refusing to store a sharded checkpoint with conflicts: same.txt written by ranks [0, 1]"
    assert seen == {"files": ["metadata.json", "rank-0.txt", "rank-1.txt"], "refused": conflict,
                    "metadata": {"steps_completed": 1, "written_by_rank_1": True}}
    assert f'RANK1 {{"refused": "{conflict}"}}' in finished.stdout
    assert len(list((folder / "run" / "checkpoints").iterdir())) == 1


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="the script calls init_process_group('nccl'): CUDA only")
def test_mnist_distributed_step_trains_over_nccl_under_the_torch_distributed_launch_layer(mnist_tutorial: Path) -> None:
    """The distributed step as the file says (torch_distributed, nccl, DDP on each rank's GPU),
    with the slots this machine has GPUs for, one epoch: its ranks report as one run."""
    import torch

    slots = min(torch.cuda.device_count(), 4)
    run = run_mnist(mnist_tutorial, "distributed.yaml", "--config", f"resources.slots_per_trial={slots}",
                    "--config", "entrypoint=python3 -m determined.launch.torch_distributed "
                    "python3 model_def_distributed.py --epochs 1", "--run-dir", "distributed")
    assert run.returncode == 0, run.stderr[-3000:]
    validations = [r for r in read_reports(mnist_tutorial / "distributed") if r["group"] == "validation"]
    assert len(validations) == 1 and 0 < validations[0]["metrics"]["test_loss"] < 3
