"""The ddp plugin: real ranks (torchrun, gloo, 2 processes) against the same run on one process.

Every multi-process test launches ``hookdet run`` (or torchrun itself) as a child process and reads
back what each rank recorded (``tests/support/distributed_trials.py``). Weights of a 2-rank run equal the
1-rank run's within float32 rounding, not bitwise: DDP averages the two ranks' gradients (each the
mean over half the batch) with an all-reduce, where one process takes one mean over the whole
batch, so the same numbers are summed in a different order.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from hookdet.cli import commands as cli
from hookdet.plugins.builtin.ddp import DDPPlugin, check_ddp_options, ddp_keyword_options
from hookdet.config import ConfigError, parse_experiment_config
from hookdet.distributed import launcher as hookdet_launcher
from hookdet.distributed.stop_agreement import AGREE_EVERY_SECONDS, MOST_BATCHES_BETWEEN
from hookdet.errors import UsageError
from hookdet.distributed.launcher import RANK_ENTRY
from hookdet.runs.metrics import read_reports
from hookdet.plugins.builtin.preemption import PREEMPTED_EXIT_CODE
from hookdet.plugins.manager import PluginError, PluginManager
from tests.support import hookdet_process
from tests.support.distributed_trials import (
    REPO_ROOT,
    TESTS_DIR,
    child_env,
    expected_weights,
    free_port,
    hookdet_command,
    read_rank,
    read_weight,
    record_inputs,
    record_labels,
    run_command,
    write_config,
)

LAUNCH_TIMEOUT = 180
#: float32 weights against the float64 closed form, and 2 ranks against 1.
RTOL, ATOL = 2e-6, 1e-7
VALIDATION_METRICS = ("validation_loss", "error_sum", "error_max", "error_min", "rms", "ordered")


def _single_process(config: Path, run_dir: Path) -> None:
    """The same experiment on one process, in this process."""
    status = cli.main(
        ["run", str(config), "--slots", "1", "--run-dir", str(run_dir), "--model-dir", str(TESTS_DIR)]
    )
    assert status == 0


def _check_launch(result: subprocess.CompletedProcess, expected_status: int = 0) -> None:
    assert result.returncode == expected_status, (
        f"exit status {result.returncode}, expected {expected_status}\n"
        f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-8000:]}"
    )


def _training_losses(run_dir: Path) -> Dict[int, float]:
    return {
        record["steps_completed"]: record["metrics"]["loss"]
        for record in read_reports(run_dir)
        if record["group"] == "training"
    }


def _launch_as_two_machines(config: Path, run_dir: Path) -> None:
    """Two ``hookdet run --slots 2 --nnodes=2 --node-rank=N --rdzv-endpoint=...`` launchers,
    one rank each, meeting through torchrun's c10d rendezvous as two machines would."""
    endpoint = f"127.0.0.1:{free_port()}"
    launchers = [
        subprocess.Popen(
            hookdet_command(
                config, run_dir, "--slots", "2", "--nnodes=2", f"--node-rank={node}",
                f"--rdzv-endpoint={endpoint}", "--rdzv-backend=c10d", "--rdzv-id=hookdet-test",
            ),
            env=child_env(), cwd=str(REPO_ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for node in (0, 1)
    ]
    try:
        outputs = [launcher.communicate(timeout=LAUNCH_TIMEOUT) for launcher in launchers]
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
    for node, (launcher, (_, stderr)) in enumerate(zip(launchers, outputs)):
        assert launcher.returncode == 0, f"machine {node}: {stderr[-6000:]}"
        assert "hookdet: error" not in stderr, stderr[-6000:]
    # the machine of rank 0 reports the run; the other says where its report is, in one line
    endings = sorted(stdout.strip().splitlines()[-1] for stdout, _ in outputs)
    assert endings[1].startswith("hookdet: rank 1 completed on this machine (node ") and \
        endings[1].endswith("of 2); the run is recorded by rank 0, in its machine's run directory"), endings


# ---------------------------------------------------------------------------------------------
# 2 ranks train like 1 at the same global batch size
# ---------------------------------------------------------------------------------------------

HPARAMS = {"global_batch_size": 4, "lr": 0.1, "records": 28, "with_buffer": True}
BATCHES = 10  # 7 batches per epoch: crosses an epoch boundary


@pytest.mark.slow
@pytest.mark.parametrize(
    "aggregation, launch, entrypoint",
    [
        (1, "two-machines", "distributed_trials:LinearTrial"),
        (2, "torchrun", "distributed_trials:FullDatasetLinearTrial"),
    ],
    ids=["aggregation1-two-launchers-evaluate-batch", "aggregation2-torchrun-evaluate-full-dataset"],
)
def test_two_ranks_match_one_process(tmp_path: Path, aggregation: int, launch: str, entrypoint: str) -> None:
    hparams = dict(HPARAMS, ddp_options={"find_unused_parameters": True})
    config = write_config(
        tmp_path / "experiment.yaml",
        hparams,
        entrypoint=entrypoint,
        searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                  "max_length": {"batches": BATCHES}},
        min_validation_period={"batches": 5},
        optimizations={"aggregation_frequency": aggregation},
        plugins={"only": ["callbacks", "preemption", "metrics_log", "checkpoint", "ddp"]},
        plugin_config={"ddp": {"bucket_cap_mb": 1, "find_unused_parameters": False}},
    )
    _single_process(config, tmp_path / "one")
    if launch == "two-machines":
        _launch_as_two_machines(config, tmp_path / "two")
    else:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            *hookdet_command(config, tmp_path / "two")[1:],
        ]
        _check_launch(run_command(command, timeout=LAUNCH_TIMEOUT))

    one = read_rank(tmp_path / "one", 0)
    ranks = [read_rank(tmp_path / "two", rank) for rank in (0, 1)]
    assert one["size"] == 1 and [r["size"] for r in ranks] == [2, 2]

    # Replicas stay identical, bit for bit, and equal the one-process weights within rounding.
    final = [read_weight(tmp_path / "two", rank) for rank in (0, 1)]
    assert torch.equal(final[0], final[1])
    torch.testing.assert_close(final[0], read_weight(tmp_path / "one", 0), rtol=RTOL, atol=ATOL)

    # Every batch follows the closed form of SGD on the global batch (records differ, so a rank
    # training on the wrong shard would leave it).
    closed_form = expected_weights(28, 4, 0.1, BATCHES, aggregation)
    for record in [one, *ranks]:
        assert record["batches"] == list(range(BATCHES))
        assert record["weights"] == pytest.approx(closed_form, rel=RTOL, abs=ATOL)
    if aggregation == 2:
        assert ranks[0]["weights"][0] == 0.0  # the first batch only accumulated

    # Gradients right after backward: all-reduced (equal on both ranks) exactly on the batches
    # that step; local (different records, different gradients) on those under no_sync().
    for batch in range(BATCHES):
        grads = [r["grads"][batch] for r in ranks]
        if (batch + 1) % aggregation == 0:
            assert grads[0] == grads[1], f"batch {batch} was not all-reduced"
        else:
            assert grads[0] != grads[1], f"batch {batch} was all-reduced inside no_sync()"

    # Training metrics averaged across ranks equal the one-process metrics.
    losses_one, losses_two = _training_losses(tmp_path / "one"), _training_losses(tmp_path / "two")
    assert sorted(losses_two) == list(range(1, BATCHES + 1))
    for step, loss in losses_one.items():
        assert losses_two[step] == pytest.approx(loss, rel=1e-6)

    # Validation: both ranks receive the same reduced metrics, equal to the one-process run's.
    assert ranks[0]["validations"] == ranks[1]["validations"]
    assert len(ranks[0]["validations"]) == len(one["validations"]) == 2
    names = VALIDATION_METRICS if entrypoint.endswith(":LinearTrial") else ("validation_loss", "error_sum", "records")
    for reduced, expected in zip(ranks[0]["validations"], one["validations"]):
        assert sorted(reduced) == sorted(names)
        for name in names:
            assert reduced[name] == pytest.approx(expected[name], rel=1e-6), name

    # The DDP wrapper got plugin_config.ddp's options, overridden by wrap_model's.
    assert [r["ddp"] for r in ranks] == [{"bucket_bytes_cap": 1024 * 1024, "find_unused_parameters": True}] * 2
    # Buffers were synced from the chief every training forward; validation (chief only, for
    # evaluate_full_dataset) ran through the wrapper without a collective, or it would hang.
    assert [r["training_forwards"] for r in ranks] == [BATCHES, BATCHES]


