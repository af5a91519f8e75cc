"""A run keeps what its processes printed, as Determined kept each trial's logs, and ``hookdet
logs RUN [--follow] [--rank N]`` prints them: both ranks of a 2-rank run, followed live, bounded
under a run that prints without end, continued by a resume."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from tests.faults.harness import REPO, TESTS, child_env, run, write_config
from tests.support import hookdet_process
from tests.support.distributed_trials import write_config as write_distributed_config

STAMPED = re.compile(r"^\[(\d{4}-\d\d-\d\dT[0-9:.]+\+00:00)\] \[rank=(\d+)\] \[(stdout|stderr)\] ")


def logs(*args: str) -> List[str]:
    result = hookdet_process.run("logs", *args, cwd=REPO, env=child_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_a_run_keeps_what_it_printed_and_a_resume_continues_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    status, _, stderr = run(["run", str(write_config(tmp_path / "exp.yaml", {"stop_at": 4})), "--run-dir",
                             str(run_dir)], "to 4", fault=False)
    assert status == 0, stderr[-3000:]
    whole = write_config(tmp_path / "whole.yaml")
    status, _, stderr = run(["run", str(whole), "--resume", str(run_dir)], "resumed", fault=False)
    assert status == 0, stderr[-3000:]
    lines = logs(str(run_dir))
    assert all(STAMPED.match(line) for line in lines), [line for line in lines if not STAMPED.match(line)][:3]
    stamps = [STAMPED.match(line).group(1) for line in lines]
    assert stamps == sorted(stamps)
    text = "\n".join(lines)
    assert "[stdout] hookdet: stopped after 4 batches" in text  # the first run's ending
    assert "resumed from checkpoint" in text and "[stdout] hookdet: completed after 12 batches" in text
    assert text.index("stopped after 4 batches") < text.index("resumed from checkpoint")
    assert [path.name for path in (run_dir / "logs").iterdir()] == ["rank-0.log"]


@pytest.mark.slow
def test_both_ranks_of_a_two_rank_run_are_kept_and_one_can_be_chosen(tmp_path: Path) -> None:
    config = write_distributed_config(tmp_path / "exp.yaml", {"global_batch_size": 4, "lr": 0.1, "records": 28},
                                      resources={"slots_per_trial": 2},
                                      plugins={"only": ["callbacks", "checkpoint", "ddp", "run_log"]})
    run_dir = tmp_path / "run"
    status, _, stderr = run(["run", str(config), "--run-dir", str(run_dir), "--model-dir", str(TESTS)],
                            "2 ranks", fault=False)
    assert status == 0, stderr[-3000:]
    lines = logs(str(run_dir))
    ranks = {STAMPED.match(line).group(2) for line in lines}
    assert ranks == {"0", "1"}
    assert any("ddp: rank 1 of 2" in line and "[rank=1]" in line for line in lines)
    only_one = logs(str(run_dir), "--rank", "1")
    assert only_one and all("[rank=1]" in line for line in only_one)
    assert only_one == [line for line in lines if "[rank=1]" in line]


@pytest.mark.slow
def test_the_logs_are_bounded_however_much_a_run_prints(tmp_path: Path) -> None:
    """200 lines of ~100 bytes per batch for 40 batches (800 KB), into files of 16 KiB, two
    kept: the oldest lines are dropped, the newest kept, the files never pass the bound."""
    config = write_config(tmp_path / "exp.yaml", {"chatter": 200}, searcher={
        "name": "single", "metric": "validation_loss", "max_length": {"batches": 40}},
        plugin_config={"run_log": {"max_bytes": 16384, "backups": 2}})
    run_dir = tmp_path / "run"
    status, _, stderr = run(["run", str(config), "--run-dir", str(run_dir)], "chatter", fault=False)
    assert status == 0, stderr[-3000:]
    files = sorted(path.name for path in (run_dir / "logs").iterdir())
    assert files == ["rank-0.log", "rank-0.log.1", "rank-0.log.2"]
    assert all((run_dir / "logs" / name).stat().st_size <= 16384 for name in files)
    lines = logs(str(run_dir))
    assert "completed after 40 batches" in lines[-3] or any("completed after 40" in line for line in lines[-5:])
    assert not any("batch 0 says" in line for line in lines)  # the oldest were dropped


@pytest.mark.slow
def test_logs_follow_a_live_run_to_its_end(tmp_path: Path) -> None:
    config = write_config(tmp_path / "exp.yaml", {"sleep": 0.05}, searcher={
        "name": "single", "metric": "validation_loss", "max_length": {"batches": 60}})
    run_dir = tmp_path / "run"
    training = hookdet_process.start("run", config, "--run-dir", run_dir, "--model-dir", TESTS, cwd=REPO, env=child_env())
    deadline = time.monotonic() + 120
    while not (run_dir / "logs" / "rank-0.log").exists():
        assert training.poll() is None and time.monotonic() < deadline, "no log appeared"
        time.sleep(0.05)
    # as typed, its output read as it comes: a pipe
    follower = subprocess.Popen([sys.executable, "-m", "hookdet", "logs", str(run_dir), "--follow"], cwd=REPO,
                                env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = follower.stdout.readline()
        assert STAMPED.match(first), first
        assert training.wait(timeout=300) == 0
        rest = follower.stdout.read()  # from the same buffer: readline() may have read ahead
        follower.wait(timeout=60)  # it ends by itself once the run has ended
        errors = follower.stderr.read()
    finally:
        for process in (training, follower):
            if process.poll() is None:
                process.kill()
    assert follower.returncode == 0, errors
    followed = [first.rstrip("\n"), *rest.splitlines()]
    assert followed == logs(str(run_dir))
    assert "completed after 60 batches" in "\n".join(followed[-4:])


def test_a_log_that_cannot_be_written_is_reported_once_and_the_run_trains_on(tmp_path: Path) -> None:
    """A run resumed three times, its log broken each time a new way: ``logs`` a file, its
    ``rank-0.log`` a folder, and ``rank-0.log`` a symlink to a file outside the run. Each resume
    trains to its end (exit 0) with one warning naming the file and why; nothing is written
    outside the run, and what was in the way is left as it was."""
    run_dir = tmp_path / "run"
    status, _, stderr = run(["run", str(write_config(tmp_path / "to4.yaml", {"stop_at": 4})), "--run-dir",
                             str(run_dir)], "to 4", fault=False)
    assert status == 0, stderr[-3000:]
    log = run_dir / "logs" / "rank-0.log"
    outside = tmp_path / "elsewhere.log"
    outside.write_text("not the run's\n")

    def logs_a_file() -> str:
        shutil.rmtree(run_dir / "logs")
        (run_dir / "logs").write_text("a file\n")
        return "logs is not a folder"

    def rank_log_a_folder() -> str:
        assert (run_dir / "logs").read_text() == "a file\n"  # as the last resume found it
        (run_dir / "logs").unlink()
        log.mkdir(parents=True)
        return "rank-0.log is a folder"

    def rank_log_leads_outside() -> str:
        log.rmdir()  # as the last resume found it: an empty folder
        log.symlink_to(outside)
        return f"rank-0.log leads outside the run, to {outside}"

    for stop_at, breaking in ((6, logs_a_file), (8, rank_log_a_folder), (None, rank_log_leads_outside)):
        why = breaking()
        config = write_config(tmp_path / f"to{stop_at}.yaml", {} if stop_at is None else {"stop_at": stop_at})
        status, stdout, stderr = run(["run", str(config), "--resume", str(run_dir)], breaking.__name__, fault=False)
        assert status == 0, stderr[-3000:]
        warnings = [line.split(" WARNING ", 1)[-1] for line in stderr.splitlines() if "cannot be written" in line]
        assert warnings == [f"run_log: {log} cannot be written ({why}); the run trains on without its log"], stderr[-3000:]
        assert "Traceback" not in stderr
        assert (f"after {stop_at} batches" if stop_at else "completed after 12 batches") in stdout
    assert outside.read_text() == "not the run's\n" and log.is_symlink()
