"""A Trainer-API script in the shape of Determined's mnist tutorial (tests/fixtures/trainer_script)
runs unchanged but for its import: bare, under torchrun, and through ``hookdet run`` with its own
const and distributed YAML; resume reaches ``info.latest_checkpoint``; and the real Determined runs
the same script bare.

Bare and "on cluster" runs of the same hyperparameters and seed train to the same bytes, and so
do the two 2-rank runs, so each pair checks the other.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from hookdet.checkpoints import lookup as lookup
from hookdet.config import load_experiment_config
from tests.support import hookdet_process
from tests.support.distributed_trials import free_port

FIXTURE = Path(__file__).parent / "fixtures" / "trainer_script"
VENV_BIN = Path(sys.executable).parent


def environment(tmp_path: Path, **extra: str) -> Dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("HOOKDET_CLUSTER_INFO", "HOOKDET_RUN_DIR")}
    env.update(OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "cache"), **extra)
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    return env


def model_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    if not directory.exists():
        shutil.copytree(FIXTURE, directory, ignore=shutil.ignore_patterns("__pycache__"))
    return directory


def run(command: List[str], tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    """``command`` in the model directory, to a good end: ``hookdet ...`` as the tests run hookdet
    (:mod:`tests.support.hookdet_process`), anything else (``python3 train.py``, torchrun) as typed."""
    if command[0] == "hookdet":
        result = hookdet_process.run(*command[1:], cwd=model_dir(tmp_path), env=environment(tmp_path, **extra),
                                     timeout=300)
    else:
        result = subprocess.run(command, cwd=model_dir(tmp_path), env=environment(tmp_path, **extra),
                                capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def results(output: str) -> List[Dict[str, Any]]:
    """The RESULT records the script printed, by rank. Ranks share one stdout, so a record is
    read wherever it starts: ``print`` writes a record in one piece but its newline apart, and
    horovodrun prefixes each line with ``[rank]<stdout>:``."""
    decoder = json.JSONDecoder()
    found = [decoder.raw_decode(output, match.end())[0] for match in re.finditer(r"RESULT ", output)]
    return sorted(found, key=lambda result: result["rank"])


@pytest.fixture(scope="module")
def const_run(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """``hookdet run const.yaml`` (entrypoint ``python3 train.py --epochs 1``): its RESULT line."""
    tmp_path = tmp_path_factory.mktemp("const")
    result = run(["hookdet", "run", "const.yaml", "--run-dir", str(tmp_path / "run")], tmp_path)
    (seen,) = results(result.stdout)
    return {"result": seen, "run_dir": tmp_path / "run", "stderr": result.stderr}


@pytest.mark.slow
def test_bare_and_under_hookdet_run_train_the_same(tmp_path: Path, const_run: Dict[str, Any]) -> None:
    bare = run([sys.executable, "train.py", "--epochs", "1"], tmp_path, HOOKDET_RUN_DIR=str(tmp_path / "bare"))
    (local,) = results(bare.stdout)
    on_cluster = const_run["result"]

    assert local["local"] is True and local["trial_id"] is None  # get_cluster_info() is None
    config = load_experiment_config(FIXTURE / "const.yaml")
    assert on_cluster["local"] is False
    assert on_cluster["trial_id"] == 1 and on_cluster["trial_seed"] == config.trial_seed(1)
    assert on_cluster["latest_checkpoint"] is None
    assert local["weights"] == on_cluster["weights"]
    # Each wrote its checkpoint where its run directory is: the bare one where HOOKDET_RUN_DIR says,
    # the script under hookdet run where hookdet run's --run-dir says (told through the cluster info).
    assert [meta["steps_completed"] for _, meta in lookup.find_checkpoints(tmp_path / "bare" / "checkpoints")] == [8]
    assert [meta["steps_completed"] for _, meta in lookup.find_checkpoints(const_run["run_dir"] / "checkpoints")] == [8]


@pytest.mark.slow
def test_two_ranks_under_torchrun_and_hookdet_run_train_the_same(tmp_path: Path) -> None:
    torchrun = run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "train.py", "--epochs", "1"],
        tmp_path, HOOKDET_RUN_DIR=str(tmp_path / "torchrun"),
    )
    launched = run(["hookdet", "run", "distributed.yaml", "--run-dir", str(tmp_path / "run")], tmp_path)
    local, on_cluster = results(torchrun.stdout), results(launched.stdout)

    assert [r["rank"] for r in local] == [r["rank"] for r in on_cluster] == [0, 1]
    assert {r["size"] for r in local + on_cluster} == {2}
    assert {r["local"] for r in local} == {True} and {r["local"] for r in on_cluster} == {False}
    # DistributedContext.from_torch_distributed() given to pytorch.init: models are DDP-wrapped, so
    # gradients are averaged and every rank ends with the same weights; the same as under hookdet run.
    # DDP, or hookdet's subclass of it that passes attribute reads through as Determined's does.
    assert all(r["wrapped"].endswith("DistributedDataParallel") for r in local + on_cluster)
    assert len({r["weights"] for r in local + on_cluster}) == 1


@pytest.mark.slow
def test_two_machines_on_localhost_leave_one_run_directory(tmp_path: Path) -> None:
    """Two ``hookdet run two.yaml --nnodes=2 --node-rank=N`` on one machine, each with its
    default run directory and the checkpoints on a shared filesystem: rank 0's machine records
    the run, the other makes no directory and says where the run is; the script reads each
    machine's own rank from its cluster info. With the default storage (each machine's own
    disk) and no shared ``--run-dir``, the run is refused before anything starts."""
    directory = model_dir(tmp_path)
    config = yaml.safe_load((directory / "distributed.yaml").read_text())
    (directory / "own-disk.yaml").write_text(yaml.safe_dump(config))
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "shared")}
    (directory / "two.yaml").write_text(yaml.safe_dump(config))
    refused = hookdet_process.run("run", "own-disk.yaml", "--nnodes=2", "--node-rank=0", "--rdzv-endpoint=127.0.0.1:1",
                                  cwd=directory, env=environment(tmp_path), timeout=120)
    assert refused.returncode == 2 and "needs checkpoints every machine can read" in refused.stderr \
        and "shared_fs" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert not (directory / "runs").exists()

    endpoint = f"127.0.0.1:{free_port()}"
    launchers = [hookdet_process.start(
        "run", "two.yaml", "--nnodes=2", f"--node-rank={node}", f"--rdzv-endpoint={endpoint}", "--rdzv-backend=c10d",
        "--rdzv-id=two-machines", cwd=directory, env=environment(tmp_path)) for node in (0, 1)]
    outputs = [launcher.communicate(timeout=300) for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], [err[-3000:] for _, err in outputs]
    (run_dir,) = (directory / "runs").iterdir()
    assert sorted(path.name for path in run_dir.iterdir()) == [
        ".hookdet.lock", "config.json", "history.jsonl", "logs", "metrics-summary.json", "metrics.jsonl", "run.json",
        "run_identity.json", "tensorboard"]
    endings = sorted(line for stdout, _ in outputs for line in stdout.splitlines() if line.startswith("hookdet: "))
    assert endings[0] == "hookdet: completed after 8 batches", outputs
    assert endings[1].startswith("hookdet: entrypoint exited with status 0 on this machine (node "), endings
    assert len(endings) == 2
    assert sorted(result["container_rank"] for stdout, _ in outputs for result in results(stdout)) == [0, 1]


@pytest.mark.slow
def test_two_ranks_under_the_horovod_launch_layer(tmp_path: Path) -> None:
    """``horovod.yaml`` (``python3 -m determined.launch.horovod --autohorovod python3 train.py``):
    hookdet run starts the script's 2 ranks with horovodrun, and the script's ``pytorch.init()``
    trains them as one data-parallel job (the horovod plugin, chosen by horovodrun's ranks)."""
    pytest.importorskip("horovod.torch", reason="Horovod is not built here (scripts/build_horovod.sh; .ci/run builds it)")
    launched = run(["hookdet", "run", "horovod.yaml", "--run-dir", str(tmp_path / "run")], tmp_path)
    ranks = results(launched.stdout)
    assert [r["rank"] for r in ranks] == [0, 1] and {r["size"] for r in ranks} == {2}
    assert {r["local"] for r in ranks} == {False}
    ddp = results(run(["hookdet", "run", "distributed.yaml", "--run-dir", str(tmp_path / "ddp")],
                      tmp_path).stdout)
    # Gradients averaged by Horovod on every step: every rank ends with DDP's weights, bit for bit.
    assert len({r["weights"] for r in ranks + ddp}) == 1
    checkpoints = lookup.find_checkpoints(tmp_path / "run" / "checkpoints")
    assert [meta["steps_completed"] for _, meta in checkpoints] == [8]  # an epoch: 256 records, 32 a batch


@pytest.mark.slow
def test_a_rank_aborting_after_its_training_ended_does_not_fail_the_run(tmp_path: Path) -> None:
    """Rank 1 of ``distributed.yaml`` aborts (SIGABRT) as it exits, after training: the run is
    complete (exit 0, its checkpoint there) and one warning names the rank and the signal. An
    abort before training ended still fails the run, naming the rank."""
    launched = run(["hookdet", "run", "distributed.yaml", "--run-dir", str(tmp_path / "run")],
                   tmp_path, TRAIN_ABORT_AT_EXIT_RANK="1")
    warnings = [line for line in launched.stderr.splitlines() if line.startswith("hookdet: warning: rank 1")]
    assert len(warnings) == 1 and "was killed by SIGABRT after its training ended" in warnings[0], launched.stderr
    assert "hookdet: completed after 8 batches" in launched.stdout
    assert [meta["steps_completed"] for _, meta in lookup.find_checkpoints(tmp_path / "run" / "checkpoints")] == [8]

    failed = hookdet_process.run("run", "distributed.yaml", "--run-dir", tmp_path / "failed", cwd=model_dir(tmp_path),
                                 env=environment(tmp_path, TRAIN_ABORT_AT_START_RANK="1"), timeout=300)
    assert failed.returncode != 0
    assert any(line.startswith("hookdet: error: rank 1 (pid ") and line.endswith("was killed by SIGABRT")
               for line in failed.stderr.splitlines()), failed.stderr[-3000:]


@pytest.mark.slow
def test_preempted_script_exits_75_and_resume_reaches_latest_checkpoint(
    tmp_path: Path, const_run: Dict[str, Any]
) -> None:
    """SIGTERM to ``hookdet run`` reaches the script, which checkpoints and stops: exit 75. ``--resume
    RUN_DIR`` hands the script the id of the run's newest checkpoint as ``info.latest_checkpoint``, and it finishes
    with the weights of the run that was never stopped."""
    directory = model_dir(tmp_path)
    slow = (FIXTURE / "const.yaml").read_text().replace(
        "  dropout: 0.25\n", "  dropout: 0.25\n  seconds_per_batch: 0.25\n"
    )
    assert "seconds_per_batch" in slow
    (directory / "slow.yaml").write_text(slow)
    run_dir = tmp_path / "run"
    command = ["hookdet", "run", "slow.yaml", "--run-dir", str(run_dir)]
    process = hookdet_process.start(*command[1:], cwd=directory, env=environment(tmp_path))
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "config.json").exists():  # written by the script's pytorch.init()
            assert process.poll() is None and time.monotonic() < deadline, "the script did not start"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
    finally:
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 75, stdout[-2000:] + stderr[-2000:]
    assert results(stdout) and results(stdout)[0]["weights"] != const_run["result"]["weights"]
    ((stopped_at, checkpoint),) = [(meta["steps_completed"], meta["uuid"])
                                   for _, meta in lookup.find_checkpoints(run_dir / "checkpoints")]
    assert stopped_at < 8
    # Ended as a trial class's run ends: how, the best metric, the run directory, the checkpoint.
    ending = stdout[stdout.index(f"hookdet: preempted after {stopped_at} batches"):]
    assert f"  run directory: {run_dir.resolve()}" in ending and "  best validation_loss: " in ending
    assert f"  latest checkpoint: {(run_dir / 'checkpoints').resolve()}/" in ending

    resumed = run(command + ["--resume", str(run_dir)], tmp_path)
    (seen,) = results(resumed.stdout)
    assert seen["latest_checkpoint"] == checkpoint  # the run's newest checkpoint, by id, as a cluster hands it
    assert seen["weights"] == const_run["result"]["weights"]


