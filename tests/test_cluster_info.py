"""The names a Trainer-API script touches on ``determined``, on ``hookdet`` with Determined's meaning,
and the Trainer API's checkpoint policy and retention as Determined's local Trainer has them."""
from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any, Dict, List

import pytest

import hookdet as det
from hookdet import InvalidHP, pytorch
from hookdet.trial_api import cluster_info
from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import lookup as lookup
from hookdet.runs.metrics import read_reports
from hookdet.config import parse_experiment_config
from hookdet.cli.script_entrypoint import EntrypointError, exit_status, script_command, split_launch_layer
from tests.fixtures.trainer_script.train import DigitsTrial

HPARAMS = {"learning_rate": 1.0, "global_batch_size": 32, "n_hidden": 8, "dropout": 0.0}


@pytest.fixture(autouse=True)
def no_cluster_info_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cluster_info.CLUSTER_INFO_ENV, raising=False)


# ---------------------------------------------------------------------------------- det.* names


def test_log_format_is_determineds() -> None:
    # determined/__init__.py: the format its WebUI's log viewer parses.
    assert det.LOG_FORMAT == "%(levelname)s: [%(process)s] %(name)s: %(message)s"


def test_get_cluster_info_is_none_when_run_bare() -> None:
    assert det.get_cluster_info() is None


def test_cluster_info_from_the_file_hookdet_run_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_experiment_config({
        "hyperparameters": {"lr": {"type": "const", "val": 0.5}, "layers": 3},
        "reproducibility": {"experiment_seed": 7},
        "data": {"url": "somewhere"},
        "entrypoint": "python3 train.py",
    })
    info = cluster_info.local_cluster_info(config, slots=2, latest_checkpoint="/ckpt/abc", run_dir=tmp_path / "run")
    path = cluster_info.write_cluster_info(info, tmp_path / "run" / "cluster-info" / "cluster.json")
    monkeypatch.setenv(cluster_info.CLUSTER_INFO_ENV, str(path))

    seen = det.get_cluster_info()
    assert isinstance(seen, det.ClusterInfo) and seen is not info  # read back from the file
    assert seen.task_type == "TRIAL"
    assert seen.trial.hparams == {"lr": 0.5, "layers": 3}
    assert seen.trial.trial_id == 1 and seen.trial.experiment_id == 1
    assert seen.trial.trial_seed == config.trial_seed(1) != parse_experiment_config({}).trial_seed(1)
    assert seen.latest_checkpoint == "/ckpt/abc"
    assert seen.user_data == {"url": "somewhere"}
    assert seen.container_rank == 0 and seen.container_addrs == ["127.0.0.1"]
    assert seen.slot_ids == [0, 1] and seen.container_slot_counts == [2]
    assert seen.run_dir == str((tmp_path / "run").resolve())
    assert seen.trial._config == config.to_dict()


