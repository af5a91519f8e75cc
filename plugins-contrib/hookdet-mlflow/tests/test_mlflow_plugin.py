"""The mlflow plugin against a real sqlite store and a real ``mlflow server`` on 127.0.0.1.

Everything is read back with ``MlflowClient``: params, metric histories with their steps, tags,
run status, and checkpoint artifacts. Creating an MLflow database runs all of MLflow's schema
migrations (seconds), so one migrated database file is made per module and copied for each store.
"""
from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from mlflow.tracking import MlflowClient

from hookdet import pytorch
from hookdet.config import ConfigError
from hookdet_mlflow import MLflowPlugin, flatten_params
from hookdet.plugin import run_of
from tiny_trial import TinyTrial

TESTS = Path(__file__).resolve().parent
MLFLOW_CLI = Path(sys.executable).with_name("mlflow")
HOOKDET_CLI = Path(sys.executable).with_name("hookdet")
HPARAMS = {"lr": 0.1, "records": 8, "global_batch_size": 2, "optimizer": {"name": "sgd", "momentum": 0.0}}


@pytest.fixture(scope="module")
def migrated_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow sqlite database with the current schema, to copy."""
    path = tmp_path_factory.mktemp("mlflow_schema") / "schema.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture(scope="module")
def sqlite_store(migrated_database: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("mlflow_sqlite") / "mlflow.db"
    shutil.copyfile(migrated_database, path)
    return f"sqlite:///{path}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(migrated_database: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` (one worker, its own database copy and artifact directory)."""
    root = tmp_path_factory.mktemp("mlflow_server")
    shutil.copyfile(migrated_database, root / "server.db")
    port = _free_port()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_DISABLE_TELEMETRY="true")
    log = open(root / "server.log", "wb")
    server = subprocess.Popen(
        [str(MLFLOW_CLI), "server", "--backend-store-uri", f"sqlite:///{root / 'server.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                pytest.fail(f"mlflow server exited with {server.returncode}:\n{(root / 'server.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not answer:\n{(root / 'server.log').read_text()}")
            time.sleep(0.25)
        yield uri
    finally:
        # The server runs uvicorn workers in its own process group (start_new_session).
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def train(run_dir: Path, mlflow_options: Dict[str, Any], max_batches: int, resume: Any = None,
          hparams: Dict[str, Any] = HPARAMS, distributed: Any = None) -> Any:
    """One fit of the tiny trial with metrics_log, checkpoint and mlflow; returns the run."""
    exp_conf = {
        "name": "tiny",
        "hyperparameters": hparams,
        "plugins": {"only": ["metrics_log", "checkpoint", "mlflow"]},
        "plugin_config": {"mlflow": mlflow_options},
    }
    with pytorch.init(exp_conf=exp_conf, run_dir=run_dir, distributed=distributed) as context:
        trial = TinyTrial(context)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(max_batches), validation_period=pytorch.Batch(4),
            reporting_period=pytorch.Batch(2), latest_checkpoint=resume,
        )
    return run_of(context)


def read_reports(run_dir: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def expected_histories(run_dir: Path) -> Dict[str, List[tuple]]:
    """``metrics.jsonl`` as MLflow metric histories: key -> [(step, value)]."""
    histories: Dict[str, List[tuple]] = {}
    for record in read_reports(run_dir):
        for name, value in record["metrics"].items():
            histories.setdefault(f"{record['group']}/{name}", []).append((record["steps_completed"], value))
    return histories


def only_run(client: MlflowClient, experiment_name: str) -> Any:
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [run.info.run_id for run in runs]
    return runs[0]


def histories(client: MlflowClient, run: Any) -> Dict[str, List[tuple]]:
    return {
        key: [(metric.step, metric.value) for metric in sorted(client.get_metric_history(run.info.run_id, key),
                                                                 key=lambda m: (m.step, m.timestamp))]
        for key in run.data.metrics
    }


def test_params_metrics_tags_and_status_in_a_sqlite_store(
    sqlite_store: str, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    options = {"tracking_uri": sqlite_store, "experiment_name": "params-metrics-tags", "tags": {"team": "tests"}}
    run = train(tmp_path / "run", options, max_batches=8)
    client = MlflowClient(tracking_uri=sqlite_store)
    logged = only_run(client, "params-metrics-tags")

    assert logged.data.params == {
        "lr": "0.1", "records": "8", "global_batch_size": "2", "optimizer.name": "sgd", "optimizer.momentum": "0.0",
    }
    assert histories(client, logged) == expected_histories(tmp_path / "run")
    assert [step for step, _ in histories(client, logged)["training/loss"]] == [2, 4, 6, 8]
    tags = logged.data.tags
    assert tags["hookdet.trial_class"] == "tiny_trial:TinyTrial"
    assert tags["hookdet.experiment_name"] == "params-metrics-tags"
    assert tags["hookdet.run_dir"] == str((tmp_path / "run").resolve())
    assert tags["hookdet.latest_checkpoint"] == run.state.latest_checkpoint
    assert tags["team"] == "tests" and tags["mlflow.runName"] == "run"
    assert logged.info.status == "FINISHED"
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "server"])
def test_a_stopped_trial_resumes_into_the_same_run(
    store: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    uri = request.getfixturevalue("sqlite_store" if store == "sqlite" else "mlflow_server")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the plugin's fallback when no tracking_uri option
    options = {"experiment_name": f"resume-{store}"}
    run_dir = tmp_path / "run"
    client = MlflowClient(tracking_uri=uri)

    stopped = train(run_dir, options, max_batches=12, hparams={**HPARAMS, "stop_after": 6})
    assert stopped.exit_reason == "stopped" and stopped.state.batches_trained == 6
    first = only_run(client, f"resume-{store}")
    assert first.info.status == "KILLED"
    checkpoint = run_dir / "checkpoints" / stopped.state.latest_checkpoint
    assert json.loads((checkpoint / "metadata.json").read_text())["steps_completed"] == 6

    resumed = train(run_dir, options, max_batches=12, resume=str(checkpoint))
    assert resumed.exit_reason == "completed"
    logged = only_run(client, f"resume-{store}")
    assert logged.info.run_id == first.info.run_id
    assert logged.info.status == "FINISHED"
    assert logged.data.tags["hookdet.resumed_from"] == stopped.state.latest_checkpoint
    assert histories(client, logged) == expected_histories(run_dir)
    assert [step for step, _ in histories(client, logged)["training/loss"]] == [2, 4, 6, 8, 10, 12]
    assert [step for step, _ in histories(client, logged)["validation/validation_loss"]] == [4, 8, 12]


@pytest.mark.slow
def test_checkpoints_as_artifacts_on_a_server(mlflow_server: str, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    options = {"tracking_uri": mlflow_server, "experiment_name": "artifacts", "log_checkpoints": True}
    run = train(tmp_path / "run", options, max_batches=8)
    client = MlflowClient(tracking_uri=mlflow_server)
    logged = only_run(client, "artifacts")
    uploaded = [Path(info.path).name for info in client.list_artifacts(logged.info.run_id, "checkpoints")]
    latest = run.state.latest_checkpoint
    assert latest in uploaded and len(uploaded) >= 2
    downloaded = Path(client.download_artifacts(logged.info.run_id, f"checkpoints/{latest}", str(tmp_path)))
    local = tmp_path / "run" / "checkpoints" / latest
    names = sorted(path.name for path in local.iterdir())
    assert sorted(path.name for path in downloaded.iterdir()) == names and "metadata.json" in names
    _, mismatch, errors = filecmp.cmpfiles(local, downloaded, names, shallow=False)
    assert mismatch == [] and errors == []


def test_other_ranks_log_nothing(sqlite_store: str, tmp_path: Path, monkeypatch: Any) -> None:
    """A rank-1 process (its collectives are the identity: only its rank matters here)."""
    from hookdet.plugin import RankAloneContext

    monkeypatch.chdir(tmp_path)
    options = {"tracking_uri": sqlite_store, "experiment_name": "not-on-rank-1"}
    train(tmp_path / "run", options, max_batches=4, distributed=RankAloneContext(rank=1, size=2))
    assert MlflowClient(tracking_uri=sqlite_store).get_experiment_by_name("not-on-rank-1") is None


@pytest.mark.parametrize(
    "options, culprit",
    [
        ({"log_checkpoint": True}, "plugin_config.mlflow.log_checkpoint: unknown option 'log_checkpoint'; did you mean 'log_checkpoints'?"),
        ({"log_checkpoints": "yes"}, "plugin_config.mlflow.log_checkpoints: expected true or false; got 'yes'"),
        ({"tracking_uri": ""}, "plugin_config.mlflow.tracking_uri: String should have at least 1 character; got ''"),
        ({"tags": ["a"]}, "plugin_config.mlflow.tags: expected a mapping; got ['a']"),
    ],
)
def test_bad_options_name_the_plugin_and_the_field(options: Dict[str, Any], culprit: str, tmp_path: Path) -> None:
    """The options are declared (``MLflowPlugin.Options``): hookdet checks them when it reads the
    experiment, before the plugin is built."""
    with pytest.raises(ConfigError) as error:
        train(tmp_path, options, max_batches=2)
    assert str(error.value) == f"exp_conf: {culprit}"
    assert not (tmp_path / "run.json").exists()
    with pytest.raises(ValueError, match=re.escape(culprit)):  # built by hand, with a dict
        MLflowPlugin(options=options)


def test_flatten_params() -> None:
    nested = {"a": 1, "b": {"c": "x", "d": {"e": [1, 2]}}, "f": True, "g": None, "h": {}}
    assert flatten_params(nested) == {"a": "1", "b.c": "x", "b.d.e": "[1, 2]", "f": "true", "g": "null", "h": "{}"}


def test_state_dict_round_trip() -> None:
    plugin = MLflowPlugin()
    plugin.load_state_dict({"run_id": "abc", "experiment_id": "7"})
    assert plugin.state_dict() == {"run_id": "abc", "experiment_id": "7"}


def test_missing_mlflow_refuses_the_run_with_one_message(tmp_path: Path) -> None:
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(textwrap.dedent(
        """
        entrypoint: tiny_trial:TinyTrial
        hyperparameters: {lr: 0.1, records: 4, global_batch_size: 2}
        searcher: {name: single, metric: validation_loss, max_length: {batches: 2}}
        plugins: {only: [metrics_log, mlflow]}
        """
    ))
    child = (
        "import sys\n"
        "sys.modules['mlflow'] = None  # as if the package were not installed\n"
        "from hookdet.cli.commands import main\n"
        f"sys.exit(main(['run', {str(experiment)!r}, '--model-dir', {str(TESTS)!r}, "
        f"'--run-dir', {str(tmp_path / 'run')!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("hookdet: error:")]
    assert len(errors) == 1 and "plugin 'mlflow' needs the mlflow package" in errors[0], result.stderr
    assert "pip install hookdet-mlflow" in errors[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
