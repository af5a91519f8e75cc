"""The ``plugins:`` list through ``hookdet run``, pytest's ``-p`` way: names add to the defaults,
``no:<name>`` removes one, ``{only: [...]}`` runs exactly those; a ``plugin_config`` block for a
plugin that is not enabled is refused, naming it."""
from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path
from typing import List

import pytest

from hookdet.cli.commands import main
from hookdet.plugin import run_of
from tests.support import hookdet_process
from tests.test_cli import CONFIG_TEMPLATE, run_cli

REPO = Path(__file__).resolve().parent.parent


def with_plugins(block: str):
    """A config edit replacing the template's ``plugins:`` line with ``block``."""
    return lambda text: re.sub(r"^plugins: .*$", block, text, flags=re.M)


def produced(run_dir: Path) -> List[str]:
    """Which of the default plugins' outputs (and hook_timing's) the run directory holds."""
    found = []
    if any((run_dir / "checkpoints").glob("*/metadata.json")):
        found.append("checkpoints")
    if (run_dir / "metrics.jsonl").is_file():
        found.append("metrics.jsonl")
    if any((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        found.append("tensorboard")
    if (run_dir / "hook_timing-rank0.json").is_file():
        found.append("hook_timing")
    return found


def test_a_named_plugin_adds_to_the_defaults(tmp_path: Path) -> None:
    assert main(["run", *run_cli(tmp_path, edit=with_plugins("plugins: [hook_timing]"))]) == 0
    assert produced(tmp_path / "run") == ["checkpoints", "metrics.jsonl", "tensorboard", "hook_timing"]


def test_plus_name_as_the_docs_show_it_adds_to_the_defaults(tmp_path: Path) -> None:
    assert main(["run", *run_cli(tmp_path, edit=with_plugins("plugins: [+hook_timing, no:tensorboard]"))]) == 0
    assert produced(tmp_path / "run") == ["checkpoints", "metrics.jsonl", "hook_timing"]


def test_only_runs_exactly_the_listed_plugins(tmp_path: Path) -> None:
    edit = with_plugins("plugins: {only: [checkpoint, hook_timing]}")
    assert main(["run", *run_cli(tmp_path, edit=edit)]) == 0
    # metrics.jsonl is the host's record of the run, whatever plugins run.
    assert produced(tmp_path / "run") == ["checkpoints", "metrics.jsonl", "hook_timing"]


def test_plugin_config_for_a_plugin_not_enabled_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    edit = with_plugins("plugins: [no:progress]\nplugin_config:\n  progress: {log_every_s: 1}")
    assert main(["run", *run_cli(tmp_path, edit=edit)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("hookdet: error: ") and "\n" not in error, error
    assert "plugin_config.progress: plugin 'progress' is not enabled" in error, error
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_plugin_config_for_a_plugin_the_trial_never_switched_on_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``amp`` may be switched on by the trial (``use_amp()``); this trial never does."""
    edit = with_plugins("plugins: [no:progress]\nplugin_config:\n  amp: {dtype: bfloat16}")
    assert main(["run", *run_cli(tmp_path, edit=edit)]) == 2
    error = capsys.readouterr().err.strip()
    assert "plugin_config.amp: plugin 'amp' is not enabled" in error and "nor did the trial switch it on" in error
    assert not any((tmp_path / "run" / "checkpoints").glob("*"))


def test_the_resolved_names_are_on_the_run(tmp_path: Path) -> None:
    from hookdet import pytorch

    exp_conf = {"plugins": ["amp", "no:progress"], "hyperparameters": {"global_batch_size": 1}}
    with pytorch.init(exp_conf=exp_conf, run_dir=tmp_path) as context:
        run = run_of(context)
        assert run.plugin_names == (
            "callbacks", "preemption", "metrics_log", "checkpoint", "tensorboard", "run_log", "amp",
        )
        assert run.removed_plugins == frozenset({"progress"})


@pytest.mark.slow
def test_adding_mlflow_to_the_digits_example_keeps_checkpoints_metrics_and_tensorboard(tmp_path: Path) -> None:
    """The issue's report: ``plugins: [mlflow]`` used to leave only ``config.json`` behind."""
    pytest.importorskip("hookdet_mlflow")
    pytest.importorskip("sklearn")
    example = tmp_path / "digits"
    shutil.copytree(REPO / "examples" / "digits", example)
    config = (example / "const.yaml").read_text()
    config = config.replace("epochs: 10", "batches: 6").replace("epochs: 5", "batches: 3").replace("epochs: 1", "batches: 3")
    store = tmp_path / "mlflow.db"
    config += f"plugins: [mlflow]\nplugin_config:\n  mlflow: {{tracking_uri: 'sqlite:///{store}'}}\n"
    (example / "const.yaml").write_text(config)
    result = hookdet_process.run("run", example / "const.yaml", "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert produced(tmp_path / "run") == ["checkpoints", "metrics.jsonl", "tensorboard"]
    reports = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {report["group"] for report in reports} == {"training", "validation"}
    with sqlite3.connect(store) as db:
        logged = {key for (key,) in db.execute("select distinct key from metrics")}
    assert {"training/loss", "validation/validation_loss"} <= logged, logged