@pytest.mark.slow
def test_ranks_forked_from_torchruns_agent_train_as_cold_ranks_do(tmp_path: Path) -> None:
    """hookdet's torchrun ranks are forked from its agent (hookdet/distributed/forked_ranks.py);
    with ``HOOKDET_COLD_RANKS=1`` each is a new interpreter running the rank entry, as before.
    Both train the same, bit for bit."""
    config = write_config(
        tmp_path / "experiment.yaml", HPARAMS, resources={"slots_per_trial": 2},
        searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                  "max_length": {"batches": 4}},
    )
    for how, env in (("forked", {}), ("cold", {"HOOKDET_COLD_RANKS": "1"})):
        _check_launch(run_command(hookdet_command(config, tmp_path / how), timeout=LAUNCH_TIMEOUT, **env))
    for rank in (0, 1):
        forked, cold = read_rank(tmp_path / "forked", rank), read_rank(tmp_path / "cold", rank)
        assert (forked["forked"], cold["forked"]) == (True, False)
        assert forked["weights"] == cold["weights"] and forked["grads"] == cold["grads"]
        assert torch.equal(read_weight(tmp_path / "forked", rank), read_weight(tmp_path / "cold", rank))


# ---------------------------------------------------------------------------------------------
# Uneven shards, signals, exact resume
# ---------------------------------------------------------------------------------------------

