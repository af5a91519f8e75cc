"""Checkpoints belong to their run; one run, one history; one owner per run directory.

- Two experiments checkpoint into one ``shared_fs`` store: ``--resume STORE`` is refused with
  both runs listed; ``--resume RUN_DIR`` finds that run's checkpoints in the store, continues in
  the same run directory, and its retention never touches the other experiment's checkpoints.
- One run directory, one history: another run's checkpoint is not continued in a run directory,
  nor a copy of a run directory whose checkpoints stay the original's (in a shared folder, in S3).
- S3: ``--resume RUN_DIR`` finds the run's checkpoint in the bucket.
- SIGTERM, then ``--resume RUN_DIR`` alone: one run directory whose ``metrics.jsonl`` equals the
  uninterrupted run's step for step; a second run on a locked directory is refused naming the
  holder; stale ``.tmp-*`` writes are swept; ``--fork`` starts a new directory naming its parent.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from hookdet.runs.metrics import drop_reports_after, read_reports
from hookdet.checkpoints.resolver import read_identity
from tests.faults.harness import (
    assert_one_line,
    checkpoint_metadata,
    finish,
    run,
    start,
    wait_until,
    write_config,
)
from tests.support.s3_fixture import recording, s3_server  # noqa: F401  (a fixture)


def records_of(run_dir: Path) -> Dict[str, bytes]:
    """The bytes of a run directory's records (what a refused run must leave as it found)."""
    return {name: (run_dir / name).read_bytes()
            for name in ("run.json", "config.json", "metrics.jsonl", "run_identity.json", "history.jsonl")}


def reports(run_dir: Path) -> List[Any]:
    return [(r["group"], r["steps_completed"], r["metrics"]) for r in read_reports(run_dir)]


@pytest.mark.slow
def test_two_experiments_in_one_shared_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    storage = {"type": "shared_fs", "host_path": str(store)}
    stop_a = write_config(tmp_path / "a.yaml", {"lr": 0.01, "stop_at": 6}, checkpoint_storage=storage)
    exp_b = write_config(tmp_path / "b.yaml", {"lr": 0.05}, checkpoint_storage=storage)
    straight_a = write_config(tmp_path / "a_straight.yaml", {"lr": 0.01}, checkpoint_storage=dict(storage, host_path=str(tmp_path / "own")))
    runs = {name: start(["run", str(config), "--run-dir", str(tmp_path / name)])
            for name, config in (("a", stop_a), ("b", exp_b), ("straight", straight_a))}
    for name, process in runs.items():
        status, _, stderr = finish(process, f"shared store: {name}", fault=False)
        assert status == 0, stderr[-3000:]
    run_a, run_b = read_identity(tmp_path / "a")["run_id"], read_identity(tmp_path / "b")["run_id"]
    assert run_a != run_b
    by_run = {}
    for metadata in checkpoint_metadata(store):
        by_run.setdefault(metadata["run_id"], []).append(metadata["uuid"])
    assert set(by_run) == {run_a, run_b}
    b_checkpoints = sorted(by_run[run_b])

    # The store alone is ambiguous: refused, both runs named, nothing changed.
    status, _, stderr = run(["run", str(stop_a), "--resume", str(store), "--run-dir", str(tmp_path / "x")], "resume STORE")
    assert status == 2
    assert_one_line(stderr, "holds checkpoints of 2 runs", run_a, run_b)

    # One run directory, one history: b's checkpoint is not continued in a's directory, and a
    # copy of a, whose checkpoints are a's in the store, is not continued as a second a. Both
    # are refused before anything is written.
    before = records_of(tmp_path / "a")
    status, _, stderr = run(["run", str(stop_a), "--resume", str(tmp_path / "b"), "--run-dir", str(tmp_path / "a")],
                            "resume another run's checkpoint")
    assert status == 2
    assert_one_line(stderr, f"written by run {run_b}", f"the directory holds run {run_a}", "one run directory, one history")
    assert records_of(tmp_path / "a") == before
    shutil.copytree(tmp_path / "a", tmp_path / "a-copy")
    status, _, stderr = run(["run", str(stop_a), "--resume", str(tmp_path / "a-copy")], "resume a copy")
    assert status == 2
    assert_one_line(stderr, f"{tmp_path / 'a-copy'}: it is a copy of {tmp_path / 'a'}", run_a, "shares its checkpoint storage")
    assert records_of(tmp_path / "a-copy") == before
    shutil.rmtree(tmp_path / "a-copy")

    # The run directory leads to its own checkpoints in the store and continues there.
    status, stdout, stderr = run(["run", str(stop_a), "--resume", str(tmp_path / "a")], "resume RUN_DIR (shared_fs)", fault=False)
    assert status == 0, stderr[-3000:]
    assert "resumed from checkpoint" in stderr and f"run directory: {(tmp_path / 'a').resolve()}" in stdout
    assert reports(tmp_path / "a") == reports(tmp_path / "straight")  # one history, no step twice
    after = {}
    for metadata in checkpoint_metadata(store):
        after.setdefault(metadata["run_id"], []).append(metadata)
    assert sorted(m["uuid"] for m in after[run_b]) == b_checkpoints  # retention kept to its own
    assert max(m["steps_completed"] for m in after[run_a]) == 12
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["a", "b", "own", "store", "straight"]


