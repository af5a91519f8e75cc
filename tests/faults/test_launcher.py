"""The 2-slot launcher: no orphans when it dies by any signal, one voice when ranks stop or fail.

``hookdet run`` with ``slots_per_trial: 2`` starts torchrun, which starts two ranks, each in a
session of its own. SIGKILL of ``hookdet run`` must take torchrun and both ranks along (within
seconds, not when training would have ended); a SIGTERM stop exits 75 without torchrun's
traceback; a config error every rank hits is printed once.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Set

import pytest
import yaml

import hookdet
from tests.support.hookdet_process import Hookdet
from tests.faults.harness import REPO, TESTS, assert_one_line, child_env, error_lines, finish, start, wait_until

#: hookdet's own package directory, whose frames a user's traceback leaves out.
HOOKDET_PACKAGE = Path(hookdet.__file__).resolve().parent

HPARAMS = {"global_batch_size": 4, "lr": 0.1, "records": 28, "with_buffer": True}


def write_config(path: Path, **hparams: object) -> Path:
    config = {
        "name": "launcher-fault",
        "entrypoint": "distributed_trials:LinearTrial",
        "hyperparameters": dict(HPARAMS, **hparams),
        "searcher": {"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                     "max_length": {"batches": 2000}},
        "scheduling_unit": 1,
        "resources": {"slots_per_trial": 2},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def children_by_parent() -> Dict[int, List[int]]:
    """Each live process's children, by the parent links in /proc."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> Set[int]:
    """Every live process below ``pid``."""
    children = children_by_parent()
    found: Set[int] = set()
    todo: List[int] = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pids: Set[int]) -> Set[int]:
    living = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            living.add(pid)
    return living


@pytest.mark.slow
def test_sigkill_of_the_launcher_leaves_no_process_of_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launcher = start(["run", str(write_config(tmp_path / "exp.yaml", sleep=0.2)), "--run-dir", str(run_dir)])
    tree: Set[int] = set()
    try:
        def two_ranks_training() -> bool:
            tree.update(descendants(launcher.pid))
            return (run_dir / "metrics.jsonl").exists() and len(tree) >= 3  # torchrun + 2 ranks
        wait_until(two_ranks_training, launcher, "both ranks to train", timeout=300)
        assert alive(tree), "the run's processes are alive before the kill"
        killed_at = time.monotonic()
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 30
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = alive(tree)
        assert not survivors, f"processes of the run still alive 30 s after SIGKILL: {survivors}"
    finally:
        for pid in alive(tree):
            os.kill(pid, signal.SIGKILL)
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert time.monotonic() - killed_at < 30


@pytest.mark.slow
def test_sigkill_of_the_launcher_as_ranks_start_under_a_subreaper_leaves_no_orphan(tmp_path: Path) -> None:
    """Under a child subreaper (as in a desktop session) the orphans are adopted by it, not by
    init: each rank asks for its parent-death signal first thing and checks its launcher is
    still among its ancestors, so none trains on."""
    config = write_config(tmp_path / "exp.yaml", sleep=0.2)
    helper = Path(__file__).with_name("subreaper_launch.py")
    result = subprocess.run([sys.executable, str(helper), str(config), str(tmp_path / "run"), str(TESTS)],
                            cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=400)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "seconds" in report, (report, result.stderr[-3000:])
    assert report["seconds"] < 20, report


