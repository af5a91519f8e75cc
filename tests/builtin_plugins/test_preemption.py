"""Real signals to real processes: graceful preemption, and crashes in the middle of writes.

- ``hookdet run`` sent SIGTERM mid-epoch finishes its batch, checkpoints, exits 75; ``hookdet
  run --resume RUN_DIR`` then ends bit-identical to a run that was never interrupted.
- ``hookdet run`` writing a large checkpoint after every batch is SIGKILLed ten times at
  different moments. The writes run in the background (the default) while training goes on, so
  kills land in a background write, in training beside it, or in the wait of the next
  checkpoint for it. After every kill each visible checkpoint directory verifies (a write that
  was cut short is a hidden ``.tmp-*`` directory, never a checkpoint), and the next ``hookdet
  run --resume RUN_DIR`` starts from the newest intact checkpoint. The final weights equal those
  of an uninterrupted run.
- In this process: the handler's effects (stop at the next batch, validation first, nothing
  changed once training completed, previous handlers restored).
"""
from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import yaml

from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import lookup as lookup
from hookdet import pytorch
from hookdet.runs.metrics import read_reports
from hookdet.plugins.builtin.preemption import PREEMPTED_EXIT_CODE
from hookdet.plugin import SEGMENT_END_ENV, run_of
from tests.support import hookdet_process
from tests.support.resume_trials import RegressionTrial
from tests.support.states import assert_states_equal

TESTS = Path(__file__).resolve().parents[1] / "support"  # the trials' model directory
REPO = TESTS.parents[1]


