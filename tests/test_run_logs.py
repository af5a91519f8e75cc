"""A run keeps what its processes printed, as Determined kept each trial's logs, and ``hookdet
logs RUN [--follow] [--rank N]`` prints them: both ranks of a 2-rank run, followed live, bounded
under a run that prints without end, continued by a resume."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import List

import pytest

from tests.builtin_plugins.test_progress import open_terminal, read_until_closed
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


#: A command that never calls hookdet: a line on each stream, a coloured line redrawn with ``\r``,
#: and whether its streams are terminals (of what width).
TALKER = '''\
import os, sys
print("to stdout", flush=True)
print("to stderr", file=sys.stderr, flush=True)
print("\\x1b[31mred\\x1b[0m 10%\\rdone 100%", flush=True)
print("terminals:", sys.stdout.isatty(), sys.stderr.isatty(),
      os.get_terminal_size().columns if sys.stdout.isatty() else None, flush=True)
'''


def write_talker(directory: Path) -> Path:
    (directory / "talk.py").write_text(TALKER)
    experiment = directory / "talk.yaml"
    experiment.write_text("name: talk\nentrypoint: python3 talk.py\nsearcher: {name: single, metric: x}\n")
    return experiment


def logged(run_dir: Path) -> List[tuple]:
    """``(stream, text)`` of each line of the run's log."""
    stamped = re.compile(r"^\[[^]]+\] \[rank=0\] \[(\w+)\] (.*)$")
    return [stamped.match(line).groups() for line in logs(str(run_dir))]


def test_a_command_that_never_calls_hookdet_keeps_what_it_printed_as_its_log(tmp_path: Path) -> None:
    """Off a terminal, each stream is its own pipe: both are shown as they were and logged with
    their stream, a redraw once as last drawn, without colours."""
    finished = hookdet_process.run("run", write_talker(tmp_path), "--run-dir", "run", cwd=tmp_path, env=child_env())
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "to stdout\n" in finished.stdout and "to stderr\n" in finished.stderr
    assert "\x1b[31mred\x1b[0m 10%" in finished.stdout  # shown as drawn
    assert "terminals: False False None\n" in finished.stdout
    lines = logged(tmp_path / "run")
    assert [text for stream, text in lines if stream == "stdout"] == ["to stdout", "done 100%", "terminals: False False None"]
    assert [text for stream, text in lines if stream == "stderr"] == ["to stderr"]
    assert [path.name for path in (tmp_path / "run" / "logs").iterdir()] == ["rank-0.log"]


@pytest.mark.slow
def test_in_a_terminal_the_command_gets_a_terminal_of_its_size_and_its_lines_in_order(tmp_path: Path) -> None:
    """Cold, in a pseudo-terminal (a terminal is what only a new process shows): the command's
    streams are terminals 97 columns wide, what it drew reaches the terminal as drawn, and the
    log keeps its lines in the order written, as one stream."""
    controller, terminal = open_terminal(columns=97)
    process = subprocess.Popen([sys.executable, "-m", "hookdet", "run", str(write_talker(tmp_path)), "--run-dir", "run"],
                               stdin=terminal, stdout=terminal, stderr=terminal, cwd=tmp_path, close_fds=True,
                               env=child_env(), start_new_session=True)
    os.close(terminal)
    screen = read_until_closed(controller, timeout=300)
    assert process.wait(timeout=60) == 0, screen
    assert "terminals: True True 97" in screen and "\x1b[31mred\x1b[0m 10%\rdone 100%" in screen
    assert logged(tmp_path / "run") == [("output", "to stdout"), ("output", "to stderr"), ("output", "done 100%"),
                                        ("output", "terminals: True True 97")]


def test_a_script_that_logs_itself_keeps_only_its_own_log(tmp_path: Path) -> None:
    """A Trainer-API script keeps its own ``logs/rank-0.log`` (streams told apart from inside),
    not a second copy of its output from ``hookdet run``."""
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import hookdet as det
        from hookdet import pytorch
        from tests.support.trials import OneWeightTrial

        with pytorch.init() as context:
            print("the script's own line", flush=True)
            pytorch.Trainer(OneWeightTrial(context), context).fit(max_length=pytorch.Batch(2))
        """))
    experiment = tmp_path / "train.yaml"
    experiment.write_text("name: own\nentrypoint: python3 train.py\n"
                          "searcher: {name: single, metric: validation_loss}\nhyperparameters: {lr: 0.1, records: 8, global_batch_size: 2}\n")
    finished = hookdet_process.run("run", experiment, "--run-dir", "run", cwd=tmp_path,
                                   env=child_env(PYTHONPATH=str(REPO)))
    assert finished.returncode == 0, finished.stderr[-2000:]
    lines = logged(tmp_path / "run")
    assert lines == [("stdout", "the script's own line")]