@pytest.mark.slow
def test_sigterm_stops_two_ranks_with_75_and_no_torchrun_traceback(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = start(["run", str(write_config(tmp_path / "exp.yaml", sleep=0.2)), "--run-dir", str(run_dir)])
    wait_until(lambda: (run_dir / "metrics.jsonl").exists(), process, "training", timeout=300)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    status, stdout, stderr = finish(process, "2 ranks: SIGTERM", since=signalled)
    assert status == 75, stderr[-4000:]
    assert "Traceback" not in stderr and "SignalException" not in stderr, stderr[-4000:]
    assert not error_lines(stderr)
    assert "preempted" in stdout
    # Off a terminal the chief prints its progress lines, as alone, and no launcher view is drawn.
    assert re.search(r"training: batch \d+/2000 \(\d+%\) loss=", stderr), stderr[-4000:]
    assert "\x1b[" not in stderr and not re.search(r"rank \d +\S*━", stderr)


@pytest.mark.slow
def test_an_error_every_rank_hits_is_printed_once(tmp_path: Path) -> None:
    config = write_config(tmp_path / "exp.yaml")
    config.write_text(config.read_text().replace("distributed_trials:LinearTrial", "distributed_trials:NoSuchTrial"))
    status, _, stderr = finish(start(["run", str(config), "--run-dir", str(tmp_path / "run")]), "2 ranks: bad entrypoint")
    assert status == 2, stderr[-4000:]
    line = assert_one_line(stderr, "ranks 0, 1", "NoSuchTrial")
    assert "ChildFailedError" not in stderr
    assert line.count("hookdet: error") == 1


def torchrun_pids(launcher_pid: int) -> List[int]:
    """torchrun's agent below ``hookdet run`` (a list: empty before it started): its one child
    (forked from it, or started by it, the agent's command line may be either's)."""
    return children_by_parent().get(launcher_pid, [])


def rank_pids(launcher_pid: int) -> List[int]:
    """The rank processes below the launcher: the children of torchrun's agent (forked from it,
    so their command line is the agent's)."""
    children = children_by_parent()  # one reading of /proc for the agent and its ranks alike
    return [rank for agent in children.get(launcher_pid, []) for rank in children.get(agent, [])]


#: A ``sitecustomize`` that rewords what torchrun says of its failures, in every process.
REWORDING = """
from torch.distributed.elastic.multiprocessing import errors
errors.ChildFailedError.format_msg = lambda self, *args, **kwargs: "torch said this another way"
errors.ProcessFailure.signal_name = lambda self: "a signal, in other words"
"""


def start_two_ranks_training(tmp_path: Path, sleep: float, reworded: bool = False) -> "tuple[Hookdet, Path]":
    """``hookdet run`` of 2 slots, returned once both ranks train; with ``reworded``, torch's
    failure text is not what it was (:data:`REWORDING`)."""
    run_dir = tmp_path / "run"
    env = {}
    if reworded:
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(REWORDING)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(REPO)])
    process = start(["run", str(write_config(tmp_path / "exp.yaml", sleep=sleep)), "--run-dir", str(run_dir)], env)
    wait_until(lambda: (run_dir / "metrics.jsonl").exists() and len(rank_pids(process.pid)) == 2, process,
               "two ranks training", timeout=300)
    return process, run_dir


@pytest.mark.slow
@pytest.mark.parametrize("reworded", [False, True], ids=["torchs-words", "torch-reworded"])
def test_a_rank_killed_by_sigkill_is_named_and_no_gloo_traceback_is_shown(tmp_path: Path, reworded: bool) -> None:
    """Named from what torchrun recorded as data, so the same when torch words it otherwise."""
    process, _ = start_two_ranks_training(tmp_path, sleep=0.05, reworded=reworded)
    victim = max(rank_pids(process.pid))  # the later-started rank
    os.kill(victim, signal.SIGKILL)
    status, _, stderr = finish(process, "2 ranks: one rank SIGKILLed", since=time.monotonic())
    assert status not in (0, 75), stderr[-4000:]
    assert "Traceback" not in stderr and "ChildFailedError" not in stderr, stderr[-4000:]
    lines = error_lines(stderr)
    # torchrun's failure summary names the rank and the signal; nothing says it twice.
    killed = [line for line in lines if f"(pid {victim}) was killed by SIGKILL" in line]
    assert len(killed) == 1 and not any("ended without a status" in line for line in lines), lines
    assert all("gloo" not in line.lower() for line in lines), lines


@pytest.mark.slow
@pytest.mark.parametrize("slots", [1, 2])
def test_a_trial_error_keeps_only_the_users_frames(tmp_path: Path, slots: int) -> None:
    """User code keeps its traceback, without hookdet's and pluggy's frames above it, and one line
    names the error (and, with two ranks, the rank)."""
    config = write_config(tmp_path / "exp.yaml", fail_rank=slots - 1, fail_batch=2)
    config.write_text(config.read_text().replace("slots_per_trial: 2", f"slots_per_trial: {slots}"))
    status, _, stderr = finish(start(["run", str(config), "--run-dir", str(tmp_path / "run")]), f"{slots} rank(s): trial error")
    assert status == 1, stderr[-4000:]
    assert "Traceback (most recent call last, hookdet's frames left out):" in stderr, stderr[-4000:]
    assert 'distributed_trials.py", line' in stderr
    user_frames = stderr.split("frames left out")[1].split("RuntimeError")[0]
    # No frame of hookdet's own package (the checkout's folder may itself be named hookdet).
    assert f'File "{HOOKDET_PACKAGE}{os.sep}' not in user_frames, user_frames
    assert "/pluggy/" not in stderr
    who = "" if slots == 1 else f"rank {slots - 1}: "
    expected = (f"hookdet: error: {who}the trial raised RuntimeError: rank {slots - 1} fails on purpose "
                "at batch 2 (traceback above)")
    assert expected in error_lines(stderr), error_lines(stderr)