@pytest.mark.parametrize("entrypoint", ["python3 missing.py --epochs 1",
                                        "python3 -m determined.launch.torch_distributed -- python3 missing.py"])
def test_a_missing_script_is_one_line_before_anything_starts(tmp_path: Path, entrypoint: str) -> None:
    directory = model_dir(tmp_path)
    config = (FIXTURE / ("distributed.yaml" if "launch" in entrypoint else "const.yaml")).read_text()
    config = re.sub(r"(?m)^entrypoint:.*$", f"entrypoint: {entrypoint}", config)
    (directory / "missing.yaml").write_text(config)
    result = hookdet_process.run("run", "missing.yaml", "--run-dir", tmp_path / "run", cwd=directory,
                                 env=environment(tmp_path), timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert lines == [f"hookdet: error: missing.yaml: entrypoint {entrypoint!r}: no script missing.py in the "
                     f"model directory {directory}"], result.stderr[-3000:]


RECORDED_FAILURE = '''\
import os
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 has no data shard")

main()
'''


@pytest.mark.slow
def test_a_script_ranks_error_recorded_by_torchrun_is_one_line_naming_the_rank(tmp_path: Path) -> None:
    """A script under ``determined.launch.torch_distributed`` whose ``main`` has torch's
    ``@record``: the error its rank 1 raised reaches ``hookdet run`` through torchrun's error file
    (``TORCHELASTIC_ERROR_FILE``, read from torchrun's record of the failed rank), told in one
    line naming the rank and its pid."""
    directory = model_dir(tmp_path)
    (directory / "recorded.py").write_text(RECORDED_FAILURE)
    config = re.sub(r"(?m)^entrypoint:.*$", "entrypoint: python3 -m determined.launch.torch_distributed -- python3 recorded.py",
                    (FIXTURE / "distributed.yaml").read_text())
    (directory / "recorded.yaml").write_text(config)
    result = hookdet_process.run("run", "recorded.yaml", "--run-dir", tmp_path / "run", cwd=directory,
                                 env=environment(tmp_path), timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    told = [line for line in result.stderr.splitlines() if line.startswith("hookdet: error: rank 1 ")]
    assert len(told) == 1 and re.fullmatch(r"hookdet: error: rank 1 \(pid \d+\) failed: RuntimeError: rank 1 has no "
                                           r"data shard \(torchrun's error file\)", told[0]), result.stderr[-3000:]


def test_test_mode_reaches_a_scripts_trainer_fit(tmp_path: Path) -> None:
    """``hookdet run const.yaml --test-mode``: the script's own ``Trainer.fit`` (no test_mode
    argument) trains one batch, validates one and checkpoints, as a trial class would."""
    run_dir = tmp_path / "run"
    run(["hookdet", "run", "const.yaml", "--test-mode", "--run-dir", str(run_dir)], tmp_path)
    assert [meta["steps_completed"] for _, meta in lookup.find_checkpoints(run_dir / "checkpoints")] == [1]
    validations = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line)["group"] == "validation"]
    assert [record["steps_completed"] for record in validations] == [1]