def test_an_unreadable_cluster_info_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cluster.json").write_text("{not json")
    monkeypatch.setenv(cluster_info.CLUSTER_INFO_ENV, str(tmp_path / "cluster.json"))
    with pytest.raises(RuntimeError, match="HOOKDET_CLUSTER_INFO=.*cluster.json: unreadable"):
        det.get_cluster_info()


def test_invalid_hp_is_determineds() -> None:
    assert det.InvalidHP is InvalidHP
    error = det.InvalidHP("model too large for this width")
    assert error.msg == "model too large for this width" and isinstance(error, Exception)
    assert det.InvalidHP().msg == "..."
    with pytest.raises(TypeError, match="must be a string, not int"):
        det.InvalidHP(3)  # type: ignore[arg-type]


def test_core_distributed_context_has_determineds_constructors() -> None:
    cls = det.core.DistributedContext
    for name in ("from_torch_distributed", "from_horovod", "from_deepspeed"):
        assert "chief_ip" in inspect.signature(getattr(cls, name)).parameters
    alone = det.core.DummyDistributedContext()
    assert alone.get_num_agents() == 1 and alone.allgather_local("x") == ["x"]


def test_from_torch_distributed_outside_torchrun_says_how_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(RuntimeError, match="RANK, WORLD_SIZE not set; start the script under torchrun"):
        det.core.DistributedContext.from_torch_distributed()


def test_trainer_fit_takes_determineds_parameters_in_determineds_order() -> None:
    # determined/pytorch/_trainer.py, Trainer.fit in 0.38.1
    determined = [
        ("checkpoint_period", None), ("validation_period", None), ("max_length", None),
        ("reporting_period", pytorch.Batch(100)), ("checkpoint_policy", "best"),
        ("latest_checkpoint", None), ("step_zero_validation", False), ("test_mode", False),
        ("profiling_enabled", False),
    ]
    parameters = list(inspect.signature(pytorch.Trainer.fit).parameters.values())[1:]
    assert [(p.name, p.default) for p in parameters[: len(determined)]] == determined
    assert all(p.kind == p.KEYWORD_ONLY for p in parameters[len(determined):])


# ---------------------------------------------------------------------------------- entrypoints


def test_launch_layers_are_split_as_determineds_launchers_read_them() -> None:
    assert split_launch_layer(["python3", "train.py"]) == (None, [], ["python3", "train.py"])
    assert split_launch_layer(
        ["python3", "-m", "determined.launch.torch_distributed", "python3", "train.py", "--epochs", "1"]
    ) == ("torch_distributed", [], ["python3", "train.py", "--epochs", "1"])
    assert split_launch_layer(
        ["python", "-m", "determined.launch.torch_distributed", "--max_restarts=0", "--", "python3", "t.py"]
    ) == ("torch_distributed", ["--max_restarts=0"], ["python3", "t.py"])
    assert split_launch_layer(
        ["python3.11", "-m", "determined.launch.horovod", "--autohorovod", "python3", "t.py"]
    ) == ("horovod", [], ["python3", "t.py"])


def test_script_commands_run_as_determined_runs_them() -> None:
    command, is_launcher, env = script_command("python3 train.py --epochs 1", 1, [], "const.yaml")
    assert command == ["python3", "train.py", "--epochs", "1"] and not is_launcher and env == {}
    command, _, _ = script_command("cd sub && python3 train.py", 1, [], "const.yaml")
    assert command == ["sh", "-c", "cd sub && python3 train.py"]
    command, is_launcher, env = script_command(
        "python3 -m determined.launch.torch_distributed -- python3 train.py", 2, [], "d.yaml"
    )
    assert is_launcher and env == {"USE_TORCH_DISTRIBUTED": "True"}
    assert command[1].endswith("torchrun_agent.py") and command[2] == "--standalone"
    assert command[3:] == ["--nproc-per-node=2", "--no-python", "python3", "train.py"]


@pytest.mark.parametrize(
    ("entrypoint", "slots", "message"),
    [
        ("python3 -m determined.launch.deepspeed python3 t.py", 2, "DeepSpeed trials are not supported"),
        ("python3 -m determined.launch.tensorflow python3 t.py", 2, "unknown launch layer"),
        ("python3 -m determined.launch.torch_distributed", 2, "the launch layer wraps no script"),
    ],
)
def test_entrypoints_hookdet_cannot_run_are_refused_naming_the_file(entrypoint: str, slots: int, message: str) -> None:
    with pytest.raises(EntrypointError, match="^d.yaml: ") as error:
        script_command(entrypoint, slots, [], "d.yaml")
    assert message in str(error.value)


def test_horovod_launch_layer_without_horovod_names_what_to_install() -> None:
    try:
        import horovod  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("horovod is installed")
    with pytest.raises(EntrypointError, match="needs Horovod"):
        script_command("python3 -m determined.launch.horovod python3 t.py", 2, [], "d.yaml")


def test_exit_status_is_75_only_when_every_rank_stopped_with_a_checkpoint() -> None:
    from hookdet.launch.outcome import Outcome

    def ranks(*states: str) -> Dict[int, Outcome]:  # each rank's record of how its training ended
        return {rank: Outcome(state, rank=rank) for rank, state in enumerate(states)}

    assert exit_status(0, ranks("preempted"), 1, is_launcher=False) == 75
    assert exit_status(0, ranks("completed"), 1, is_launcher=False) == 0
    assert exit_status(3, ranks("preempted"), 1, is_launcher=False) == 3  # crashed after training
    assert exit_status(1, ranks("preempted", "preempted"), 2, is_launcher=True) == 75
    assert exit_status(1, ranks("preempted"), 2, is_launcher=True) == 1  # rank 1 never finished
    assert exit_status(-15, {}, 1, is_launcher=False) == 128 + 15


# ---------------------------------------------------------------------------------- checkpoints


def fit_digits(tmp_path: Path, exp_conf: Dict[str, Any], policy: str = "best") -> List[int]:
    """Train the fixture trial 8 batches validating every 2; the steps of the checkpoints kept."""
    with pytorch.init(hparams=HPARAMS, exp_conf=exp_conf, run_dir=tmp_path / "run") as context:
        trial = DigitsTrial(context, hparams=HPARAMS)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(8), validation_period=pytorch.Batch(2), checkpoint_policy=policy
        )
    return [meta["steps_completed"] for _, meta in lookup.find_checkpoints(tmp_path / "run" / "checkpoints")]