def test_a_launcher_failure_is_one_line(tmp_path: Path) -> None:
    """torchrun failing on its own (a rendezvous backend it does not have): its chained
    tracebacks become one line naming torchrun and its last error."""
    config = write_config(tmp_path / "exp.yaml")
    status, _, stderr = finish(start(["run", str(config), "--run-dir", str(tmp_path / "run"), "--nnodes=1",
                                      "--rdzv-backend=nosuch"]), "2 ranks: torchrun fails")
    assert status == 1, stderr[-4000:]
    assert "Traceback" not in stderr and "The above exception" not in stderr, stderr[-4000:]
    assert_one_line(stderr, "torchrun failed: ValueError: The rendezvous backend 'nosuch' is not registered")


@pytest.mark.slow
def test_sigkill_of_torchrun_is_named_in_one_line(tmp_path: Path) -> None:
    launcher, _ = start_two_ranks_training(tmp_path, sleep=0.2)
    (torchrun,) = torchrun_pids(launcher.pid)
    os.kill(torchrun, signal.SIGKILL)
    status, _, stderr = finish(launcher, "torchrun SIGKILLed", since=time.monotonic())
    assert status == 128 + signal.SIGKILL, stderr[-4000:]
    assert_one_line(stderr, "torchrun was killed by SIGKILL; its ranks ended with it")


@pytest.mark.slow
def test_ctrl_c_while_the_trial_is_built_without_the_preemption_plugin_is_one_line(tmp_path: Path) -> None:
    """With the preemption plugin (the default) Ctrl-C there trains to a checkpoint and exits 75;
    without it, one line and 130 (128 + SIGINT), and the run directory it made is gone."""
    from tests.faults.harness import write_config as write_regression_config

    marker = tmp_path / "building"
    config = write_regression_config(tmp_path / "exp.yaml", {"init_marker": str(marker), "init_sleep": 120},
                                     plugins={"only": ["checkpoint"]})
    process = start(["run", str(config), "--run-dir", str(tmp_path / "run")])
    wait_until(marker.exists, process, "the trial's __init__")
    process.send_signal(signal.SIGINT)
    status, _, stderr = finish(process, "Ctrl-C in __init__", since=time.monotonic())
    assert status == 128 + signal.SIGINT, stderr[-4000:]
    assert_one_line(stderr, "interrupted (Ctrl-C)")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_an_abort_in_teardown_cannot_fail_a_finished_run(tmp_path: Path) -> None:
    """Rank 1 aborts (SIGABRT) as it leaves the process group after training finished, as
    torch's teardown has: a rank tells the launcher it finished before its teardown."""
    config = write_config(tmp_path / "exp.yaml", abort_at_teardown=True)
    config.write_text(config.read_text().replace("batches: 2000", "batches: 4"))
    status, stdout, stderr = finish(start(["run", str(config), "--run-dir", str(tmp_path / "run")]),
                                    "2 ranks abort at teardown", fault=False)
    assert status == 0, stderr[-4000:]
    assert not error_lines(stderr) and "completed after 4 batches" in stdout, stdout[-2000:] + stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("plugins, words", [
    (["no:ddp"], "the experiment file removes 'ddp' (no:ddp)"),
    ({"only": ["checkpoint", "metrics_log"]}, "the experiment file lists only ['checkpoint', 'metrics_log']"),
])
def test_no_and_only_hold_under_two_ranks_and_a_launch_nothing_distributes_is_refused(
    tmp_path: Path, plugins: object, words: str
) -> None:
    """The file's ``no:ddp`` and ``only:`` are not overridden by the launch (ddp is not added);
    two ranks that no plugin makes distributed would each train alone into one run directory,
    so the run is refused in one line naming why, before anything is written."""
    config = write_config(tmp_path / "exp.yaml")
    content = yaml.safe_load(config.read_text())
    content["plugins"] = plugins
    config.write_text(yaml.safe_dump(content))
    status, _, stderr = finish(start(["run", str(config), "--run-dir", str(tmp_path / "run")]), "2 ranks: no distributed plugin")
    assert status == 2, stderr[-4000:]
    assert_one_line(stderr, "ranks 0, 1", "is one of 2 ranks, but no plugin makes the run distributed", words)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_only_with_ddp_listed_trains_two_ranks(tmp_path: Path) -> None:
    config = write_config(tmp_path / "exp.yaml")
    content = yaml.safe_load(config.read_text())
    content["plugins"] = {"only": ["ddp", "checkpoint", "metrics_log"]}
    content["searcher"]["max_length"] = {"batches": 4}
    config.write_text(yaml.safe_dump(content))
    record = tmp_path / "outcome.json"
    status, _, stderr = finish(start(["run", str(config), "--run-dir", str(tmp_path / "run")],
                                     env={"HOOKDET_OUTCOME_FILE": str(record)}), "2 ranks: only with ddp", fault=False)
    assert status == 0, stderr[-4000:]
    reports = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["steps_completed"] for r in reports if r["group"] == "validation"] == [4], reports
    # The launcher's own outcome record tells what rank 0's training left: the run's checkpoint.
    from hookdet.launch.outcome import read

    ended = read(record)
    assert ended is not None and (ended.state, ended.exit_code, ended.rank, ended.batches) == ("completed", 0, None, 4)
    assert ended.checkpoint == json.loads((tmp_path / "run" / "run.json").read_text())["latest_checkpoint"]


