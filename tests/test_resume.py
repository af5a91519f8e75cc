"""Resume is exact: stop at batch k, resume in a new process, and get the same bits.

Each scenario trains N batches straight through in this process, then trains again asking the
trial to stop after batch k (``context.set_stop_requested``), for several k: in the middle of
an epoch and of a reporting workload, exactly at an epoch end, and right after a validation.
Each stopped run is resumed in a *fresh Python process* (``python -m tests.support.resume_trials``,
which calls ``Trainer.fit(latest_checkpoint=RUN_DIR)``) and trained to N. Then, bit for bit
(``torch.equal`` and ``==`` on floats, never a tolerance):

- final weights, optimizer state, LR scheduler state and callback state are equal;
- every per-batch training metric is equal (the first k come from the stopped run, the rest
  from the resumed one), and so is every validation result, both as the callbacks saw them and
  as ``metrics.jsonl`` recorded them;
- workload *averages* are equal wherever the two runs' workloads cover the same batches. A stop
  at k ends the workload in progress early (the stopped run reports the average of its batches
  up to k, the resumed run the average of the rest), so the one workload that straddles k is
  split in two and its average legitimately differs; every other workload must match;
- the resumed run reports its starting point: ``on_trial_startup(first_batch_idx=k,
  checkpoint_uuid=<the stopped run's checkpoint>)`` and ``context.get_initial_batch() == k``,
  already inside ``build_training_data_loader``.

Layout: 32 records, batch size 8, so 4 batches per epoch; N = 12 (3 epochs); validation every
3 batches, reports every 2.

The new processes: one fresh interpreter (``python -m tests.support.resume_trials --each``) imports
torch and hookdet and then forks one child per resume, two at a time. Each child is a new
process that never saw any training, as a fresh ``python -c`` would be, without paying ~3 s of
interpreter start and torch import per resume; the straight and stopped runs happen in the test
process. The S3 test resumes in a plain fresh interpreter, and the preemption tests resume with
``hookdet run --resume`` itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from hookdet.runs.metrics import read_reports
from tests.support.resume_trials import run_spec
from tests.support.s3_fixture import s3_server  # noqa: F401  (a fixture)
from tests.support.shared import computed_once

REPO = Path(__file__).resolve().parents[1]

BASE_SPEC: Dict[str, Any] = {
    "trial": "tests.support.resume_trials:RegressionTrial",
    "max_batches": 12,
    "validation_period": 3,
    "reporting_period": 2,
}
BASE_HPARAMS: Dict[str, Any] = {"records": 32, "global_batch_size": 8, "lr": 0.05}

#: name -> (spec overrides, hparams overrides, the k to stop at)
SCENARIOS: Dict[str, Any] = {
    # k=5: mid-epoch, splits the workload [4, 6); k=4: exactly an epoch end; k=6: right after
    # the validation at batch 6 (and mid-epoch).
    "shuffle_dropout": ({}, {"shuffle": True, "dropout": 0.3}, [5, 4, 6]),
    "steplr_every_batch": ({}, {"shuffle": True, "scheduler": "batch", "optimizer": "sgd"}, [5, 6]),
    "steplr_every_epoch": ({}, {"shuffle": True, "scheduler": "epoch", "optimizer": "sgd"}, [4, 7]),
    # k=5 stops inside an aggregation window: the gradient of batch 5 must survive the restart.
    "aggregation_frequency_2": (
        {"config": {"optimizations": {"aggregation_frequency": 2}}},
        {"shuffle": True, "dropout": 0.2},
        [5, 6],
    ),
    "gan_two_models_two_optimizers": ({"trial": "tests.support.resume_trials:GANTrial"}, {}, [5, 8]),
    "stateful_callback": ({}, {"shuffle": True, "stateful": True, "dropout": 0.1}, [5, 8]),
}


def assert_bitwise_equal(expected: Any, actual: Any, where: str = "") -> None:
    """Recursive equality with ``torch.equal`` for tensors; names the first difference."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: expected a tensor, got {type(actual)}"
        assert expected.dtype == actual.dtype and torch.equal(expected, actual), f"{where}: tensors differ"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and set(expected) == set(actual), (
            f"{where}: keys differ: {sorted(map(str, expected))} vs {sorted(map(str, actual))}"
        )
        for key in expected:
            assert_bitwise_equal(expected[key], actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(expected) == len(actual), (
            f"{where}: lengths differ: {len(expected)} vs {len(actual) if hasattr(actual, '__len__') else actual}"
        )
        for index, (left, right) in enumerate(zip(expected, actual)):
            assert_bitwise_equal(left, right, f"{where}[{index}]")
    else:
        assert expected == actual, f"{where}: {expected!r} != {actual!r}"


def _python(args: List[str]) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "tests.support.resume_trials", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout.decode(errors="replace")[-4000:]


def resume_in_new_processes(specs: List[Dict[str, Any]], workdir: Path) -> List[Dict[str, Any]]:
    """Run each spec in a new process (children of one fresh interpreter); their snapshots."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "specs.json").write_text(json.dumps(specs))
    _python(["--each", str(workdir / "specs.json"), str(workdir)])
    return [torch.load(workdir / f"{index}.pt", weights_only=True) for index in range(len(specs))]


def resume_in_fresh_interpreter(spec: Dict[str, Any], workdir: Path) -> Dict[str, Any]:
    """Run ``spec`` in a brand-new ``python -m tests.support.resume_trials`` process; its snapshot."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "spec.json").write_text(json.dumps(spec))
    _python([str(workdir / "spec.json"), str(workdir / "out.pt")])
    return torch.load(workdir / "out.pt", weights_only=True)


def assert_resume_exact(straight: Dict[str, Any], stopped: Dict[str, Any], resumed: Dict[str, Any], k: int) -> None:
    """Everything the module docstring promises, for one k."""
    assert stopped["exit_reason"] == "stopped" and stopped["batches_trained"] == k
    assert resumed["exit_reason"] == "completed"
    assert resumed["startup"] == {"first_batch_idx": k, "checkpoint_uuid": stopped["latest_checkpoint"]}
    assert resumed["initial_batch_at_build"] == k
    assert resumed["initial_batch_after_fit"] == k

    assert len(stopped["batch_metrics"]) == k
    assert_bitwise_equal(straight["batch_metrics"][:k], stopped["batch_metrics"], "batch_metrics[:k]")
    assert_bitwise_equal(straight["batch_metrics"][k:], resumed["batch_metrics"], "batch_metrics[k:]")
    assert_bitwise_equal(straight["validations"], stopped["validations"] + resumed["validations"], "validations")

    pieces = {(w["start"], w["end"]): w["avg"] for w in stopped["workloads"] + resumed["workloads"]}
    split = []
    for workload in straight["workloads"]:
        span = (workload["start"], workload["end"])
        if span in pieces:
            assert_bitwise_equal(workload["avg"], pieces[span], f"workload {span}")
        else:
            split.append(span)
    assert all(start < k < end for start, end in split), f"only the workload around k may split: {split}"

    for key in ("models", "optimizers", "schedulers", "stateful"):
        assert_bitwise_equal(straight[key], resumed[key], key)


CASES = [(name, k) for name, (_spec, _hparams, ks) in SCENARIOS.items() for k in ks]


@pytest.fixture(scope="module")
def resume_matrix(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """Every scenario: the straight run, the stopped runs and their resumes (all resumes of all
    scenarios in new processes, from one fresh interpreter); trained once for the session, the
    tests only read it."""
    return computed_once(tmp_path_factory, "resume-matrix", train_the_resume_matrix)


def train_the_resume_matrix(root: Path) -> Dict[str, Any]:
    matrix: Dict[str, Any] = {}
    resume_specs, order = [], []
    for name, (spec_overrides, hparam_overrides, ks) in SCENARIOS.items():
        spec = {**BASE_SPEC, **spec_overrides, "hparams": {**BASE_HPARAMS, **hparam_overrides}}
        entry = matrix[name] = {"root": root / name, "stopped": {}, "resumed": {}}
        entry["straight"] = run_spec({**spec, "run_dir": str(root / name / "straight")})
        for k in ks:
            run_dir = root / name / f"stop{k}"
            entry["stopped"][k] = run_spec(
                {**spec, "run_dir": str(run_dir), "hparams": {**spec["hparams"], "stop_at": k}}
            )
            # Resume from the run directory: its newest intact checkpoint is the stop checkpoint.
            resume_specs.append({**spec, "run_dir": str(run_dir), "resume": str(run_dir)})
            order.append((name, k))
    for (name, k), result in zip(order, resume_in_new_processes(resume_specs, root / "fresh")):
        matrix[name]["resumed"][k] = result
    return matrix


@pytest.mark.slow
@pytest.mark.parametrize("scenario,k", CASES, ids=[f"{name}-k{k}" for name, k in CASES])
def test_stop_and_resume_in_new_process_is_bitwise_exact(resume_matrix: Dict[str, Any], scenario: str, k: int) -> None:
    entry = resume_matrix[scenario]
    straight = entry["straight"]
    assert straight["exit_reason"] == "completed" and len(straight["batch_metrics"]) == 12
    assert_resume_exact(straight, entry["stopped"][k], entry["resumed"][k], k)
    # metrics.jsonl of the stopped run dir holds the stopped and the resumed run's reports.
    def validations(run_dir: Path) -> List[Any]:
        return [(r["steps_completed"], r["metrics"]) for r in read_reports(run_dir) if r["group"] == "validation"]

    assert validations(entry["root"] / f"stop{k}") == validations(
        entry["root"] / "straight"
    )


def test_a_stop_due_at_a_validation_boundary_validates_first(tmp_path: Path) -> None:
    """Stopping at batch 6, where a validation is due, still validates at 6 (then checkpoints
    and stops), so the resumed run does not skip that validation."""
    spec = {**BASE_SPEC, "hparams": {**BASE_HPARAMS, "stop_at": 6}, "run_dir": str(tmp_path)}
    stopped = run_spec(spec)
    assert stopped["batches_trained"] == 6
    assert len(stopped["validations"]) == 2  # at 3 and at 6
    records = read_reports(tmp_path)
    assert [r["steps_completed"] for r in records if r["group"] == "validation"] == [3, 6]


def test_resume_of_a_finished_run_trains_nothing_more(tmp_path: Path) -> None:
    spec = {**BASE_SPEC, "hparams": dict(BASE_HPARAMS), "run_dir": str(tmp_path)}
    finished = run_spec(spec)
    again = run_spec({**spec, "resume": str(tmp_path)})
    assert again["startup"]["first_batch_idx"] == 12
    assert again["batch_metrics"] == [] and again["validations"] == []
    assert_bitwise_equal(finished["models"], again["models"], "models")


@pytest.mark.slow
def test_s3_round_trip_resumes_exactly_from_the_storage_id(s3_server: Dict[str, str], tmp_path: Path) -> None:
    """Checkpoints go to a real S3-compatible server; a new process resumes from the bare
    storage id (downloaded and verified) and finishes bit-identical to the straight run."""
    storage = {
        "type": "s3",
        "bucket": s3_server["bucket"],
        "endpoint_url": s3_server["endpoint_url"],
        "access_key": s3_server["access_key"],
        "secret_key": s3_server["secret_key"],
        "prefix": "runs/a",
    }
    spec = {
        **BASE_SPEC,
        "hparams": {**BASE_HPARAMS, "shuffle": True, "dropout": 0.3},
        "config": {"checkpoint_storage": storage},
    }
    straight = run_spec({**spec, "run_dir": str(tmp_path / "straight")})
    stopped = run_spec({**spec, "run_dir": str(tmp_path / "stopped"), "hparams": {**spec["hparams"], "stop_at": 5}})
    storage_id = stopped["latest_checkpoint"]
    assert not (tmp_path / "stopped" / "checkpoints").exists()  # nothing went to the local disk

    from tests.support.s3_fixture import s3_admin_client

    keys = {
        item["Key"]
        for item in s3_admin_client(s3_server["endpoint_url"]).list_objects_v2(
            Bucket=s3_server["bucket"], Prefix=f"runs/a/{storage_id}/"
        )["Contents"]
    }
    assert keys == {f"runs/a/{storage_id}/state_dict.pth", f"runs/a/{storage_id}/metadata.json"}

    resumed = resume_in_fresh_interpreter(
        {**spec, "run_dir": str(tmp_path / "resumed"), "resume": storage_id}, tmp_path / "fresh"
    )
    assert_resume_exact(straight, stopped, resumed, 5)