def write_config(path: Path, hparams: Dict[str, Any], **fields: Any) -> Path:
    config = {
        "name": "preemption-test",
        "entrypoint": "resume_trials:RegressionTrial",
        "hyperparameters": {"records": 160, "global_batch_size": 8, "lr": 0.01, "shuffle": True,
                            "dropout": 0.2, **hparams},
        "searcher": {"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                     "max_length": {"batches": 30}},
        "min_validation_period": {"batches": 7},
        "scheduling_unit": 1,
        "plugins": {"only": ["callbacks", "preemption", "metrics_log", "checkpoint"]},
        "reproducibility": {"experiment_seed": 11},
        **fields,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def hookdet_run(config: Path, run_dir: Path, resume: Optional[Path] = None) -> hookdet_process.Hookdet:
    resuming = [] if resume is None else ["--resume", str(resume)]
    return hookdet_process.start("run", config, "--model-dir", TESTS, "--run-dir", run_dir, *resuming, cwd=REPO)


def finish(process: hookdet_process.Hookdet, timeout: float = 240) -> str:
    """Its standard output, then its standard error."""
    return "".join(process.communicate(timeout=timeout))


def wait_for(predicate: Any, process: hookdet_process.Hookdet, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"process exited ({process.returncode}) before {what}:\n{finish(process)[-3000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def training_records(run_dir: Path) -> List[Dict[str, Any]]:
    return [r for r in read_reports(run_dir) if r["group"] == "training"]


def final_state(run_dir: Path) -> Dict[str, Any]:
    state = fmt.load_state(lookup.resolve_checkpoint_dir(run_dir))
    return {"models": state["models_state_dict"], "optimizers": state["optimizers_state_dict"],
            "batches": state["trial_state"]["batches_trained"]}


def reports(run_dir: Path) -> List[Any]:
    return [(r["group"], r["steps_completed"], r["metrics"]) for r in read_reports(run_dir)]


# ---------------------------------------------------------------------------------------------
# SIGTERM: graceful
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_mid_epoch_exits_75_with_a_checkpoint_and_resume_is_exact(tmp_path: Path) -> None:
    startup_log = tmp_path / "startup.jsonl"
    config = write_config(tmp_path / "exp.yaml", {"sleep": 0.05, "startup_log": str(startup_log)})
    straight_dir, victim_dir = tmp_path / "straight", tmp_path / "victim"
    straight = hookdet_run(config, straight_dir)
    victim = hookdet_run(config, victim_dir)

    wait_for(lambda: len(training_records(victim_dir)) >= 4, victim, "4 trained batches")
    victim.send_signal(signal.SIGTERM)
    output = finish(victim)
    assert victim.returncode == PREEMPTED_EXIT_CODE, output[-3000:]
    assert "received SIGTERM" in output and "preempted after" in output
    (checkpoint, metadata), *older = reversed(lookup.find_checkpoints(victim_dir / "checkpoints"))
    stopped_at = metadata["steps_completed"]
    assert 4 <= stopped_at < 20, "the signal landed mid-epoch (20 batches per epoch)"
    assert stopped_at == len(training_records(victim_dir))  # finished the batch in flight, no more
    fmt.verify(checkpoint)

    resumed = hookdet_run(config, victim_dir, resume=victim_dir)
    resumed_output = finish(resumed)
    assert resumed.returncode == 0, resumed_output[-3000:]
    straight_output = finish(straight)
    assert straight.returncode == 0, straight_output[-3000:]

    by_pid = {entry["pid"]: entry for entry in map(json.loads, startup_log.read_text().splitlines())}
    first, second = by_pid[victim.pid], by_pid[resumed.pid]
    assert (first["first_batch_idx"], first["checkpoint_uuid"], first["initial_batch_at_init"]) == (0, None, 0)
    # The resumed process knew where it resumes already in the trial's __init__.
    assert (second["first_batch_idx"], second["checkpoint_uuid"], second["initial_batch_at_init"]) == (
        stopped_at, checkpoint.name, stopped_at
    )
    expected, actual = final_state(straight_dir), final_state(victim_dir)
    assert expected["batches"] == actual["batches"] == 30
    assert_states_equal(expected, actual)
    # Every report (one batch per training report, validations at 7, 14, 21, 28, 30) is equal.
    assert reports(victim_dir) == reports(straight_dir)


def test_a_search_segment_resumed_where_it_ended_trains_no_further(tmp_path: Path, monkeypatch: Any) -> None:
    """A search segment (``HOOKDET_SEGMENT_END``) pauses after the validation at its end; run
    again from that checkpoint (its worker died before telling the search), it trains no batch:
    the search must read the same validation as if nothing had happened."""
    monkeypatch.setenv(SEGMENT_END_ENV, "4 batches")
    config = write_config(tmp_path / "exp.yaml", {}, min_validation_period={"batches": 2})
    first = hookdet_run(config, tmp_path / "run")
    output = finish(first)
    assert first.returncode == 0 and "hookdet: paused after 4 batches" in output, output[-3000:]
    before = reports(tmp_path / "run")
    again = hookdet_run(config, tmp_path / "run", resume=tmp_path / "run")
    output = finish(again)
    assert again.returncode == 0 and "hookdet: paused after 4 batches" in output, output[-3000:]
    assert reports(tmp_path / "run") == before and before[-1][:2] == ("validation", 4)
    assert final_state(tmp_path / "run")["batches"] == 4


# ---------------------------------------------------------------------------------------------
# SIGKILL: no graceful anything
# ---------------------------------------------------------------------------------------------

#: Seconds between seeing a checkpoint write begin and SIGKILL: early in torch.save, later in it,
#: during the flush and rename, and after publication (while retention deletes the previous one).
KILL_DELAYS = [0.0, 0.003, 0.006, 0.01, 0.015, 0.02, 0.03, 0.045, 0.06, 0.08]


def visible_and_hidden(checkpoints: Path) -> Any:
    entries = list(checkpoints.iterdir()) if checkpoints.exists() else []
    return [p for p in entries if not p.name.startswith(".")], [p for p in entries if p.name.startswith(".")]


@pytest.mark.slow
def test_sigkill_during_checkpoint_writes_never_leaves_a_bad_checkpoint(tmp_path: Path) -> None:
    startup_log = tmp_path / "startup.jsonl"
    settings: Dict[str, Any] = dict(
        # Long enough that ten processes, each killed a few batches in, never reach the end.
        searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                  "max_length": {"batches": 60}},
        min_validation_period={"batches": 10},
        scheduling_unit=5,
    )
    hparams = {"hidden": 512, "layers": 3, "dropout": 0.1}  # 0.8 M parameters: 9.5 MB with Adam
    # The uninterrupted run trains the same way; it only checkpoints less often.
    straight = hookdet_run(write_config(tmp_path / "straight.yaml", hparams, **settings), tmp_path / "straight")
    config = write_config(
        tmp_path / "exp.yaml", {**hparams, "startup_log": str(startup_log)},
        min_checkpoint_period={"batches": 1}, **settings,
    )
    run_dir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"

    seen: set = set()
    killed_mid_write = 0
    trained_beside_a_write = 0
    expected_start: Optional[Dict[str, Any]] = None
    for kill, delay in enumerate(KILL_DELAYS):
        process = hookdet_run(config, run_dir, resume=run_dir if kill else None)

        stale = {p.name for p in visible_and_hidden(checkpoints)[1]}  # left by earlier kills

        def writing_a_new_checkpoint() -> bool:
            """This process published a checkpoint and has begun writing another."""
            visible, hidden = visible_and_hidden(checkpoints)
            published = {p.name for p in visible} - seen
            writing = [p for p in hidden if p.name not in stale and "-deleting-" not in p.name]
            return bool(published) and bool(writing)

        wait_for(writing_a_new_checkpoint, process, f"process {kill} to write a second checkpoint")
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        output = finish(process)
        assert process.returncode == -signal.SIGKILL, "it was still training when killed"
        # A checkpoint that had to wait for the previous one's write: training went on beside it.
        trained_beside_a_write += "to finish writing before the next checkpoint" in output

        if expected_start is not None:  # this process started where the previous kill left off
            started = json.loads(startup_log.read_text().splitlines()[-1])
            assert started["pid"] == process.pid
            assert {k: started[k] for k in ("first_batch_idx", "checkpoint_uuid")} == expected_start

        visible, hidden = visible_and_hidden(checkpoints)
        killed_mid_write += any(p.name not in stale and "-deleting-" not in p.name for p in hidden)
        newest: Optional[Path] = None
        newest_steps = -1
        for directory in visible:
            metadata = fmt.verify(directory)  # every visible checkpoint is intact
            if metadata["steps_completed"] > newest_steps:
                newest, newest_steps = directory, metadata["steps_completed"]
            seen.add(directory.name)
        for directory in hidden:  # an interrupted write (or delete): invisible to every reader
            assert directory.name.startswith(".tmp-"), directory
        assert newest is not None
        assert lookup.resolve_checkpoint_dir(run_dir) == newest
        expected_start = {"first_batch_idx": newest_steps, "checkpoint_uuid": newest.name}

    # Kills while a resume starts: once it holds the run directory's lock, and in the middle of
    # sweeping stale writes (a planted leftover of many files, so the sweep takes a while).
    # Neither may cost a checkpoint or leave anything a reader would take for one.
    survivors_before = sorted(p.name for p in visible_and_hidden(checkpoints)[0])
    lock_file = run_dir / ".hookdet.lock"
    for moment in ("holding the lock", "mid-sweep"):
        leftover = checkpoints / f".tmp-planted-{moment.replace(' ', '-')}"
        leftover.mkdir()
        for index in range(4000):
            (leftover / f"part{index}").write_bytes(b"x")
        process = hookdet_run(config, run_dir, resume=run_dir)
        if moment == "holding the lock":
            wait_for(lambda: lock_file.exists() and f"pid {process.pid} " in lock_file.read_text(), process, "the lock")
        else:
            wait_for(lambda: not leftover.exists() or len(os.listdir(leftover)) < 4000, process, "the sweep")
        process.send_signal(signal.SIGKILL)
        finish(process)
        assert process.returncode == -signal.SIGKILL
        visible, hidden = visible_and_hidden(checkpoints)
        assert sorted(p.name for p in visible) == survivors_before
        for directory in visible:
            fmt.verify(directory)
        assert all(p.name.startswith(".tmp-") for p in hidden)
        assert lookup.resolve_checkpoint_dir(run_dir).name == expected_start["checkpoint_uuid"]

    final = hookdet_run(config, run_dir, resume=run_dir)
    output = finish(final)
    assert final.returncode == 0, output[-3000:]
    # Each of these is a checkpoint requested while the previous one was still being written:
    # training went on beside the write (a run that is not killed shows it whatever the load).
    trained_beside_a_write += output.count("to finish writing before the next checkpoint")
    started = json.loads(startup_log.read_text().splitlines()[-1])
    assert {k: started[k] for k in ("first_batch_idx", "checkpoint_uuid")} == expected_start
    straight_output = finish(straight)
    assert straight.returncode == 0, straight_output[-3000:]
    assert_states_equal(final_state(tmp_path / "straight"), final_state(run_dir))
    assert killed_mid_write >= 2, "kills did not land during checkpoint writes; the test proved less than it should"
    assert trained_beside_a_write >= 2, "the writes did not run in the background"
    assert not visible_and_hidden(checkpoints)[1], "the final resume swept every stale write"
    # One run, one history: the killed runs' reports after their checkpoints were dropped, so
    # every batch (a checkpoint each, so a report each) and every validation appears once.
    steps = {group: [r[1] for r in reports(run_dir) if r[0] == group] for group in ("training", "validation")}
    assert steps == {"training": list(range(1, 61)), "validation": [10, 20, 30, 40, 50, 60]}
    resumed_at = [json.loads(line)["first_batch_idx"] for line in startup_log.read_text().splitlines()]
    assert resumed_at == sorted(resumed_at) and len(resumed_at) == len(KILL_DELAYS) + 1
    print(f"{killed_mid_write} of {len(KILL_DELAYS)} kills interrupted a checkpoint write; resumed at {resumed_at}")


# ---------------------------------------------------------------------------------------------
# In this process
# ---------------------------------------------------------------------------------------------


class SignalSelf(pytorch.PyTorchCallback):
    """Sends this process a real signal at a chosen point of the run."""

    def __init__(self, when: str) -> None:
        self.when = when
        self.validations_seen = 0

    def on_validation_start(self) -> None:
        if self.when == "validation":
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        self.validations_seen += 1

    def on_trial_shutdown(self) -> None:
        if self.when == "shutdown":
            os.kill(os.getpid(), signal.SIGTERM)


class TrialThatSignals(RegressionTrial):
    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        self.signaller = SignalSelf(self.context.get_hparam("signal_when"))
        return {**super().build_callbacks(), "signaller": self.signaller}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        if self.context.get_hparam("signal_when") == "batch" and batch_idx == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().train_batch(batch, epoch_idx, batch_idx)


def fit_with_signal(tmp_path: Path, when: str) -> Any:
    hparams = {"records": 32, "global_batch_size": 8, "lr": 0.05, "signal_when": when}
    exp_conf = {"hyperparameters": hparams, "plugins": {"only": ["callbacks", "preemption", "checkpoint"]}}
    before = signal.getsignal(signal.SIGTERM)
    with pytorch.init(hparams=hparams, exp_conf=exp_conf, run_dir=tmp_path) as context:
        trial = TrialThatSignals(context)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(8), validation_period=pytorch.Batch(4), reporting_period=pytorch.Batch(2)
        )
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
    return trial, run_of(context)


def test_sigterm_in_a_batch_stops_after_that_batch_with_a_checkpoint(tmp_path: Path) -> None:
    trial, run = fit_with_signal(tmp_path, "batch")
    assert run.exit_reason == "preempted" and run.state.batches_trained == 3
    assert fmt.read_metadata(lookup.resolve_checkpoint_dir(tmp_path))["steps_completed"] == 3


def test_sigterm_during_validation_lets_it_finish_then_stops_at_that_batch(tmp_path: Path) -> None:
    trial, run = fit_with_signal(tmp_path, "validation")
    assert run.exit_reason == "preempted" and run.state.batches_trained == 4
    assert trial.signaller.validations_seen == 1
    assert fmt.read_metadata(lookup.resolve_checkpoint_dir(tmp_path))["steps_completed"] == 4


def test_sigterm_after_training_completed_changes_nothing(tmp_path: Path) -> None:
    trial, run = fit_with_signal(tmp_path, "shutdown")
    assert run.exit_reason == "completed" and run.state.batches_trained == 8


def lingering_trial() -> str:
    """test_cli's small trial, lingering 3 s at interpreter exit after it marks the moment."""
    from tests.test_cli import TRIAL_TEMPLATE

    return ("import atexit, os, time\n" + TRIAL_TEMPLATE.replace(
        "        self.context = context\n",
        "        self.context = context\n"
        "        atexit.register(lambda: (open(os.environ['LINGER_MARKER'], 'w').close(), time.sleep(3)))\n", 1))


def test_sigterm_as_a_completed_run_exits_does_not_turn_it_into_a_failure(tmp_path: Path) -> None:
    """A scheduler's SIGTERM in a run's last moments (training done, the process exiting): the
    process still exits 0, as run.json says completed, instead of dying of the signal (-15)."""
    (tmp_path / "lingering.py").write_text(textwrap.dedent(lingering_trial()))
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({
        "entrypoint": "lingering:Trial", "hyperparameters": {"global_batch_size": 2},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 4}}}))
    marker = tmp_path / "exiting"
    process = hookdet_process.start("run", config, "--run-dir", tmp_path / "run", cwd=tmp_path,
                                    env=dict(os.environ, LINGER_MARKER=str(marker)))
    wait_for(marker.exists, process, "the run's process to reach its exit")
    process.send_signal(signal.SIGTERM)
    output = finish(process)
    assert process.returncode == 0, output
    assert json.loads((tmp_path / "run" / "run.json").read_text())["state"] == "completed"
    assert "received SIGTERM after training ended: exiting as the run ended" in output