def records_of(run_dir: Path) -> Dict[str, bytes]:
    return {name: (run_dir / name).read_bytes()
            for name in ("run.json", "config.json", "metrics.jsonl", "run_identity.json", "history.jsonl")}


@pytest.mark.slow
@pytest.mark.parametrize("launch", [[], [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]],
                         ids=["bare", "torchrun-2-ranks"])
def test_a_second_script_run_into_its_run_directory_is_refused_naming_latest_checkpoint(
    tmp_path: Path, launch: List[str], const_run: Dict[str, Any]
) -> None:
    """The script run bare (or under torchrun) with the run directory of a run that finished,
    and no checkpoint to continue from (the fixture passes ``latest_checkpoint=None`` when run
    bare): refused on every rank, naming ``Trainer.fit(latest_checkpoint=...)``, and the run's
    records stay byte for byte; under torchrun no rank is left waiting on the other."""
    run_dir = tmp_path / "run"
    shutil.copytree(const_run["run_dir"], run_dir)
    command = [*(launch or [sys.executable]), "train.py", "--epochs", "1"]
    before = records_of(run_dir)

    second = subprocess.run(command, cwd=model_dir(tmp_path), env=environment(tmp_path, HOOKDET_RUN_DIR=str(run_dir)),
                            capture_output=True, text=True, timeout=300)
    assert second.returncode != 0, second.stdout[-2000:]
    refusal = f"ExistingRunError: run directory {run_dir} already holds a run; continue it with " \
              f"Trainer.fit(latest_checkpoint={str(run_dir)!r})"
    assert second.stderr.count(refusal) == max(1, len(launch) and 2), second.stderr[-4000:]
    assert not results(second.stdout)
    assert records_of(run_dir) == before


