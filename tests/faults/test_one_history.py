"""One run directory, one history: what a user can do to a run directory and what is left of it.

- ``hookdet run`` into a directory that holds a run, without ``--resume``: refused in one line
  naming ``--resume``; the run's files stay byte for byte.
- The run directory's lock is held on the directory itself: deleting ``.hookdet.lock`` while
  the run trains lets no second writer in.
- A ``--resume`` that fails (a checkpoint the trial does not fit) leaves ``run.json``,
  ``config.json`` and ``metrics.jsonl`` byte for byte as they were.
- A damaged newest checkpoint (metadata nested 200,000 deep, a manifest entry of the wrong type,
  a hand-edited file) is skipped with one line naming it, and the resume continues from the
  newest intact one, equal to a run never damaged.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Dict

import pytest

from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import lookup
from hookdet.runs.files import CONFIG_FILE, LOCK_FILE, METRICS_FILE, RUN_RECORD_FILE
from tests.faults.harness import assert_one_line, finish, run, start, wait_until, write_config

RECORDS = (RUN_RECORD_FILE, CONFIG_FILE, METRICS_FILE)


def snapshot(run_dir: Path) -> Dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in RECORDS}


def trained(config: Path, run_dir: Path, case: str) -> Dict[str, bytes]:
    status, _, stderr = run(["run", str(config), "--run-dir", str(run_dir)], case, fault=False)
    assert status == 0, stderr[-3000:]
    return snapshot(run_dir)


def test_a_second_run_into_a_run_directory_is_refused_naming_resume(tmp_path: Path) -> None:
    config = write_config(tmp_path / "exp.yaml")
    run_dir = tmp_path / "run"
    before = trained(config, run_dir, "first run")

    status, _, stderr = run(["run", str(config), "--run-dir", str(run_dir)], "second run, same directory")
    assert status == 2
    assert_one_line(stderr, str(run_dir), "already holds a run (completed)", f"--resume {run_dir}")
    assert snapshot(run_dir) == before


@pytest.mark.slow
def test_deleting_the_lock_file_lets_no_second_writer_in(tmp_path: Path) -> None:
    config = write_config(tmp_path / "exp.yaml", {"sleep": 2.0})
    run_dir = tmp_path / "run"
    owner = start(["run", str(config), "--run-dir", str(run_dir)])
    wait_until(lambda: (run_dir / METRICS_FILE).is_file(), owner, "the owner's first report")
    (run_dir / LOCK_FILE).unlink()

    status, _, stderr = run(["run", str(config), "--resume", str(run_dir)], "resume after the lock file was deleted")
    assert status == 2, stderr[-3000:]
    assert_one_line(stderr, str(run_dir), "in use by another hookdet run")
    assert owner.poll() is None, "the second writer was refused while the owner trained"
    owner.send_signal(signal.SIGTERM)
    status, _, stderr = finish(owner, "owner, SIGTERM", fault=False)
    assert status == 75, stderr[-3000:]


@pytest.mark.slow
def test_a_failed_resume_leaves_every_record_as_it_was(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    before = trained(write_config(tmp_path / "exp.yaml"), run_dir, "first run")

    # Another model shape: the checkpoint does not fit, refused before training a batch.
    wider = write_config(tmp_path / "wider.yaml", {"hidden": 32})
    status, _, stderr = run(["run", str(wider), "--resume", str(run_dir)], "resume that fails")
    assert status == 2, stderr[-3000:]
    assert_one_line(stderr, "cannot resume", "does not match")
    assert snapshot(run_dir) == before
    assert json.loads(before[RUN_RECORD_FILE])["state"] == "completed"


def damage_deep(metadata_path: Path) -> None:
    metadata_path.write_text("[" * 200_000 + "]" * 200_000)


def damage_manifest_type(metadata_path: Path) -> None:
    metadata = json.loads(metadata_path.read_text())
    metadata["files"][fmt.STATE_FILE] = 5
    metadata_path.write_text(json.dumps(metadata))


def damage_hand_edit(metadata_path: Path) -> None:
    metadata = json.loads(metadata_path.read_text())
    metadata["steps_completed"] += 1000
    metadata_path.write_text(json.dumps(metadata))


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_skipped_with_a_line_and_resume_goes_on(tmp_path: Path) -> None:
    keep_all = {"save_trial_latest": 10, "save_trial_best": 0}
    stop = write_config(tmp_path / "stop.yaml", {"stop_at": 8}, checkpoint_storage=keep_all)
    whole = write_config(tmp_path / "whole.yaml", checkpoint_storage=keep_all)
    straight = trained(whole, tmp_path / "straight", "never stopped")

    run_dir = tmp_path / "run"
    trained(stop, run_dir, "stop at 8")
    found = lookup.find_checkpoints(run_dir / "checkpoints")
    assert [metadata["steps_completed"] for _, metadata in found] == [4, 8]
    newest = found[-1][0]
    # Each damage is refused alone, with its reason, and never crashes the lookup.
    for damage, reason in ((damage_deep, "nested"), (damage_manifest_type, "manifest entry"), (damage_hand_edit, "digest")):
        original = (newest / fmt.METADATA_FILE).read_bytes()
        damage(newest / fmt.METADATA_FILE)
        with pytest.raises(fmt.CheckpointError, match=reason):
            fmt.read_metadata(newest)
        assert [path for path, _ in lookup.find_checkpoints(run_dir / "checkpoints")] == [found[0][0]]
        (newest / fmt.METADATA_FILE).write_bytes(original)

    damage_deep(newest / fmt.METADATA_FILE)
    status, _, stderr = run(["run", str(whole), "--resume", str(run_dir)], "resume past a damaged checkpoint", fault=False)
    assert status == 0, stderr[-3000:]
    skipped = [line for line in stderr.splitlines() if "skipping" in line and newest.name in line]
    assert len(skipped) == 1 and "nested" in skipped[0], stderr[-3000:]
    assert "at batch 4" in stderr
    assert "Traceback" not in stderr
    reports = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    expected = [json.loads(line) for line in straight[METRICS_FILE].decode().splitlines()]
    assert [(r["group"], r["steps_completed"], r["metrics"]) for r in reports] == [
        (r["group"], r["steps_completed"], r["metrics"]) for r in expected
    ]


@pytest.mark.slow
def test_the_history_is_the_hosts_record_with_metrics_log_off(tmp_path: Path) -> None:
    stop = write_config(tmp_path / "stop.yaml", {"stop_at": 6}, plugins=["no:metrics_log"])
    whole = write_config(tmp_path / "whole.yaml", plugins=["no:metrics_log"])
    run_dir = tmp_path / "run"
    trained(stop, run_dir, "stop at 6, no:metrics_log")
    status, _, stderr = run(["run", str(whole), "--resume", str(run_dir)], "resume, no:metrics_log", fault=False)
    assert status == 0, stderr[-3000:]
    reports = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    assert [r["steps_completed"] for r in reports if r["group"] == "training"] == list(range(1, 13))
    status, shown, stderr = run(["show", str(run_dir)], "show, no:metrics_log", fault=False)
    assert status == 0, stderr[-3000:]
    assert "batches: 12/12" in shown
    loss_row = next(line.split() for line in shown.splitlines() if line.split()[:2] == ["training", "loss"])
    assert loss_row[2] == "12"  # every training report, read from the host's record


@pytest.mark.slow
def test_sigterm_at_any_batch_then_resume_gives_the_uninterrupted_history(tmp_path: Path) -> None:
    """Reports every 5 batches; a real SIGTERM after batch 3, 7 and 13 (between reports) and 10
    (on one): each resumed run's ``metrics.jsonl`` equals the uninterrupted run's, value for
    value, because the stop carries its workload's batches in the checkpoint instead of
    reporting them."""
    fields = dict(scheduling_unit=5, min_validation_period={"batches": 10}, min_checkpoint_period={"batches": 10},
                  searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                            "max_length": {"batches": 20}})
    straight = trained(write_config(tmp_path / "straight.yaml", **fields), tmp_path / "straight", "straight")
    expected = [json.loads(line) for line in straight[METRICS_FILE].decode().splitlines()]
    whole = write_config(tmp_path / "whole.yaml", **fields)
    for batch in (3, 7, 10, 13):
        run_dir = tmp_path / f"sigterm-{batch}"
        config = write_config(tmp_path / f"sigterm-{batch}.yaml", {"sigterm_at": batch}, **fields)
        status, _, stderr = run(["run", str(config), "--run-dir", str(run_dir)], f"SIGTERM after batch {batch}", fault=False)
        assert status == 75, stderr[-3000:]
        assert f"checkpoint saved at batch {batch}" in stderr
        status, _, stderr = run(["run", str(whole), "--resume", str(run_dir)], f"resume after {batch}", fault=False)
        assert status == 0, stderr[-3000:]
        reports = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
        assert [(r["group"], r["steps_completed"], r["metrics"]) for r in reports] == [
            (r["group"], r["steps_completed"], r["metrics"]) for r in expected
        ], f"SIGTERM after batch {batch}"


@pytest.mark.slow
def test_sigterm_between_reports_on_two_ranks_then_resume_gives_the_uninterrupted_history(tmp_path: Path) -> None:
    """The same on 2 gloo ranks: each rank carries its own batches, averaged across ranks at the
    resumed run's next report as they would have been. (Batches of 0.25 s, so the ranks agree
    on the stop after every batch: it lands after batch 8, between two reports.)"""
    fields = dict(scheduling_unit=5, min_validation_period={"batches": 10}, min_checkpoint_period={"batches": 10},
                  resources={"slots_per_trial": 2},
                  searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                            "max_length": {"batches": 15}})
    straight = trained(write_config(tmp_path / "straight.yaml", **fields), tmp_path / "straight", "2 ranks, straight")
    run_dir = tmp_path / "stopped"
    status, _, stderr = run(["run", str(write_config(tmp_path / "stop.yaml", {"sigterm_at": 7, "sleep": 0.25}, **fields)),
                             "--run-dir", str(run_dir)], "2 ranks, SIGTERM after batch 7", fault=False)
    assert status == 75, stderr[-3000:]
    stopped = [json.loads(line)["steps_completed"] for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    assert stopped == [5], stopped  # nothing reported at the stop
    status, _, stderr = run(["run", str(write_config(tmp_path / "whole.yaml", **fields)), "--resume", str(run_dir)],
                            "2 ranks, resume", fault=False)
    assert status == 0, stderr[-3000:]
    assert (run_dir / METRICS_FILE).read_bytes().count(b"\n") == straight[METRICS_FILE].count(b"\n")
    reports = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    expected = [json.loads(line) for line in straight[METRICS_FILE].decode().splitlines()]
    assert [(r["group"], r["steps_completed"], r["metrics"]) for r in reports] == [
        (r["group"], r["steps_completed"], r["metrics"]) for r in expected
    ]
