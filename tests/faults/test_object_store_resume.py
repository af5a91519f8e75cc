"""A damaged newest checkpoint on an object store is passed over as on a disk.

On S3 (moto) and Azure Blob Storage (Azurite): the newest checkpoint's ``state_dict.pth``
deleted, or truncated, in the store; ``--resume RUN_DIR`` says "skipping" once, naming the
checkpoint where it is (not the folder it was downloaded to), continues from the checkpoint
before it bit for bit as the run that never stopped, and leaves no download behind. A download
a killed process left is removed by the next.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import pytest

from hookdet.checkpoints.object_store import DOWNLOAD_PREFIX
from hookdet.checkpoints.resolver import read_identity, storage_of
from hookdet.runs.metrics import read_reports
from tests.faults.harness import run, write_config
from tests.support.s3_fixture import s3_server  # noqa: F401  (a fixture)
from tests.support.storage_servers import azure_server  # noqa: F401  (a fixture)


def storage_block(kind: str, request: pytest.FixtureRequest) -> Dict[str, Any]:
    if kind == "s3":
        server = request.getfixturevalue("s3_server")
        return {"type": "s3", "bucket": server["bucket"], "endpoint_url": server["endpoint_url"],
                "prefix": "exp", "save_trial_latest": 5}
    server = request.getfixturevalue("azure_server")
    return {"type": "azure", "container": f"{server['container']}/team",
            "connection_string": server["connection_string"], "save_trial_latest": 5}


def reports(run_dir: Path) -> List[Any]:
    return [(r["group"], r["steps_completed"], r["metrics"]) for r in read_reports(run_dir)]


def downloads_of(pid: int) -> List[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"{DOWNLOAD_PREFIX}{pid}-*"))


def damage(run_dir: Path, storage_id: str, how: str, scratch: Path) -> str:
    """Delete or truncate ``state_dict.pth`` of checkpoint ``storage_id`` in the run's store,
    through the store's own primitives; where the checkpoint is."""
    storage = storage_of(read_identity(run_dir), None)
    key = storage.checkpoint_key_prefix(storage_id) + "state_dict.pth"
    if how == "deleted":
        storage.delete_keys([key])
    else:
        whole = storage.get_bytes(key, 2**30)
        scratch.write_bytes(whole[: len(whole) // 2])
        storage.upload_file(scratch, key)
    return storage.location(storage_id)


@pytest.mark.slow
@pytest.mark.parametrize("kind, how", [("s3", "deleted"), ("s3", "truncated"), ("azure", "deleted"),
                                       ("azure", "truncated")])
def test_a_damaged_newest_checkpoint_is_skipped_and_the_run_continues_exactly(
        kind: str, how: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    block = storage_block(kind, request)
    straight = write_config(tmp_path / "straight.yaml", searcher={
        "name": "single", "metric": "validation_loss", "smaller_is_better": True, "max_length": {"batches": 16}})
    status, _, stderr = run(["run", str(straight), "--run-dir", str(tmp_path / "straight")], "straight", fault=False)
    assert status == 0, stderr[-3000:]

    run_dir = tmp_path / "run"
    status, _, stderr = run(["run", str(write_config(tmp_path / "exp.yaml", checkpoint_storage=block)),
                             "--run-dir", str(run_dir)], f"{kind}: to 12", fault=False)
    assert status == 0, stderr[-3000:]
    storage = storage_of(read_identity(run_dir), None)
    by_step = {metadata["steps_completed"]: storage_id for storage_id, metadata in storage.list()}
    assert sorted(by_step) == [4, 8, 12]
    where = damage(run_dir, by_step[12], how, tmp_path / "half")

    # a download a killed resume left behind (its process is gone): the next one removes it
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = Path(tempfile.gettempdir()) / f"{DOWNLOAD_PREFIX}{dead.pid}-{by_step[8]}-killed"
    (left / "nested").mkdir(parents=True)

    longer = write_config(tmp_path / "longer.yaml", checkpoint_storage=block, searcher=straight_searcher())
    status, _, stderr = run(["run", str(longer), "--resume", str(run_dir)], f"{kind}: {how} newest", fault=False)
    assert status == 0, stderr[-3000:]
    skipped = [line for line in stderr.splitlines() if "skipping" in line]
    assert len(skipped) == 1 and where in skipped[0] and DOWNLOAD_PREFIX not in skipped[0], skipped
    storage = storage_of(read_identity(run_dir), None)
    assert f"resumed from checkpoint {storage.location(by_step[8])} at batch 8" in stderr, stderr[-3000:]
    assert reports(run_dir) == reports(tmp_path / "straight")
    assert not left.exists()
    assert downloads_of(os.getpid()) == []


def straight_searcher() -> Dict[str, Any]:
    return {"name": "single", "metric": "validation_loss", "smaller_is_better": True, "max_length": {"batches": 16}}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_a_killed_upload_of_this_run_is_removed_and_anothers_in_progress_kept(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """What a write killed mid-upload leaves: its objects without ``metadata.json``, and the run
    directory's note of the write. The resume (under the run's lock) removes exactly those
    objects; an upload in progress with no note in this run directory (another run's, in the
    same bucket) is left alone."""
    block = storage_block(kind, request)
    run_dir = tmp_path / "run"
    status, _, stderr = run(["run", str(write_config(tmp_path / "exp.yaml", checkpoint_storage=block)),
                             "--run-dir", str(run_dir)], f"{kind}: to 12", fault=False)
    assert status == 0, stderr[-3000:]
    assert not (run_dir / ".writes-in-progress").exists()  # every note of a finished write is gone
    storage = storage_of(read_identity(run_dir), None)
    part = tmp_path / "part"
    part.write_bytes(os.urandom(4096))
    for storage_id in ("killed-upload-of-this-run", "another-runs-upload-in-progress"):
        storage.upload_file(part, storage.checkpoint_key_prefix(storage_id) + "state_dict.pth")
    (run_dir / ".writes-in-progress").mkdir()
    (run_dir / ".writes-in-progress" / "killed-upload-of-this-run").touch()

    longer = write_config(tmp_path / "longer.yaml", checkpoint_storage=block, searcher=straight_searcher())
    status, _, stderr = run(["run", str(longer), "--resume", str(run_dir)], f"{kind}: killed upload", fault=False)
    assert status == 0, stderr[-3000:]
    assert "removed 1 unfinished checkpoint write(s) left by a killed run" in stderr, stderr[-3000:]
    assert storage.list_keys(storage.checkpoint_key_prefix("killed-upload-of-this-run")) == []
    assert storage.list_keys(storage.checkpoint_key_prefix("another-runs-upload-in-progress")) != []
    assert not (run_dir / ".writes-in-progress").exists()


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_load_trial_from_checkpoint_path_of_a_run_finds_its_checkpoint_in_the_store(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The first call a Determined user makes after migrating: ``load_trial_from_checkpoint_path
    ("runs/X")`` of a run whose checkpoints are in an object store gives the trial with the
    newest checkpoint's weights, as ``hookdet export runs/X`` exports them."""
    import torch

    from hookdet import pytorch
    from tests.support.resume_trials import RegressionTrial

    block = storage_block(kind, request)
    run_dir = tmp_path / "run"
    status, _, stderr = run(["run", str(write_config(tmp_path / "exp.yaml", checkpoint_storage=block)),
                             "--run-dir", str(run_dir)], f"{kind}: to 12", fault=False)
    assert status == 0, stderr[-3000:]
    assert not (run_dir / "checkpoints").exists()
    trial = pytorch.load_trial_from_checkpoint_path(str(run_dir), trial_class=RegressionTrial)
    status, _, stderr = run(["export", str(run_dir), str(tmp_path / "weights.pt")], f"{kind}: export", fault=False)
    assert status == 0, stderr[-3000:]
    exported = torch.load(tmp_path / "weights.pt", weights_only=True)
    loaded = trial.context.unwrapped_models[0].state_dict()
    assert sorted(loaded) == sorted(exported) and all(torch.equal(loaded[k], exported[k]) for k in loaded)
    assert downloads_of(os.getpid()) == []