class StderrLines:
    """The lines a running process has written to stderr so far."""

    def __init__(self, process: Hookdet) -> None:
        self.process = process

    @property
    def lines(self) -> List[str]:
        return self.process.output()[1].splitlines(keepends=True)

    def having(self, fragment: str) -> List[str]:
        return [line for line in self.lines if fragment in line]


def watched_run(tmp_path: Path, **hparams: object) -> "tuple[Hookdet, StderrLines]":
    """2 ranks of the linear trial that write their pids, with silent ranks named after 3 s."""
    config = write_config(tmp_path / "exp.yaml", pid_dir=str(tmp_path), sleep=0.02, **hparams)
    content = yaml.safe_load(config.read_text())
    content["plugin_config"] = {"ddp": {"silent_rank_seconds": 3}}
    config.write_text(yaml.safe_dump(content))
    process = start(["run", str(config), "--run-dir", str(tmp_path / "run")])
    return process, StderrLines(process)


@pytest.mark.slow
def test_a_rank_that_stops_answering_is_named_and_the_run_goes_on_when_it_answers(tmp_path: Path) -> None:
    """SIGSTOP of rank 1: the launcher names it after the configured 3 s (the other rank waits
    in its collective, silently, until torch's 30-minute timeout); SIGCONT, and the run goes on
    and stops on SIGTERM with a checkpoint as any run does."""
    process, stderr = watched_run(tmp_path)
    rank_1 = tmp_path / "rank1.pid"
    wait_until(lambda: rank_1.exists() and (tmp_path / "run" / "metrics.jsonl").exists(), process, "training")
    os.kill(int(rank_1.read_text()), signal.SIGSTOP)
    try:
        wait_until(lambda: stderr.having("has not answered"), process, "rank 1 named", timeout=60)
    finally:
        os.kill(int(rank_1.read_text()), signal.SIGCONT)
    (line,) = stderr.having("has not answered")
    assert line.startswith("hookdet: warning: rank 1 has not answered for ") and "the other ranks wait for it" in line
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)
    assert process.returncode == 75, "".join(stderr.lines)[-4000:]


@pytest.mark.slow
def test_a_rank_blocked_in_a_read_is_told_apart_from_those_waiting_for_it(tmp_path: Path) -> None:
    """Rank 1 blocks in a "read" at batch 3 while alive: no rank finishes a batch, and after 3 s
    the launcher says where each rank's main thread is, which names the read; once the read
    returns, the run completes."""
    release = tmp_path / "release"
    process, stderr = watched_run(tmp_path, hang_rank=1, hang_batch=3, hang_until=str(release))
    try:
        wait_until(lambda: stderr.having("no rank has finished a batch"), process, "the stall told", timeout=60)
    finally:
        release.touch()
    (line,) = stderr.having("no rank has finished a batch")
    assert "rank 1 at batch 3 in distributed_trials.py:" in line and "(read_that_hangs)" in line, line
    assert "rank 0 at batch 3 in " in line and "(read_that_hangs)" not in line.split("rank 1 at")[0], line
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)
    assert process.returncode == 75, "".join(stderr.lines)[-4000:]