#: 26 records, 2 per rank per batch: 13 per-rank batches per pass, so ranks get 7 and 6 of each
#: epoch (epoch length is the chief's 7) and 7 and 6 validation batches.
UNEVEN = {"global_batch_size": 4, "lr": 0.05, "records": 26, "shuffle": True, "noise": 0.1}
UNEVEN_BATCHES = 16


def _uneven_config(path: Path, **hparams: Any) -> Path:
    return write_config(
        path,
        dict(UNEVEN, **hparams),
        searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                  "max_length": {"batches": UNEVEN_BATCHES}},
        min_validation_period={"batches": 5},
        resources={"slots_per_trial": 2},
    )


def _wait_for_training_reports(metrics: Path, count: int, process: hookdet_process.Hookdet, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it could be interrupted"
        if metrics.exists():
            reports = [line for line in metrics.read_text().splitlines() if '"training"' in line]
            if len(reports) >= count:
                return
        time.sleep(0.05)
    raise AssertionError(f"no {count} training reports in {metrics} after {timeout} s")


def _reports(run_dir: Path) -> Dict[Any, Dict[str, Any]]:
    return {
        (record["group"], record["steps_completed"]): record["metrics"]
        for record in read_reports(run_dir)
    }


@pytest.mark.slow
def test_uneven_shards_sigterm_and_exact_resume(tmp_path: Path) -> None:
    # The run that is never interrupted.
    config = _uneven_config(tmp_path / "experiment.yaml")
    _check_launch(run_command(hookdet_command(config, tmp_path / "full"), timeout=LAUNCH_TIMEOUT))
    full = [read_rank(tmp_path / "full", rank) for rank in (0, 1)]
    for record in full:
        assert record["batches"] == list(range(UNEVEN_BATCHES))
        assert record["epoch_starts"] == [0, 1, 2] and record["epoch_ends"] == [0, 1]
    assert full[0]["validations"] == full[1]["validations"]
    # Uneven validation shards still count each record once: the final validation's error sum
    # over all 26 records, from the final weight.
    weight = read_weight(tmp_path / "full", 0)
    errors = record_inputs(26).double() * weight.double() - record_labels(26).double()
    assert full[0]["validations"][-1]["error_sum"] == pytest.approx(float(errors.sum()), rel=1e-6)

    # The same run, sent SIGTERM through the launcher after 3 batches: every rank stops at the
    # same batch, the chief checkpoints, the launcher exits 75.
    slow = _uneven_config(tmp_path / "slow.yaml", sleep=0.15)
    process = hookdet_process.start(*hookdet_command(slow, tmp_path / "stopped")[3:], env=child_env(), cwd=REPO_ROOT)
    try:
        _wait_for_training_reports(tmp_path / "stopped" / "metrics.jsonl", 3, process, LAUNCH_TIMEOUT)
        process.send_signal(signal.SIGTERM)
    finally:
        stdout, stderr = process.communicate(timeout=LAUNCH_TIMEOUT)
    assert process.returncode == PREEMPTED_EXIT_CODE, stderr[-6000:]
    stopped = [read_rank(tmp_path / "stopped", rank) for rank in (0, 1)]
    assert stopped[0]["batches"] == stopped[1]["batches"]
    stop_batch = len(stopped[0]["batches"])
    assert 3 <= stop_batch < UNEVEN_BATCHES
    assert "preempted" in stdout

    # Resumed on 2 ranks: bit for bit the uninterrupted run.
    _check_launch(run_command(
        hookdet_command(slow, tmp_path / "resumed", "--resume", str(tmp_path / "stopped")),
        timeout=LAUNCH_TIMEOUT,
    ))
    for rank in (0, 1):
        assert torch.equal(read_weight(tmp_path / "resumed", rank), read_weight(tmp_path / "full", rank))
        resumed = read_rank(tmp_path / "resumed", rank)
        assert resumed["batches"] == list(range(stop_batch, UNEVEN_BATCHES))
        assert stopped[rank]["weights"] + resumed["weights"] == full[rank]["weights"]
    combined = {**_reports(tmp_path / "stopped"), **_reports(tmp_path / "resumed")}
    assert combined == _reports(tmp_path / "full")


def _two_ranks_with_a_stop_asked_on_rank_1_at_batch_2(tmp_path: Path, records: int, length: int, **hparams: Any) -> List[int]:
    """Train 2 ranks with no boundary before ``length``, rank 1 alone asking to stop during
    batch 2; check both ranks trained the same batches to equal weights (and the launcher
    alone said what the file holds); return them."""
    config = write_config(
        tmp_path / "experiment.yaml",
        dict(HPARAMS, records=records, stop_rank=1, stop_batch=2, **hparams),
        searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                  "max_length": {"batches": length}},
        scheduling_unit=100000,
        min_validation_period={"batches": 100000},
        resources={"slots_per_trial": 2},
        environment={"image": "a cluster's image"},
    )
    result = run_command(hookdet_command(config, tmp_path / "run"), timeout=LAUNCH_TIMEOUT)
    _check_launch(result)
    # what the file holds is said once, by the launcher, not again by each rank
    assert result.stderr.count("cluster-only fields ignored when running locally: environment") == 1
    ranks = [read_rank(tmp_path / "run", rank) for rank in (0, 1)]
    assert ranks[0]["batches"] == ranks[1]["batches"]
    assert torch.equal(read_weight(tmp_path / "run", 0), read_weight(tmp_path / "run", 1))
    return ranks[0]["batches"]


