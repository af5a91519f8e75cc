"""Under ``slots_per_trial: 2`` the model ``wrap_model`` returns passes attribute reads through
to the wrapped module, as Determined's ``_PyTorchDistributedDataParallel`` does: two real ranks
(``hookdet run --slots 2``: torchrun, gloo) run ``ddp_attribute_trial.AttributeTrial``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.distributed_trials import read_weight, run_command, write_config

TRIAL_DIR = Path(__file__).resolve().parent


@pytest.mark.slow
def test_two_ranks_read_the_wrapped_modules_attributes(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "experiment.yaml",
        {"global_batch_size": 4, "lr": 0.1, "records": 8},
        entrypoint="ddp_attribute_trial:AttributeTrial",
        searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                  "max_length": {"batches": 3}},
        plugins={"only": ["callbacks", "ddp"]},
    )
    run_dir = tmp_path / "run"
    result = run_command(
        [sys.executable, "-m", "hookdet", "run", str(config), "--run-dir", str(run_dir),
         "--model-dir", str(TRIAL_DIR), "--slots", "2"],
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-6000:]

    seen = [json.loads((run_dir / f"rank{rank}-attributes.json").read_text()) for rank in (0, 1)]
    for rank, batches in enumerate(seen):
        assert len(batches) == 3, rank
        for batch in batches:
            assert batch["is_ddp"] and batch["wrapper"] == "PassThroughDistributedDataParallel"
            assert batch["weight_is_the_modules"] and batch["fc_is_the_modules"]
            assert batch["latent_dim"] == 3 and batch["module_is_ddps_own"]
            assert "no_such_attribute" in batch["missing"]
    # Still real DDP: the replicas see the same weight at every batch, and it moved.
    assert [b["weight"] for b in seen[0]] == [b["weight"] for b in seen[1]]
    assert seen[0][0]["weight"] != seen[0][-1]["weight"]
    assert read_weight(run_dir, 0).equal(read_weight(run_dir, 1))
