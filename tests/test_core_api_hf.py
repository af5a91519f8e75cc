"""``hookdet.transformers.DetCallback``: a Hugging Face Trainer as a Core API trial under ``hookdet run``.

The model is a one-layer BERT built from a config (tests/fixtures/core_api_hf), so nothing is
downloaded. The ``transformers`` extra is installed by ``.ci/run``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hookdet.runs.metrics import read_reports
from hookdet.runs.record import read_history, read_record
from tests.support import hookdet_process

pytest.importorskip("transformers", reason="the transformers extra: pip install 'hookdet[transformers]'")

FIXTURE = Path(__file__).parent / "fixtures" / "core_api_hf"


@pytest.mark.slow
def test_a_trainer_reports_uploads_its_checkpoints_and_resumes_from_the_latest(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(FIXTURE, tmp_path / "hf"))
    first = hookdet_process.run("run", "const.yaml", "--run-dir", "run", cwd=folder)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = folder / "run"
    rows = [(r["group"], r["steps_completed"]) for r in read_reports(run_dir)]
    assert rows == [("training", 2), ("training", 4), ("validation", 4), ("training", 6), ("training", 8),
                    ("validation", 8)]
    reports = read_reports(run_dir)
    assert {"loss", "batches", "epochs"} <= set(reports[0]["metrics"]) and "train_runtime" not in reports[-1]["metrics"]
    assert reports[2]["metrics"]["batches"] == 4 and "eval_loss" in reports[2]["metrics"]
    record = read_record(run_dir)
    assert (record["state"], record["batches_trained"], record["progress"]) == ("completed", 8, 1.0)
    checkpoint = run_dir / "checkpoints" / record["latest_checkpoint"]
    assert sorted(p.name for p in checkpoint.iterdir()) == ["checkpoint-8", "metadata.json"]
    assert json.loads((checkpoint / "checkpoint-8" / "my_data.json").read_text()) == {"made_by": "hookdet test"}
    sealed = json.loads((checkpoint / "metadata.json").read_text())
    assert sealed["steps_completed"] == 8 and sealed["trial_id"] == 1 and "checkpoint-8/model.safetensors" in sealed["files"]

    second = hookdet_process.run("run", "const.yaml", "--resume", "run", "--config",
                                 "entrypoint=python3 train.py --steps 12 --output-dir elsewhere", cwd=folder)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (folder / "elsewhere" / "checkpoint-8").is_dir()  # downloaded from the run's storage, then resumed
    assert [(r["group"], r["steps_completed"]) for r in read_reports(run_dir)][6:] == [
        ("training", 10), ("training", 12), ("validation", 12)]
    assert read_history(run_dir)[2]["resumed_from"] == record["latest_checkpoint"]