@pytest.mark.slow
def test_a_stop_requested_on_one_rank_stops_every_rank_one_batch_later(tmp_path: Path) -> None:
    """Ranks agree on stopping without a blocking collective per batch. With batches over the
    agreement's 0.2 s, it is started after every batch: the flag set during batch 2 on rank 1
    alone is all-reduced while batch 3 trains, so both ranks stop after batch 3 (a reporting
    boundary would have caught it at once; there is none here)."""
    batches = _two_ranks_with_a_stop_asked_on_rank_1_at_batch_2(tmp_path, 64, 12, sleep=1.5 * AGREE_EVERY_SECONDS)
    assert batches == [0, 1, 2, 3]


@pytest.mark.slow
def test_with_quick_batches_the_ranks_still_stop_together_soon_after_the_request(tmp_path: Path) -> None:
    """Batches of well under 0.2 s: the agreement is started only every several batches, so
    the stop asked for during batch 2 on rank 1 may come later than one batch, but on both ranks
    after the same batch, within the bound the pacing allows, long before the end."""
    batches = _two_ranks_with_a_stop_asked_on_rank_1_at_batch_2(tmp_path, 4096, 2000)
    assert 4 <= len(batches) <= 2 + 2 * MOST_BATCHES_BETWEEN, len(batches)