def test_a_resume_into_a_script_that_ignores_latest_checkpoint_is_refused_not_trained_again(
    tmp_path: Path, const_run: Dict[str, Any]
) -> None:
    """``hookdet run const.yaml --resume RUN_DIR`` where the script passes
    ``latest_checkpoint=None`` whatever ``det.get_cluster_info()`` says: it would train from
    batch 0 over the run's history. Refused as a second history in one line (after Determined's
    warning that ``latest_checkpoint`` was not configured); the run's records stay byte for byte."""
    run_dir = tmp_path / "run"
    shutil.copytree(const_run["run_dir"], run_dir)
    script = model_dir(tmp_path) / "train.py"
    source = script.read_text()
    ignoring = source.replace("latest_checkpoint = info.latest_checkpoint  # For pause/resume.",
                              "latest_checkpoint = None  # ignored")
    assert ignoring != source
    script.write_text(ignoring)
    before = records_of(run_dir)
    resumed = hookdet_process.run("run", "const.yaml", "--resume", run_dir, cwd=model_dir(tmp_path),
                                  env=environment(tmp_path), timeout=300)
    assert resumed.returncode == 1, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "latest_checkpoint has not been configured" in resumed.stderr
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("hookdet: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"hookdet: error: run directory {run_dir} already holds a run"), \
        resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    assert not results(resumed.stdout)
    assert records_of(run_dir) == before


def determined_copy(tmp_path: Path) -> Path:
    """The fixture with its two import lines changed to Determined's."""
    directory = tmp_path / "determined"
    directory.mkdir()
    source = (FIXTURE / "train.py").read_text()
    changed = source.replace(
        "import hookdet as det  # under Determined: import determined as det", "import determined as det"
    ).replace(
        "from hookdet import pytorch  # under Determined: from determined import pytorch",
        "from determined import pytorch",
    )
    assert "import hookdet" not in changed and "from hookdet" not in changed
    (directory / "train.py").write_text(changed)
    shutil.copy(FIXTURE / "const.yaml", directory)
    return directory


def tensorboard_for_determined(tmp_path: Path) -> Path:
    """A folder with this environment's TensorBoard on it: Determined 0.38.1 needs TensorBoard to
    report metrics but does not depend on it (DESIGN §7); a user installs it."""
    import tensorboard

    folder = tmp_path / "tensorboard-path"
    folder.mkdir()
    site = Path(tensorboard.__file__).parent.parent
    for name in ("tensorboard", "tensorboard_data_server", "absl", "markdown", "werkzeug"):
        if (site / name).exists():
            (folder / name).symlink_to(site / name)
    return folder


@pytest.mark.slow
def test_the_fixture_is_a_determined_script(tmp_path: Path) -> None:
    """The real Determined (the parity suite's environment) runs the fixture as its tutorial."""
    from tests.parity.harness import require_determined

    determined_python = str(require_determined())
    directory = determined_copy(tmp_path)
    env = environment(tmp_path, PYTHONPATH=str(tensorboard_for_determined(tmp_path)))
    result = subprocess.run(
        [determined_python, "train.py", "--epochs", "1"], cwd=directory, env=env,
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (seen,) = results(result.stdout)
    assert seen["local"] is True and seen["size"] == 1 and seen["wrapped"] == "Sequential"
    assert "report_validation_metrics(steps_completed=8" in result.stderr
    assert "checkpoint_policy='best' is not supported in local training mode" in result.stderr


@pytest.mark.slow
def test_a_script_resuming_a_run_that_does_not_fit_says_so_in_one_line(tmp_path: Path) -> None:
    """A script resuming another trial's run (a different model structure): the one line a trial
    class's run prints (``hookdet: error: cannot resume: ...``), not a traceback through
    hookdet's loop and pluggy; the other run is left as it was."""
    other = tmp_path / "other"
    config = tmp_path / "line.yaml"
    config.write_text("entrypoint: search_trial:LineTrial\nhyperparameters: {global_batch_size: 8, optimizer: {lr: 0.1}}\n"
                      "searcher: {name: single, metric: validation_loss, max_length: {batches: 2}}\n")
    trained = hookdet_process.run("run", config, "--run-dir", other, "--model-dir",
                                  Path(__file__).parent / "fixtures" / "search", cwd=tmp_path, env=environment(tmp_path),
                                  timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    before = sorted(path.name for path in (other / "checkpoints").iterdir())
    resumed = hookdet_process.run("run", "const.yaml", "--resume", other, cwd=model_dir(tmp_path),
                                  env=environment(tmp_path), timeout=300)
    assert resumed.returncode == 1, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("hookdet: error: ")]
    assert len(errors) == 1 and errors[0].startswith("hookdet: error: cannot resume: checkpoint "), resumed.stderr
    assert sorted(path.name for path in (other / "checkpoints").iterdir()) == before