#: A script entrypoint that prints a line, waits for the test's word (a file), then fills its
#: standard output's pipe, so that ``hookdet run``'s closing lines wait there for the test to read.
PIPE_FILLER = """\
import fcntl, os, sys, time
print("script done", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
os.write(1, b"." * fcntl.fcntl(1, fcntl.F_GETPIPE_SZ))
"""


def test_sigterm_after_a_scripts_command_ended_does_not_turn_it_into_a_failure(tmp_path: Path) -> None:
    """A SIGTERM to ``hookdet run`` of a script entrypoint once the script has ended, while
    hookdet prints how it ended (held there by a full pipe: a reader that went slow): it exits
    0, as the script did, instead of dying of the signal. Cold: the test reads the pipe itself."""
    (tmp_path / "filler.py").write_text(PIPE_FILLER)
    go = tmp_path / "go"
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({"entrypoint": f"python3 filler.py {go}", "hyperparameters": {},
                                      "searcher": {"name": "single", "metric": "validation_loss"}}))
    process = hookdet_process.start("run", config, "--run-dir", tmp_path / "run", cwd=tmp_path, stdout_pipe=True)
    assert process.stdout is not None
    assert process.stdout.readline() == b"script done\n"
    go.touch()
    wait_for(lambda: "pipe_write" in Path(f"/proc/{process.pid}/wchan").read_text(), process,
             "hookdet's closing lines to wait on the full pipe")
    process.send_signal(signal.SIGTERM)
    rest = process.stdout.read()
    output = finish(process)
    assert process.returncode == 0, output
    assert b"hookdet: entrypoint exited with status 0" in rest
    assert "received SIGTERM after training ended: exiting as the run ended" in output