@pytest.mark.slow
def test_resume_run_dir_finds_its_checkpoint_in_s3(tmp_path: Path, s3_server: Dict[str, str]) -> None:  # noqa: F811
    storage = {"type": "s3", "bucket": s3_server["bucket"], "endpoint_url": s3_server["endpoint_url"], "prefix": "exp"}
    config = write_config(tmp_path / "s3.yaml", {"stop_at": 6}, checkpoint_storage=storage)
    status, _, stderr = run(["run", str(config), "--run-dir", str(tmp_path / "run")], "s3: stop at 6", fault=False)
    assert status == 0, stderr[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
    with recording(s3_server["endpoint_url"]) as requests_made:
        status, stdout, stderr = run(["run", str(config), "--resume", str(tmp_path / "run")], "s3: resume RUN_DIR", fault=False)
    assert status == 0, stderr[-3000:]
    assert "at batch 6" in stderr and "s3://" in stdout
    # The resumed checkpoint's state is downloaded once; finding it reads metadata only, and
    # each object is fetched once (the metadata read to choose it is not fetched again).
    gets = [url.split("?")[0] for method, url in requests_made if method == "GET" and "/exp/" in url]
    assert len([url for url in gets if url.endswith("/state_dict.pth")]) == 1, requests_made
    assert sorted(set(gets)) == sorted(gets), requests_made
    steps = [r["steps_completed"] for r in read_reports(tmp_path / "run") if r["group"] == "training"]
    assert steps == list(range(1, 13))
    # A copy of the run directory shares its checkpoints in the bucket: it is not a second run.
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    status, _, stderr = run(["run", str(config), "--resume", str(tmp_path / "copy")], "s3: resume a copy")
    assert status == 2
    assert_one_line(stderr, f"it is a copy of {tmp_path / 'run'}", "shares its checkpoint storage")


@pytest.mark.slow
def test_sigterm_then_resume_is_one_run_with_one_history(tmp_path: Path) -> None:
    hold = tmp_path / "hold"  # while it exists, the victim trains no further than its fourth batch
    hold.touch()
    config = write_config(tmp_path / "exp.yaml", {"hold_while": str(hold)})
    straight = start(["run", str(write_config(tmp_path / "straight.yaml")), "--run-dir", str(tmp_path / "straight")])
    run_dir = tmp_path / "run"
    victim = start(["run", str(config), "--run-dir", str(run_dir)])
    wait_until(lambda: (run_dir / "metrics.jsonl").exists() and len(reports(run_dir)) >= 3, victim, "3 reports")

    # A second run, and a resume, of the locked directory are refused, naming the holder.
    rivals = {case: start(["run", str(config), "--run-dir", str(run_dir), *extra])
              for extra, case in (([], "second run, locked dir"), (["--resume", str(run_dir)], "resume, locked dir"))}
    for case, rival in rivals.items():
        status, _, stderr = finish(rival, case)
        assert status == 2, stderr[-3000:]
        assert_one_line(stderr, str(run_dir), f"pid {victim.pid} on host {socket.gethostname()}")
    assert victim.poll() is None, "the refusals were tested while the owner was training"

    signalled = time.monotonic()
    victim.send_signal(signal.SIGTERM)
    hold.unlink()
    status, _, stderr = finish(victim, "SIGTERM", since=signalled)
    assert status == 75, stderr[-3000:]
    stopped_at = max(m["steps_completed"] for m in checkpoint_metadata(run_dir / "checkpoints"))
    assert stopped_at == 4  # the batch it was held in

    # A write killed earlier left a hidden directory; the resume sweeps it under the lock.
    stale = run_dir / "checkpoints" / ".tmp-0123-dead"
    stale.mkdir()
    (stale / "state_dict.pth").write_bytes(os.urandom(1024))
    status, _, stderr = run(["run", str(config), "--resume", str(run_dir)], "resume after SIGTERM", fault=False)
    assert status == 0, stderr[-3000:]
    assert not stale.exists()
    status, _, stderr = finish(straight, "straight", fault=False)
    assert status == 0, stderr[-3000:]
    assert reports(run_dir) == reports(tmp_path / "straight")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["run", "straight"]

    # A copy (cp -r) that took its checkpoints along is a run of its own: a new run id, the
    # original its parent; the original keeps its id.
    shutil.copytree(run_dir, tmp_path / "copy")
    status, _, stderr = run(["run", str(config), "--resume", str(tmp_path / "copy")], "resume a copy", fault=False)
    assert status == 0, stderr[-3000:]
    copy, original = read_identity(tmp_path / "copy"), read_identity(run_dir)
    assert copy["run_id"] != original["run_id"]
    assert copy["parent"] == {"run_dir": str(run_dir), "run_id": original["run_id"], "copied": True}
    shutil.rmtree(tmp_path / "copy")

    # --fork: a new directory that records its parent and leaves the parent's checkpoints alone.
    parent_checkpoints = sorted(m["uuid"] for m in checkpoint_metadata(run_dir / "checkpoints"))
    longer = write_config(tmp_path / "longer.yaml", {"sleep": 0.0}, searcher={
        "name": "single", "metric": "validation_loss", "smaller_is_better": True, "max_length": {"batches": 16}})
    status, _, stderr = run(["run", str(longer), "--resume", str(run_dir), "--fork", "--run-dir", str(tmp_path / "fork")], "fork", fault=False)
    assert status == 0, stderr[-3000:]
    fork, parent = read_identity(tmp_path / "fork"), read_identity(run_dir)
    assert fork["parent"]["run_id"] == parent["run_id"] != fork["run_id"]
    assert sorted(m["uuid"] for m in checkpoint_metadata(run_dir / "checkpoints")) == parent_checkpoints
    assert "retention deleted" not in stderr or all(u not in stderr for u in parent_checkpoints)


def test_resume_drops_reports_a_killed_run_made_after_its_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    records = [{"group": "training", "steps_completed": step, "metrics": {}} for step in range(1, 7)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"group": "trai')  # torn last line
    assert drop_reports_after(tmp_path, 4) == 3
    assert [r["steps_completed"] for r in read_reports(tmp_path)] == [1, 2, 3, 4]
    assert path.read_text().endswith("\n")  # the torn line is gone too


def test_a_resume_leaves_unfinished_writes_in_a_symlinked_store_alone(tmp_path: Path) -> None:
    """``R/checkpoints`` a symlink to a shared folder (bulky data moved to a bigger disk): a
    ``.tmp-*`` entry there may be another run's write in progress, so ``--resume R`` keeps it;
    what makes a store the run's own is where it resolves, not the path that names it."""
    shared, run_dir = tmp_path / "bigger-disk" / "checkpoints", tmp_path / "run"
    shared.mkdir(parents=True)
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(shared, target_is_directory=True)
    config = write_config(tmp_path / "exp.yaml")
    status, _, stderr = run(["run", str(config), "--run-dir", str(run_dir)], "through a symlink", fault=False)
    assert status == 0, stderr[-3000:]
    assert checkpoint_metadata(shared), "the checkpoints went through the symlink"
    others = shared / ".tmp-4567-another-runs-write"
    others.mkdir()
    (others / "state_dict.pth").write_bytes(os.urandom(1024))
    longer = write_config(tmp_path / "longer.yaml", searcher={
        "name": "single", "metric": "validation_loss", "smaller_is_better": True, "max_length": {"batches": 16}})
    status, _, stderr = run(["run", str(longer), "--resume", str(run_dir)], "resume through a symlink", fault=False)
    assert status == 0, stderr[-3000:]
    assert others.is_dir() and (others / "state_dict.pth").stat().st_size == 1024


def test_an_oversized_metadata_file_is_skipped_in_one_line_and_the_older_checkpoint_used(tmp_path: Path) -> None:
    """The newest checkpoint's ``metadata.json`` grown to 8 GB (sparse: no disk is used) is
    refused by its size before a byte is read, in one line naming it; the resume continues from
    the checkpoint before it, and so does ``load_trial_from_checkpoint_path``."""
    from hookdet import pytorch

    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "exp.yaml", checkpoint_storage={"save_trial_latest": 5})
    status, _, stderr = run(["run", str(config), "--run-dir", str(run_dir)], "three checkpoints", fault=False)
    assert status == 0, stderr[-3000:]
    by_step = {m["steps_completed"]: m["uuid"] for m in checkpoint_metadata(run_dir / "checkpoints")}
    assert sorted(by_step) == [4, 8, 12]
    oversized = run_dir / "checkpoints" / by_step[12] / "metadata.json"
    with open(oversized, "r+b") as handle:
        handle.truncate(8 * 2**30)
    from tests.support.resume_trials import RegressionTrial

    trial = pytorch.load_trial_from_checkpoint_path(str(run_dir), trial_class=RegressionTrial)
    assert trial.context.get_hparams()["records"] == 160
    longer = write_config(tmp_path / "longer.yaml", checkpoint_storage={"save_trial_latest": 5}, searcher={
        "name": "single", "metric": "validation_loss", "smaller_is_better": True, "max_length": {"batches": 16}})
    status, _, stderr = run(["run", str(longer), "--resume", str(run_dir)], "oversized metadata", fault=False)
    assert status == 0, stderr[-3000:]
    skipped = [line for line in stderr.splitlines() if "skipping" in line]
    assert len(skipped) == 1 and f"{oversized}: 8589934592 bytes, more than a checkpoint's metadata.json can be" \
        in skipped[0], stderr[-3000:]
    assert f"resumed from checkpoint {run_dir / 'checkpoints' / by_step[8]} at batch 8" in stderr, stderr[-3000:]


def test_a_file_of_a_checkpoint_that_leads_out_of_it_is_refused_and_the_older_checkpoint_used(tmp_path: Path) -> None:
    """The newest checkpoint's ``state_dict.pth`` replaced by a symlink to a file elsewhere (the
    same bytes: the manifest alone would pass it): refused in one line naming where it leads;
    the resume continues from the checkpoint before it."""
    import shutil

    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "exp.yaml", checkpoint_storage={"save_trial_latest": 5})
    status, _, stderr = run(["run", str(config), "--run-dir", str(run_dir)], "three checkpoints", fault=False)
    assert status == 0, stderr[-3000:]
    by_step = {m["steps_completed"]: m["uuid"] for m in checkpoint_metadata(run_dir / "checkpoints")}
    state = run_dir / "checkpoints" / by_step[12] / "state_dict.pth"
    elsewhere = tmp_path / "elsewhere.pth"
    shutil.move(state, elsewhere)
    state.symlink_to(elsewhere)
    longer = write_config(tmp_path / "longer.yaml", checkpoint_storage={"save_trial_latest": 5}, searcher={
        "name": "single", "metric": "validation_loss", "smaller_is_better": True, "max_length": {"batches": 16}})
    status, _, stderr = run(["run", str(longer), "--resume", str(run_dir)], "symlink out of a checkpoint", fault=False)
    assert status == 0, stderr[-3000:]
    skipped = [line for line in stderr.splitlines() if "skipping" in line]
    assert len(skipped) == 1 and f"state_dict.pth leads out of the checkpoint (to {elsewhere}" in skipped[0], skipped
    assert "at batch 8" in stderr, stderr[-3000:]
