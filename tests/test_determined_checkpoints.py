"""Checkpoints the real ``determined==0.38.1`` wrote, taken by every entry a user has:
``hookdet run --resume <dir>``, ``load_trial_from_checkpoint_path(<dir>)``; and a hostile one
(pickled code in ``state_dict.pth`` or ``trial_state.pkl``) refused in one line, its code never
run. The bit-for-bit continuation is ``tests/parity/test_parity_determined_checkpoints.py``.
"""
from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from hookdet.checkpoints import format as fmt
from hookdet.runs.metrics import read_reports
from tests.faults.harness import REPO, assert_one_line, run, write_config
from tests.parity import harness

PERIODS = {"validation_period": {"Batch": 4}, "checkpoint_period": {"Batch": 4},
           "reporting_period": {"Batch": 2}, "checkpoint_policy": "all"}


@pytest.fixture(scope="module")
def determined_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory Determined wrote at batch 4 of :class:`tests.parity.trials.Continued`."""
    root = tmp_path_factory.mktemp("determined")
    harness.run_case(root, "Continued", dict(PERIODS, max_length={"Batch": 4}), frameworks=("determined",))
    uuid = (root / "determined" / "cwd" / "latest_checkpoint.txt").read_text().strip()
    return root / "determined" / "data" / "determined" / uuid


def experiment(tmp_path: Path) -> Path:
    return write_config(
        tmp_path / "exp.yaml", {"global_batch_size": 4},
        entrypoint="tests.parity.trials:Continued",
        searcher={"name": "single", "metric": "val_loss", "smaller_is_better": True, "max_length": {"batches": 7}},
        min_checkpoint_period={"batches": 4},
    )


@pytest.mark.slow
def test_hookdet_run_resumes_a_determined_checkpoint(tmp_path: Path, determined_checkpoint: Path) -> None:
    run_dir = tmp_path / "run"
    status, _, stderr = run(["run", str(experiment(tmp_path)), "--resume", str(determined_checkpoint),
                             "--run-dir", str(run_dir), "--model-dir", str(REPO)], "resume Determined's", fault=False)
    assert status == 0, stderr[-3000:]
    assert f"resumed from checkpoint {determined_checkpoint} at batch 4" in stderr
    assert [r["steps_completed"] for r in read_reports(run_dir) if r["group"] == "training"] == [5, 6, 7]



@pytest.mark.slow
def test_continuing_a_determined_checkpoint_warns_of_nothing_that_did_not_happen(
        tmp_path: Path, determined_checkpoint: Path) -> None:
    """Its ``code/`` folder (the model directory Determined keeps in each checkpoint) is not an
    interrupted checkpoint, and what a local-mode checkpoint does not record (hyperparameters
    and experiment fields the script never passed) did not change: neither is warned about.
    A field it records that differs now still is (``searcher.max_length``: 8 there, 7 here)."""
    checkpoint = tmp_path / determined_checkpoint.name
    shutil.copytree(determined_checkpoint, checkpoint)
    (checkpoint / "code").mkdir(exist_ok=True)
    (checkpoint / "code" / "model_def.py").write_text("# the experiment's model directory, as Determined keeps it\n")
    status, _, stderr = run(["run", str(experiment(tmp_path)), "--resume", str(checkpoint),
                             "--run-dir", str(tmp_path / "run"), "--model-dir", str(REPO)], "continue Determined's",
                            fault=False)
    assert status == 0, stderr[-3000:]
    assert f"resumed from checkpoint {checkpoint} at batch 4" in stderr
    assert "not a complete checkpoint" not in stderr and "unset ->" not in stderr, stderr[-3000:]
    assert "experiment fields changed since it was written: searcher.max_length.batches: 8 -> 7." in stderr


def test_load_trial_from_a_determined_checkpoint(determined_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_FRAMEWORK", "hookdet")
    from hookdet import pytorch

    trial = pytorch.load_trial_from_checkpoint_path(str(determined_checkpoint))
    saved = torch.load(determined_checkpoint / "state_dict.pth", weights_only=False)["models_state_dict"][0]
    assert type(trial).__name__ == "Continued"
    assert set(saved) == set(trial.model.state_dict())
    assert all(torch.equal(trial.model.state_dict()[name], tensor) for name, tensor in saved.items())


class RunsCode:
    """Pickles into a call of ``os.system``: loading it would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: D105
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("tampered", ["state_dict.pth", "state_dict.pth, legacy format", "trial_state.pkl"])
def test_a_determined_checkpoint_with_code_in_it_is_refused_in_one_line(
    tmp_path: Path, determined_checkpoint: Path, tampered: str
) -> None:
    """Never torch's advice to load it unsafely, or to re-save it (which means loading it)."""
    hostile = tmp_path / "hostile"
    shutil.copytree(determined_checkpoint, hostile)
    marker = tmp_path / "code-ran"
    file = tampered.split(",")[0]
    if file == "state_dict.pth":
        state = torch.load(hostile / "state_dict.pth", weights_only=False)
        state["callbacks"]["recorder"] = {"calls": RunsCode(marker)}
        torch.save(state, hostile / "state_dict.pth", _use_new_zipfile_serialization="legacy" not in tampered)
    else:
        (hostile / "trial_state.pkl").write_bytes(pickle.dumps({"batches_trained": RunsCode(marker)}))

    expected = "not in torch's zip format" if "legacy" in tampered else "(posix.system|os.system)"
    with pytest.raises(fmt.CheckpointError, match=f"{file}.*{expected}") as refused:
        fmt.load_state(hostile)
    for advice in ("weights_only", "trust", "torch.save your checkpoint"):
        assert advice not in str(refused.value)
    status, _, stderr = run(["run", str(experiment(tmp_path)), "--resume", str(hostile), "--run-dir",
                             str(tmp_path / "run"), "--model-dir", str(REPO)], f"hostile {tampered}")
    assert status == 2, stderr[-3000:]
    assert_one_line(stderr, file, "never runs code")
    assert not marker.exists()


def test_a_hookdet_checkpoint_in_torchs_legacy_format_is_refused_unread(tmp_path: Path) -> None:
    """A hookdet checkpoint whose state file was replaced by a legacy-format pickle holding code
    (its manifest rewritten to match): refused before torch reads it, in hookdet's words."""
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    marker = tmp_path / "code-ran"
    torch.save({"models_state_dict": [{"w": RunsCode(marker)}]}, directory / fmt.STATE_FILE,
               _use_new_zipfile_serialization=False)
    fmt.write_metadata(directory, fmt.base_metadata(steps_completed=1))
    with pytest.raises(fmt.CheckpointError, match="not in torch's zip format") as refused:
        fmt.load_state(directory)
    assert "torch.save" not in str(refused.value) and "weights_only" not in str(refused.value)
    assert not marker.exists()
