"""Local semantics measured against the real ``determined==0.38.1``: what the Trainer API keeps
when no master collects checkpoints, and how a searcher metric no validation reports is refused.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import List

import pytest

from hookdet.runs.metrics import read_reports
from tests.faults.harness import REPO, run, write_config
from tests.parity import harness
from tests.parity.checks import events

EVERY_TWO = {"validation_period": {"Batch": 2}, "checkpoint_period": {"Batch": 2},
             "reporting_period": {"Batch": 2}, "checkpoint_policy": "all", "max_length": {"Batch": 8}}


def checkpoints_seen(tmp_path: Path, framework: str) -> List[str]:
    """Every checkpoint id the trial's callbacks were told of, both phases."""
    return (tmp_path / framework / "cwd" / "checkpoints.txt").read_text().split()


def on_disk(tmp_path: Path, framework: str, uuid: str) -> bool:
    """Whether checkpoint ``uuid`` is still where its framework's local storage put it."""
    if framework == "determined":
        return (tmp_path / "determined" / "data" / "determined" / uuid / "metadata.json").is_file()
    return (tmp_path / "hookdet" / "run" / "checkpoints" / uuid / "metadata.json").is_file()


@pytest.mark.slow
def test_the_trainer_api_keeps_every_checkpoint_and_resumes_from_the_first(tmp_path):
    """``pytorch.init()`` + ``Trainer.fit`` with no ``checkpoint_storage``: Determined, with no
    master to collect them, keeps every checkpoint it writes, and so does hookdet; a second fit
    from the *first* checkpoint's id works in both (and keeps those it writes too)."""
    results = harness.run_case(tmp_path, "Continued", EVERY_TWO, resume_fit=EVERY_TWO,
                               resume_from="first_checkpoint.txt")
    for framework in ("determined", "hookdet"):
        first, second = results[framework]
        assert first[0]["error"] is None and second[0]["error"] is None, (framework, second[0]["error"])
        seen = checkpoints_seen(tmp_path, framework)
        assert len(seen) >= 4 + 3, (framework, seen)  # 2, 4, 6, 8; then again from 2
        assert all(on_disk(tmp_path, framework, uuid) for uuid in seen), framework
    startups = {name: events(results[name][1][0], "callback", method="on_trial_startup")[0]["first_batch_idx"]
                for name in ("determined", "hookdet")}
    assert startups == {"determined": 0, "hookdet": 2}  # local-resume-restarts-data


DETERMINEDS_CHECK = """
import json, sys, types
from determined.pytorch._pytorch_trial import _PyTorchTrialController
try:
    _PyTorchTrialController._check_searcher_metric(types.SimpleNamespace(searcher_metric_name=sys.argv[1]),
                                                   json.loads(sys.argv[2]))
except RuntimeError as error:
    print(error)
"""


def test_an_unreported_searcher_metric_is_refused_in_determineds_words(tmp_path):
    """Determined's harness ranks validations by the searcher metric (``checkpoint_policy:
    best``, on a cluster: local mode falls back to ``all``, so its own check is run here on the
    metrics the trial reported, with the ``batches`` and ``epochs`` it adds). ``hookdet run``
    stops at the first validation with hookdet's sentence and Determined's message, word for
    word."""
    config = write_config(tmp_path / "exp.yaml", searcher={
        "name": "single", "metric": "validation_los", "max_length": {"batches": 8}})
    status, _, stderr = run(["run", str(config), "--run-dir", str(tmp_path / "run"), "--model-dir",
                             str(REPO / "tests" / "support")], "unreported searcher metric", fault=False)
    assert status == 2, stderr[-3000:]  # a usage error: what the file asks for cannot be
    (validation,) = [r for r in read_reports(tmp_path / "run") if r["group"] == "validation"]
    as_determined_sees = dict(validation["metrics"], batches=validation["steps_completed"], epochs=0)
    determined = subprocess.run(
        [str(harness.require_determined()), "-c", DETERMINEDS_CHECK, "validation_los", json.dumps(as_determined_sees)],
        capture_output=True, text=True, timeout=120)
    words = determined.stdout.strip()
    assert words.startswith("Search method is configured to use metric 'validation_los'"), determined.stderr
    (line,) = [line for line in stderr.splitlines() if "is not among the validation metrics" in line]
    assert f"(Determined's words: {words})" in line, (line, words)
