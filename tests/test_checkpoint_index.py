"""Determined's local checkpoint semantics: a checkpoint id from any earlier local run resumes in
a new process and a new run directory, through ``hookdet run --resume <id>`` and through
``Trainer.fit(latest_checkpoint=<id>)`` (hookdet.checkpoints.user_index), and a checkpoint
that retention deleted is gone from the index too.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hookdet.checkpoints import lookup
from hookdet.checkpoints.user_index import lookup as indexed
from hookdet.runs.metrics import read_reports
from tests.faults.harness import REPO, TESTS, child_env, run, write_config


def training_steps(run_dir: Path) -> list:
    return [r["steps_completed"] for r in read_reports(run_dir) if r["group"] == "training"]


@pytest.mark.slow
def test_a_checkpoint_id_of_an_earlier_run_resumes_in_a_new_process(tmp_path: Path) -> None:
    keep_two = {"save_trial_latest": 2, "save_trial_best": 0}
    stop = write_config(tmp_path / "stop.yaml", {"stop_at": 6}, checkpoint_storage=keep_two)
    whole = write_config(tmp_path / "whole.yaml")
    status, _, stderr = run(["run", str(stop), "--run-dir", str(tmp_path / "first")], "first run", fault=False)
    assert status == 0, stderr[-3000:]
    written = {metadata["steps_completed"]: directory.name
               for directory, metadata in lookup.find_checkpoints(tmp_path / "first" / "checkpoints")}
    assert sorted(written) == [4, 6]
    assert indexed(written[6])["run_dir"] == str(tmp_path / "first")

    # hookdet run --resume <id>, from another directory, into a new run directory.
    status, _, stderr = run(["run", str(whole), "--resume", written[6], "--run-dir", str(tmp_path / "second")],
                            "resume by id", fault=False)
    assert status == 0, stderr[-3000:]
    assert "at batch 6" in stderr
    assert training_steps(tmp_path / "second") == list(range(7, 13))

    # Trainer.fit(latest_checkpoint=<id>) in a script, as under Determined.
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import yaml
        from hookdet import pytorch
        from resume_trials import RegressionTrial
        config = yaml.safe_load(open({str(whole)!r}))
        with pytorch.init(exp_conf=config, run_dir={str(tmp_path / 'third')!r}) as context:
            trial = RegressionTrial(context)
            pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(12), latest_checkpoint={written[4]!r},
                                                 reporting_period=pytorch.Batch(1))
    """))
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                            env=child_env(PYTHONPATH=f"{TESTS}:{REPO}"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert training_steps(tmp_path / "third") == list(range(5, 13))  # it went on from batch 4

    # A run whose retention deletes a checkpoint removes it from the index too.
    status, _, stderr = run(["run", str(whole), "--resume", str(tmp_path / "first")], "resume first", fault=False)
    assert status == 0, stderr[-3000:]
    assert indexed(written[4]) is None  # retention (2 latest) deleted batch 4's checkpoint
    status, _, stderr = run(["run", str(whole), "--resume", written[4], "--run-dir", str(tmp_path / "fourth")],
                            "resume a deleted id")
    assert status == 2
    assert written[4] in stderr and "Traceback" not in stderr
