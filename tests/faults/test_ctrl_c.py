"""Ctrl-C at any moment of ``hookdet run`` stops the run: before training, one line and 130;
once training has begun, a checkpoint and 75.

Each case starts ``hookdet run`` the way a shell script's background job is started (SIGINT
ignored, which the job inherits) and sends SIGINT to it alone, as ``kill -INT`` does: hookdet
takes Ctrl-C from its first moment and passes it on to what it launches, so neither it nor a
script it started can go on training after the user asked it to stop.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.faults.harness import REPO, TESTS, child_env, finish, wait_until
from tests.support import hookdet_process
from tests.faults.harness import write_config as write_regression_config

SCRIPT_FIXTURE = REPO / "tests" / "fixtures" / "trainer_script"

#: Put before the script's imports: a stand-in for a script that is still importing (torch, its
#: data) when Ctrl-C comes, with a marker saying it got there.
SLOW_IMPORT = '''import os, pathlib, time
if os.environ.get("IMPORT_MARKER"):
    pathlib.Path(os.environ["IMPORT_MARKER"]).touch()
    time.sleep(120)
'''


def start_ignoring_ctrl_c(args: list, cwd: Path, **env: str) -> hookdet_process.Hookdet:
    """``hookdet ARGS`` as a background job of a shell script: SIGINT ignored on entry (what a
    new interpreter inherits: cold)."""
    return hookdet_process.start(*args, cwd=cwd, env=child_env(**env),
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def script_experiment(tmp_path: Path) -> Path:
    """The Trainer-API script fixture, 400 epochs of slow batches, that can stop in its imports."""
    model_dir = tmp_path / "model"
    shutil.copytree(SCRIPT_FIXTURE, model_dir)
    script = model_dir / "train.py"
    script.write_text(SLOW_IMPORT + script.read_text())
    config = yaml.safe_load((model_dir / "const.yaml").read_text())
    config["entrypoint"] = "python3 train.py --epochs 400"
    config["hyperparameters"]["seconds_per_batch"] = 0.02
    (model_dir / "const.yaml").write_text(yaml.safe_dump(config))
    return model_dir / "const.yaml"


def trained_records(run_dir: Path) -> list:
    metrics = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


def test_ctrl_c_while_a_script_is_still_importing_stops_it_in_one_line(tmp_path: Path) -> None:
    config = script_experiment(tmp_path)
    marker, run_dir = tmp_path / "importing", tmp_path / "run"
    process = start_ignoring_ctrl_c(["run", str(config), "--run-dir", str(run_dir)], config.parent,
                                    IMPORT_MARKER=str(marker))
    wait_until(marker.exists, process, "the script's imports")
    process.send_signal(signal.SIGINT)
    status, stdout, stderr = finish(process, "Ctrl-C in a script's imports", since=time.monotonic(), timeout=120)
    assert status == 128 + signal.SIGINT, stderr[-4000:]
    assert "entrypoint interrupted (Ctrl-C) before it could checkpoint: exit status 130" in stdout, stdout
    assert trained_records(run_dir) == []


@pytest.mark.slow
def test_ctrl_c_once_a_script_trains_stops_it_with_a_checkpoint(tmp_path: Path) -> None:
    config = script_experiment(tmp_path)
    run_dir = tmp_path / "run"
    process = start_ignoring_ctrl_c(["run", str(config), "--run-dir", str(run_dir)], config.parent)
    wait_until(lambda: trained_records(run_dir), process, "the script's first report")
    process.send_signal(signal.SIGINT)
    status, stdout, stderr = finish(process, "Ctrl-C while a script trains", since=time.monotonic(), timeout=120)
    assert status == 75, stderr[-4000:]
    assert "hookdet: preempted after" in stdout and "latest checkpoint: " in stdout, stdout
    batches = int(stdout.split("preempted after ")[1].split()[0])
    assert batches < 400 * 8  # stopped long before the end


@pytest.mark.slow
def test_ctrl_c_while_a_trial_class_is_built_stops_with_a_checkpoint(tmp_path: Path) -> None:
    """The trial's ``__init__`` sleeps 5 s (the preemption plugin does not cut a user's code
    short): the run then stops before its first batch, with a checkpoint to resume from."""
    marker = tmp_path / "building"
    config = write_regression_config(
        tmp_path / "exp.yaml", {"init_marker": str(marker), "init_sleep": 5},
        searcher={"name": "single", "metric": "validation_loss", "max_length": {"batches": 2000}})
    process = start_ignoring_ctrl_c(["run", str(config), "--run-dir", str(tmp_path / "run"),
                                     "--model-dir", str(TESTS)], REPO)
    wait_until(marker.exists, process, "the trial's __init__")
    process.send_signal(signal.SIGINT)
    status, stdout, stderr = finish(process, "Ctrl-C in __init__, SIGINT ignored on entry", since=time.monotonic())
    assert status == 75, stderr[-4000:]
    assert "hookdet: preempted after 0 batches" in stdout, stdout
    assert os.listdir(tmp_path / "run" / "checkpoints"), "no checkpoint was written"
