"""Built-ins are replaceable: a third-party package (``tests/fixtures/hookdet-replacements``),
installed with pip and found through its entry points, replaces the checkpoint storage, the
TensorBoard writer provider, the mixed-precision provider and the progress reporter using only
hookdet's public API; a run with it passes the checks the built-ins pass, resume included.

One child process (tests/support/replacement_run.py) trains three runs: 8 batches straight, 4 batches
and a checkpoint, and 4 more resumed from that checkpoint by its storage id.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.packages import pip_install

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tests" / "fixtures" / "hookdet-replacements"


@pytest.mark.slow
def test_replacements_pass_the_builtins_checks(tmp_path: Path) -> None:
    site = pip_install(PACKAGE, tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), XDG_CACHE_HOME=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "replacement_run.py"), str(tmp_path / "runs")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    whole, stopped, resumed = summary["whole"], summary["stopped"], summary["resumed"]

    # Resume is exact through the replacement storage, and starts where the checkpoint was taken.
    assert summary["exact"] and summary["stopped_differs"]
    assert (whole["initial_batch"], stopped["initial_batch"], resumed["initial_batch"]) == (0, 0, 4)
    # (retention, as with the built-in storage, deleted the resumed-from checkpoint once newer ones existed)
    assert resumed["latest_checkpoint"] in summary["storage_ids"]
    assert not any(name.startswith(".incoming-") for name in summary["storage_ids"])

    # The storage type is the package's entry point, recorded so the run's checkpoints are found again.
    assert summary["recorded_storage"] == {"type": "flat_storage", "root": str(tmp_path / "runs" / "flat")}

    # Only the replacements ran: the built-ins they replace were never even imported.
    assert summary["builtins_imported"] == []
    for result_ in (whole, stopped, resumed):
        assert {"csv_writer", "bf16_autocast", "line_progress"} <= set(result_["loaded"])
        assert not {"amp", "tensorboard", "progress"} & set(result_["loaded"])
        assert result_["tensorboard_enabled"] is True
        # use_amp() answered by the replacement: every forward ran under bfloat16 autocast.
        assert result_["autocast_in_forward"] == ["torch.bfloat16"]

    # The trial's writer is the replacement's; each run wrote one row per batch it trained.
    assert [int(step) for tag, step, _ in whole["scalars"]] == list(range(8))
    assert [int(step) for tag, step, _ in resumed["scalars"]] == [4, 5, 6, 7]
    assert {tag for tag, _, _ in whole["scalars"]} == {"trial/loss"}

    # The progress reporter saw where training starts and every report, as metrics.jsonl did.
    assert whole["progress"][0] == "start 0 of 8" and resumed["progress"][0] == "start 4 of 8"
    assert [int(line.split()[1]) for line in resumed["progress"][1:]] == resumed["reports"] == [6, 8, 8]


def test_the_replacement_storage_says_a_checkpoint_is_missing_as_the_protocol_does(tmp_path: Path) -> None:
    """Retention takes :class:`CheckpointNotFoundError` on delete as "already gone"; any other
    error it retries at every checkpoint. The fixture raises it with the documented arguments."""
    import importlib.util

    from hookdet.plugin import CheckpointNotFoundError

    spec = importlib.util.spec_from_file_location("hookdet_replacements", PACKAGE / "hookdet_replacements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    storage = module.FlatDirectoryStorage(str(tmp_path / "flat"))
    for attempt in (lambda: storage.delete("gone"), lambda: storage.restore_path("gone").__enter__()):
        with pytest.raises(CheckpointNotFoundError) as raised:
            attempt()
        assert raised.value.storage_id == "gone" and str(tmp_path / "flat") in str(raised.value)
