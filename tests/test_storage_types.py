"""Each storage type through every command a user types: ``hookdet run``, ``--resume RUN_DIR``,
``show``, ``export``, and a search whose checkpoints live outside its trial directories.

The types: ``gcs`` (a Google Cloud Storage emulator), ``azure`` (Azurite) and ``flatfs``, a type
another package adds (``tests/fixtures/hookdet-flatfs``, installed by pip). ``shared_fs`` and
``s3`` run the same commands in ``tests/faults/test_run_ownership.py``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest
import torch

from hookdet.search.report import read_search
from hookdet.checkpoints.resolver import read_identity
from hookdet.runs.metrics import read_reports
from tests.faults.harness import REPO, child_env, run, write_config
from tests.support import hookdet_process
from tests.support.storage_servers import azure_server, flatfs_installed, gcs_server  # noqa: F401  (fixtures)

FIXTURES = REPO / "tests" / "fixtures" / "search"


def storage_block(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Dict[str, Any]:
    if kind == "gcs":
        return {"type": "gcs", "bucket": request.getfixturevalue("gcs_server")["bucket"], "prefix": "team/exp"}
    if kind == "azure":
        server = request.getfixturevalue("azure_server")
        return {"type": "azure", "container": f"{server['container']}/team", "connection_string": server["connection_string"]}
    request.getfixturevalue("flatfs_installed")
    return {"type": "flatfs", "root": str(tmp_path / "flat-store")}


@pytest.mark.parametrize("kind", [pytest.param("gcs", marks=pytest.mark.slow), pytest.param("azure", marks=pytest.mark.slow),
                                  "flatfs"])
def test_run_resume_show_and_export_through_each_storage_type(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    block = storage_block(kind, request, tmp_path)
    config = write_config(tmp_path / "exp.yaml", {"stop_at": 6}, checkpoint_storage=block)
    run_dir = tmp_path / "run"
    status, _, stderr = run(["run", str(config), "--run-dir", str(run_dir)], f"{kind}: stop at 6", fault=False)
    assert status == 0, stderr[-3000:]
    assert not (run_dir / "checkpoints").exists()
    assert read_identity(run_dir)["storage"]["type"] == kind

    whole = write_config(tmp_path / "whole.yaml", checkpoint_storage=block)
    status, _, stderr = run(["run", str(whole), "--resume", str(run_dir)], f"{kind}: resume RUN_DIR", fault=False)
    assert status == 0, stderr[-3000:]
    assert "at batch 6" in stderr
    steps = [r["steps_completed"] for r in read_reports(run_dir) if r["group"] == "training"]
    assert steps == list(range(1, 13))

    status, shown, stderr = run(["show", str(run_dir)], f"{kind}: show", fault=False)
    assert status == 0, stderr[-3000:]
    listed = shown.split("checkpoints (", 1)[1].splitlines()[1:]
    assert listed and all("batch" in line for line in listed), shown
    assert any(line.split()[2] == "12" for line in listed), shown  # the final checkpoint, batch 12

    out = tmp_path / "weights.pt"
    status, _, stderr = run(["export", str(run_dir), str(out)], f"{kind}: export", fault=False)
    assert status == 0, stderr[-3000:]
    weights = torch.load(out, weights_only=True)
    assert set(weights) == {"0.weight", "0.bias", "3.weight", "3.bias"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_search_with_a_third_party_storage_outside_its_trials_continues_every_segment(
    tmp_path: Path, flatfs_installed: Path  # noqa: F811
) -> None:
    store = tmp_path / "store"
    override = f"checkpoint_storage={{type: flatfs, root: {store}}}"
    result = hookdet_process.run("run", FIXTURES / "asha.yaml", "--run-dir", "asha", "--workers", "2", "--config",
                                 override, cwd=tmp_path, env=child_env(XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert result.returncode == 0, result.stderr[-3000:]
    state = read_search(tmp_path / "asha")[1]
    continued = [t for t in state["trials"].values() if t["state"] == "completed"]
    assert continued and all(t["batches"] == 8 and t["segments"] == 2 for t in continued)
    assert any(path.name.startswith("ckpt-") for path in store.iterdir())
    for trial in continued:
        # The second segment resumed the first one's checkpoint from the store, not batch 0.
        log = (Path(trial["dir"]).parent / f"{Path(trial['dir']).name}.log").read_text()
        assert log.count("resumed from checkpoint") == 1 and "at batch 4" in log, log[-3000:]
        steps = [r["steps_completed"] for r in read_reports(Path(trial["dir"])) if r["group"] == "training"]
        assert steps == sorted(set(steps)) and steps[-1] == 8