def test_trainer_api_run_bare_checkpoints_every_validation_and_keeps_them_all(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Determined's local Trainer: policy 'best' falls back to 'all' with a warning, and no
    checkpoint is ever deleted (the searcher metric here is not even reported)."""
    with caplog.at_level(logging.WARNING, logger="hookdet"):
        steps = fit_digits(tmp_path, {"searcher": {"metric": "not_reported"}})
    assert steps == [2, 4, 6, 8]
    assert "checkpoint_policy='best' is not supported in local training mode. Falling back to 'all'." in caplog.text


def under_hookdet_run(exp_conf: Dict[str, Any]) -> Any:
    """The cluster info ``hookdet run`` gives an experiment file ``exp_conf``, in this process."""
    return cluster_info.activated(cluster_info.local_cluster_info(parse_experiment_config(exp_conf), slots=1))


def validation_losses(run_dir: Path) -> Dict[int, float]:
    return {
        record["steps_completed"]: record["metrics"]["validation_loss"]
        for record in read_reports(run_dir)
        if record["group"] == "validation"
    }


def test_under_hookdet_run_a_missing_searcher_metric_stops_at_the_first_validation(tmp_path: Path) -> None:
    """Policy 'best' with a trial that does not report the searcher metric: stopped at the first
    validation, as Determined's harness stops it (its words kept), naming the metrics the trial
    reported and the closest one, instead of training on."""
    from hookdet.trial_api.trial import TrialError

    exp_conf = {"searcher": {"metric": "validation_los"}, "checkpoint_storage": {
        "type": "directory", "container_path": str(tmp_path / "run" / "checkpoints"), "save_trial_latest": 100}}
    with under_hookdet_run(exp_conf), pytest.raises(TrialError) as raised:
        fit_digits(tmp_path, exp_conf)
    message = str(raised.value)
    assert message.startswith("searcher.metric 'validation_los' is not among the validation metrics the "
                              "trial reported (")
    assert "; did you mean 'validation_loss'?" in message
    assert "Search method is configured to use metric 'validation_los' but model definition returned" in message
    validations = [r["steps_completed"] for r in read_reports(tmp_path / "run") if r["group"] == "validation"]
    assert validations == [2]  # the first validation, then nothing more


def test_under_hookdet_run_policy_best_checkpoints_only_improvements(tmp_path: Path) -> None:
    # Larger is better here, so the falling loss improves only at the first validation.
    exp_conf = {"searcher": {"metric": "validation_loss", "smaller_is_better": False}, "checkpoint_storage": {
        "type": "directory", "container_path": str(tmp_path / "run" / "checkpoints"), "save_trial_latest": 100}}
    with under_hookdet_run(exp_conf):
        steps = fit_digits(tmp_path, exp_conf)
    losses = validation_losses(tmp_path / "run")
    improved = [step for step, loss in losses.items() if all(loss > losses[s] for s in losses if s < step)]
    assert len(improved) < len(losses)
    assert steps == sorted(set(improved) | {8})  # and the end of training


def test_under_hookdet_run_unconfigured_retention_has_determineds_defaults(tmp_path: Path) -> None:
    """The experiment-file path keeps the cluster's defaults (save_trial_latest 1, save_trial_best 1)
    where the Trainer API run bare keeps everything (the test above)."""
    exp_conf = {"searcher": {"metric": "validation_loss", "smaller_is_better": False}}
    with under_hookdet_run(exp_conf):
        steps = fit_digits(tmp_path, exp_conf, policy="all")
    losses = validation_losses(tmp_path / "run")
    best = max(losses, key=lambda step: (losses[step], -step))
    assert best != 8 and steps == sorted({best, 8})


def test_a_script_of_several_slots_without_a_launch_layer_runs_once_and_is_refused_by_its_init(
    tmp_path: Path
) -> None:
    """As Determined runs it: the command starts once with the cluster info of every slot, and the
    script's ``pytorch.init`` (like ``core.init``) refuses to train one process for two slots, in
    one line; the run's record says it failed."""
    import shutil

    from hookdet.runs.record import read_record
    from tests.support import hookdet_process

    model_dir = Path(shutil.copytree(Path(__file__).parent / "fixtures" / "trainer_script", tmp_path / "model"))
    finished = hookdet_process.run("run", "const.yaml", "--slots", "2", "--run-dir", "run", cwd=model_dir)
    assert finished.returncode == 1, finished.stderr[-2000:]
    assert ("hookdet: error: you must provide a valid DistributedContext for a multi-slot task: the trial has 2 "
            "slots") in finished.stderr
    assert "Traceback" not in finished.stderr
    assert read_record(model_dir / "run")["state"] == "failed"
