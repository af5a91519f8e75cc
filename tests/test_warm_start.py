"""Determined's warm start: ``searcher.source_checkpoint_uuid`` starts every trial from a
checkpoint's state (weights, optimizer, LR scheduler, callbacks, RNG) at batch 0, in a run of one
trial, a Trainer-API fit and each trial of a search.

The trial (``OneWeightTrial``) sees the same batch every step, so where in the data a run starts
does not change its arithmetic: a run warm-started from the checkpoint at batch 4 and trained 4
batches must end exactly where one run trained 8 batches straight ends, its halving learning
rate (a StepLR, restored from the checkpoint) included, while counting its own batches from 0.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from hookdet import pytorch
from hookdet.plugin import run_of
from tests.support import hookdet_process
from tests.support.trials import OneWeightTrial, fit

SUPPORT = Path(__file__).parent / "support"
HPARAMS = {"global_batch_size": 4, "lr": 0.1, "records": 16, "scheduler": "STEP_EVERY_BATCH", "gamma": 0.5}


def weights(trial: Any) -> List[float]:
    return [float(metrics["weight"]) for metrics in trial.recorder.batch_metrics]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """The source run (4 batches, checkpointed) and a straight run of 8 batches."""
    root = tmp_path_factory.mktemp("warm")
    source = fit(OneWeightTrial, HPARAMS, root / "source", max_length=pytorch.Batch(4))
    straight = fit(OneWeightTrial, HPARAMS, root / "straight", max_length=pytorch.Batch(8))
    return {"source": source, "source_dir": root / "source", "checkpoint": run_of(source.context).state.latest_checkpoint,
            "straight": weights(straight), "straight_dir": root / "straight"}


def test_a_fit_warm_started_from_a_checkpoint_continues_its_state_from_batch_zero(tmp_path: Path, runs: Dict[str, Any]) -> None:
    warm = fit(OneWeightTrial, HPARAMS, tmp_path / "warm", max_length=pytorch.Batch(4),
               config={"searcher": {"metric": "validation_loss", "source_checkpoint_uuid": runs["checkpoint"]}})
    assert weights(warm) == runs["straight"][4:]  # exactly: the optimizer and scheduler went on
    run = run_of(warm.context)
    assert run.state.batches_trained == 4 and run.first_batch == 0
    reports = [json.loads(line) for line in (tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()]
    assert [r["steps_completed"] for r in reports if r["group"] == "training"] == [4]
    assert json.loads((tmp_path / "warm" / "run.json").read_text())["resumed_from"] is None


def test_resuming_a_warm_started_run_resumes_it_not_the_source(tmp_path: Path, runs: Dict[str, Any]) -> None:
    config = {"searcher": {"metric": "validation_loss", "source_checkpoint_uuid": runs["checkpoint"]}}
    fit(OneWeightTrial, HPARAMS, tmp_path / "warm", max_length=pytorch.Batch(2), config=config)
    resumed = fit(OneWeightTrial, HPARAMS, tmp_path / "warm", max_length=pytorch.Batch(4), config=config,
                  latest_checkpoint=str(tmp_path / "warm"))
    assert weights(resumed) == runs["straight"][6:]


def experiment_file(path: Path, searcher: Dict[str, Any], hyperparameters: Dict[str, Any] = HPARAMS) -> Path:
    path.write_text(yaml.safe_dump({"name": "warm", "entrypoint": "trials:OneWeightTrial",
                                    "hyperparameters": hyperparameters, "searcher": searcher,
                                    "min_validation_period": {"batches": 4}}))
    return path


def hookdet(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(cwd / "cache"))
    return hookdet_process.run(*args, "--model-dir", SUPPORT, cwd=cwd, env=env)


def last_validation(run_dir: Path) -> float:
    reports = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in reports if r["group"] == "validation"][-1]["metrics"]["validation_loss"]


@pytest.mark.slow
def test_hookdet_run_and_each_trial_of_a_search_warm_start_from_the_experiment_file(tmp_path: Path, runs: Dict[str, Any]) -> None:
    searcher = {"name": "single", "metric": "validation_loss", "max_length": {"batches": 4},
                "source_checkpoint_uuid": str(runs["source_dir"])}  # a run directory: its newest checkpoint
    result = hookdet("run", str(experiment_file(tmp_path / "single.yaml", searcher)), "--run-dir", "single", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    straight_end = last_validation(runs["straight_dir"])  # the straight run's at batch 8
    assert last_validation(tmp_path / "single") == straight_end

    space = dict(HPARAMS, records={"type": "categorical", "vals": [8, 16]})  # the same arithmetic either way
    grid = dict(searcher, name="grid", source_checkpoint_uuid=runs["checkpoint"])
    result = hookdet("run", str(experiment_file(tmp_path / "grid.yaml", grid, space)), "--run-dir", "grid", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    trials = sorted((tmp_path / "grid").glob("trial-*/metrics.jsonl"))
    assert len(trials) == 2
    assert [last_validation(path.parent) for path in trials] == [straight_end] * 2


def test_source_trial_id_is_refused_naming_source_checkpoint_uuid(tmp_path: Path) -> None:
    config = experiment_file(tmp_path / "exp.yaml", {"name": "single", "metric": "validation_loss",
                                                     "max_length": {"batches": 4}, "source_trial_id": 12})
    result = hookdet("run", str(config), "--run-dir", "run", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "searcher.source_trial_id" in result.stderr and "source_checkpoint_uuid" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run" / "metrics.jsonl").exists()