# ---------------------------------------------------------------------------------------------
# Failures
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_failing_rank_fails_the_run_quickly_with_its_traceback(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "experiment.yaml",
        dict(HPARAMS, fail_rank=1, fail_batch=2),
        resources={"slots_per_trial": 2},
    )
    started = time.monotonic()
    result = run_command(hookdet_command(config, tmp_path / "run"), timeout=LAUNCH_TIMEOUT)
    elapsed = time.monotonic() - started
    assert result.returncode not in (0, PREEMPTED_EXIT_CODE)
    assert "RuntimeError: rank 1 fails on purpose at batch 2" in result.stderr
    assert elapsed < 90, f"the run took {elapsed:.0f} s to fail"


def test_ddp_and_horovod_are_refused_together() -> None:
    for names in (["ddp", "horovod"], ["horovod", "ddp"]):
        manager = PluginManager()
        with pytest.raises(PluginError, match="'ddp' and 'horovod'|'horovod' and 'ddp'") as error:
            manager.load_all(names)
        assert "cannot run together" in str(error.value)


def test_unknown_ddp_options_are_refused_by_name() -> None:
    with pytest.raises(PluginError, match=r"plugin_config\.ddp\.bucket_size: unknown option 'bucket_size'") as error:
        PluginManager({"ddp": {"bucket_size": 3}}).load_all(["ddp"])
    assert "bucket_cap_mb" in str(error.value) and "timeout_seconds" in str(error.value)
    with pytest.raises(PluginError, match="plugin_config.ddp.backend: expected one of 'gloo', 'nccl', 'mpi' or 'ucc'"):
        PluginManager({"ddp": {"backend": "carrier-pigeon"}}).load_all(["ddp"])
    with pytest.raises(ConfigError, match="plugin_config.ddp.find_unused_paramters: unknown option 'find_unused_paramters'; did you mean 'find_unused_parameters'"):
        parse_experiment_config({"plugins": ["ddp"], "plugin_config": {"ddp": {"find_unused_paramters": True}}})
    with pytest.raises(TypeError, match="set by the ddp plugin"):
        check_ddp_options({"device_ids": [0]}, "wrap_model")
    assert {"find_unused_parameters", "static_graph", "broadcast_buffers", "bucket_cap_mb"} <= set(
        ddp_keyword_options()
    )
    plugin = DDPPlugin(options={"static_graph": True, "timeout_seconds": 30})
    assert plugin.ddp_options == {"static_graph": True} and plugin.timeout_seconds == 30


def test_one_process_with_ddp_listed_trains_unwrapped(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "experiment.yaml",
        dict(HPARAMS, ddp_options={"find_unused_parameters": True}),
        plugins={"only": ["callbacks", "metrics_log", "ddp"]},
    )
    _single_process(config, tmp_path / "run")
    record = read_rank(tmp_path / "run", 0)
    assert record["ddp"] is None and record["size"] == 1
    assert record["weights"] == pytest.approx(expected_weights(28, 4, 0.1, 8), rel=RTOL, abs=ATOL)


# ---------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------


def test_torchrun_command_one_machine_and_several() -> None:
    argv = ["run", "experiment.yaml"]
    command, local = hookdet_launcher.torchrun_command(argv, 4, [])
    assert local == 4
    # Each rank runs hookdet's rank entry (hookdet/distributed/rank_entry.py), which asks for its parent-death
    # signal before it imports anything heavy.
    # torchrun, through the agent that records how it ended (hookdet/distributed/torchrun_agent.py)
    assert command[1:] == [hookdet_launcher.TORCHRUN_AGENT, "--standalone", "--nproc-per-node=4", RANK_ENTRY, *argv]
    assert Path(RANK_ENTRY) == Path(hookdet_launcher.__file__).with_name("rank_entry.py") and Path(RANK_ENTRY).is_file()

    options = ["--nnodes=2", "--node-rank=1", "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-backend=c10d"]
    command, local = hookdet_launcher.torchrun_command(argv, 4, options)
    assert local == 2 and "--standalone" not in command
    assert command[2:] == ["--nproc-per-node=2", *options, RANK_ENTRY, *argv]

    with pytest.raises(UsageError, match="cannot be split evenly"):
        hookdet_launcher.torchrun_command(argv, 3, ["--nnodes=2"])
    with pytest.raises(UsageError, match="positive number of machines"):
        hookdet_launcher.torchrun_command(argv, 4, ["--nnodes=1:2"])


