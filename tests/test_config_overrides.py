"""``hookdet run CONFIG --config KEY=VALUE`` and ``hookdet --version``."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hookdet.cli.commands import main
from hookdet.config import ConfigError
from hookdet.config.overrides import load_with_overrides, parse_override

REPO = Path(__file__).resolve().parents[1]

EXPERIMENT = """
entrypoint: tests.support.trials:OneWeightTrial
hyperparameters:
  lr: 0.1
  records: 8
  global_batch_size: 2
  layers: [4, 8]
  optimizer: {name: sgd, momentum: 0.9}
searcher: {name: single, metric: validation_loss, max_length: {epochs: 1}}
min_validation_period: {batches: 2}
"""


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    path = tmp_path / "const.yaml"
    path.write_text(textwrap.dedent(EXPERIMENT))
    return path


def test_values_are_read_as_yaml_and_keys_as_dotted_paths() -> None:
    assert parse_override("hyperparameters.lr=1e-3") == (["hyperparameters", "lr"], 0.001)
    assert parse_override("a.b[1][0]=x") == (["a", "b", 1, 0], "x")
    assert parse_override("a.b.2={c: [1, 2]}") == (["a", "b", 2], {"c": [1, 2]})
    assert parse_override("a=") == (["a"], None)
    assert parse_override("a=yes") == (["a"], "yes")  # YAML 1.2, as the file is read


def test_nested_keys_lists_and_lengths(experiment: Path) -> None:
    config = load_with_overrides(experiment, [
        "hyperparameters.lr=0.01",
        "hyperparameters.optimizer.momentum=0.5",
        "hyperparameters.layers[1]=64",
        "hyperparameters.new_one=[1, 2]",
        "searcher.max_length.batches=3",
        "min_validation_period={batches: 1}",
    ])
    assert config.hyperparameters == {
        "lr": 0.01, "records": 8, "global_batch_size": 2, "layers": [4, 64],
        "optimizer": {"name": "sgd", "momentum": 0.5}, "new_one": [1, 2],
    }
    # A length replaces the file's length, unit and all (no "epochs and batches" mix).
    assert (config.searcher.max_length.value, config.searcher.max_length.unit) == (3, "batches")
    assert config.min_validation_period.value == 1
    # The last of two options for one field wins.
    assert load_with_overrides(experiment, ["hyperparameters.lr=1", "hyperparameters.lr=2"]).hyperparameters["lr"] == 2


@pytest.mark.parametrize("option, message", [
    ("searcher.max_lenght.batches=3",
     "(--config searcher.max_lenght.batches=3): unknown field 'searcher.max_lenght'; did you mean 'max_length'?"),
    ("hyperparameters.lrr=0.5",
     "--config hyperparameters.lrr=0.5: no hyperparameter 'lrr' in the experiment file; did you mean 'lr'?"),
    ("min_validaton_period={batches: 1}", "did you mean 'min_validation_period'?"),
])
def test_a_typo_gets_a_suggestion(experiment: Path, option: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_with_overrides(experiment, [option])
    assert message in str(error.value)


@pytest.mark.parametrize("option, message", [
    ("resources.slots_per_trial=two", "resources.slots_per_trial: expected a whole number; got 'two'"),
    ("searcher.smaller_is_better=maybe", "searcher.smaller_is_better: expected true or false; got 'maybe'"),
    ("searcher.max_length.batches=abc", "searcher.max_length: the number of batches must be a whole number; got 'abc'"),
    ("hyperparameters.layers[2]=1", "index 2 is out of range; hyperparameters.layers has 2 element(s)"),
    ("hyperparameters.lr[0]=1", "index 0 given, but hyperparameters.lr is not a list"),
    ("hyperparameters.lr", "expected KEY=VALUE"),
    ("hyperparameters.lr=[1", "malformed YAML"),
])
def test_a_wrong_type_names_the_option(experiment: Path, option: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_with_overrides(experiment, [option])
    assert message in str(error.value) and f"--config {option}" in str(error.value)


def test_the_file_s_own_problems_still_name_its_line(experiment: Path) -> None:
    experiment.write_text(experiment.read_text() + "scheduling_unit: ten\n")
    with pytest.raises(ConfigError, match=r"const.yaml:11: scheduling_unit: expected a whole number"):
        load_with_overrides(experiment, ["hyperparameters.lr=0.2"])


def test_hookdet_run_takes_config_options(experiment: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    status = main(["run", str(experiment), "--model-dir", str(REPO), "--run-dir", str(run_dir),
                   "--config", "hyperparameters.lr=0.05", "--config", "searcher.max_length.batches=2"])
    assert status == 0
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["hyperparameters"]["lr"] == 0.05 and saved["searcher"]["max_length"] == {"batches": 2}
    assert json.loads((run_dir / "run.json").read_text())["batches_trained"] == 2

    assert main(["run", str(experiment), "--run-dir", str(tmp_path / "bad"), "--config", "searcher.metrik=x"]) == 2
    assert "did you mean 'metric'?" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_version() -> None:
    result = subprocess.run([sys.executable, "-m", "hookdet", "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("hookdet 0.")