def test_launcher_exit_status_reflects_the_ranks() -> None:
    assert hookdet_launcher.combined_exit_status(0, {0: 0, 1: 0}, 2) == 0
    assert hookdet_launcher.combined_exit_status(1, {0: PREEMPTED_EXIT_CODE, 1: PREEMPTED_EXIT_CODE}, 2) == PREEMPTED_EXIT_CODE
    assert hookdet_launcher.combined_exit_status(0, {0: PREEMPTED_EXIT_CODE, 1: 0}, 2) == PREEMPTED_EXIT_CODE
    assert hookdet_launcher.combined_exit_status(1, {0: 0, 1: 2}, 2) == 2
    assert hookdet_launcher.combined_exit_status(1, {0: 0}, 2) == 1  # rank 1 died without a word
    assert hookdet_launcher.combined_exit_status(0, {}, 2) == 1


def test_a_rank_that_recorded_its_outcome_is_not_called_dead(tmp_path: Path) -> None:
    """When rank 1 is killed, rank 0 records why it stops (its outcome: status and error in one
    record, :mod:`hookdet.launch.outcome`): the line for the dead rank names rank 1, and only
    rank 1."""
    from hookdet.launch import outcome

    outcome.write(outcome.rank_path(tmp_path, 0), outcome.Outcome("failed", 1, 0, error="lost contact with the other ranks"))
    assert hookdet_launcher.read_rank_statuses(tmp_path) == {0: 1}
    lines = hookdet_launcher.failure_lines(tmp_path, hookdet_launcher.read_rank_statuses(tmp_path), 2)
    assert lines == [
        "hookdet: error: rank 0: lost contact with the other ranks",
        "hookdet: error: rank 1 ended without a status (killed by a signal, or out of memory); the other ranks were stopped",
    ]
    assert hookdet_launcher.failure_lines(tmp_path / "none", {}, 2) == []  # nobody said anything: no guess
    # A death torchrun recorded names the signal instead.
    killed = {1: outcome.Outcome("killed", -9, rank=1, pid=7, signal="SIGKILL")}
    assert hookdet_launcher.failure_lines(tmp_path, {}, 2, killed) == [
        lines[0], "hookdet: error: rank 1 (pid 7) was killed by SIGKILL; the other ranks were stopped"]


def test_a_rank_torchrun_saw_die_of_a_signal_is_one_line(tmp_path: Path) -> None:
    """How torchrun's ranks ended is read from what it recorded as data (its ``ProcessFailure``
    records, written by hookdet's torchrun agent as ``launcher.json``), not from its failure
    summary's text: a rank killed by a signal is an outcome record (rank, pid, signal), told in
    one line; a rank that exited with a status is no killed one (its own record tells it);
    torchrun's own failure one line."""
    from hookdet.launch import outcome

    (tmp_path / outcome.LAUNCHER_RECORD).write_text(json.dumps({
        "launcher": {"state": "failed", "exit_code": 1},
        "ranks": {"1": {"state": "killed", "exit_code": -6, "rank": 1, "pid": 12577, "signal": "SIGABRT"},
                  "0": {"state": "failed", "exit_code": 1, "rank": 0, "pid": 12576}}}))
    said: List[str] = []
    killed = hookdet_launcher.killed_in(tmp_path)
    assert list(killed) == [1] and (killed[1].pid, killed[1].signal) == (12577, "SIGABRT")
    assert hookdet_launcher.killed_line(killed[1]) == "hookdet: error: rank 1 (pid 12577) was killed by SIGABRT"
    hookdet_launcher.tell_launcher_failure(tmp_path, said)
    assert said == []
    (tmp_path / outcome.LAUNCHER_RECORD).write_text(json.dumps({
        "launcher": {"state": "failed", "exit_code": 1, "error": "RendezvousTimeoutError: no peers came"}, "ranks": {}}))
    hookdet_launcher.tell_launcher_failure(tmp_path, said)
    assert said == ["hookdet: error: torchrun failed: RendezvousTimeoutError: no peers came"]


def test_torchrun_options_are_refused_for_horovod(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write_config(
        tmp_path / "experiment.yaml", HPARAMS, plugins={"only": ["callbacks", "horovod"]}, resources={"slots_per_trial": 2}
    )
    status = cli.main(["run", str(config), "--nnodes=2", "--run-dir", str(tmp_path / "run")])
    assert status == 2
    assert "torchrun options do not apply to the horovod plugin" in capsys.readouterr().err
