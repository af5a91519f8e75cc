"""The experiment file: Determined's YAML loaded, defaulted and checked, with file:line errors."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from hookdet.checkpoints.local import LocalStorage
from hookdet.checkpoints.registry import storage_class
from hookdet.checkpoints.s3 import S3Storage
from hookdet.config import (
    CLUSTER_ONLY_FIELDS,
    ConfigError,
    DirectoryStorageConfig,
    ExperimentConfig,
    Length,
    S3StorageConfig,
    SharedFSStorageConfig,
    length_in_batches,
    load_experiment_config,
    names_trial_class,
    parse_experiment_config,
)

# Modeled on Determined's examples/tutorials/mnist_pytorch/const.yaml, plus the blocks a team's
# cluster file usually carries. Line numbers matter to the tests below.
MNIST_CONST_YAML = """\
name: mnist_pytorch_const
description: mnist_pytorch_const
data:
  url: https://s3-us-west-2.amazonaws.com/determined-ai-test-data/pytorch_mnist.tar.gz
hyperparameters:
  learning_rate: 1.0
  global_batch_size: 64
  n_filters1: 32
  n_filters2: 64
  dropout1: 0.25
  dropout2: 0.5
searcher:
  name: single
  metric: validation_loss
  max_length:
      batches: 937 #60,000 training images with batch size 64
  smaller_is_better: true
min_validation_period:
  batches: 100
min_checkpoint_period:
  epochs: 1
records_per_epoch: 60000
checkpoint_storage:
  type: shared_fs
  host_path: /mnt/checkpoints
  storage_path: mnist
  save_trial_best: 2
resources:
  slots_per_trial: 1
  resource_pool: gpu-pool
  max_slots: 8
environment:
  image: determinedai/pytorch-ngc:0.38.1
max_restarts: 0
profiling:
  enabled: true
entrypoint: model_def:MNistTrial
"""


def write(tmp_path: Path, text: str, name: str = "const.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_experiment_config(path)
    return caught.value


def dict_error(data: dict) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_experiment_config(data)
    return caught.value


# ------------------------------------------------------------------------------ a real file


def test_determined_mnist_const_yaml_loads_with_its_values(tmp_path: Path) -> None:
    config = load_experiment_config(write(tmp_path, MNIST_CONST_YAML))

    assert config.name == "mnist_pytorch_const"
    assert config.entrypoint == "model_def:MNistTrial"
    assert config.hyperparameters == {
        "learning_rate": 1.0,
        "global_batch_size": 64,
        "n_filters1": 32,
        "n_filters2": 64,
        "dropout1": 0.25,
        "dropout2": 0.5,
    }
    assert config.global_batch_size == 64
    assert config.searcher.metric == "validation_loss"
    assert config.searcher.smaller_is_better is True
    assert config.searcher.max_length == Length(unit="batches", value=937)
    assert config.min_validation_period == Length(unit="batches", value=100)
    assert config.min_checkpoint_period == Length(unit="epochs", value=1)
    assert config.records_per_epoch == 60000
    assert config.data == {
        "url": "https://s3-us-west-2.amazonaws.com/determined-ai-test-data/pytorch_mnist.tar.gz"
    }
    storage = config.checkpoint_storage
    assert isinstance(storage, SharedFSStorageConfig)
    assert (storage.host_path, storage.storage_path, storage.save_trial_best) == (
        "/mnt/checkpoints",
        "mnist",
        2,
    )
    assert storage_class(storage.type) is LocalStorage
    assert config.resources.slots_per_trial == 1
    assert config.source == str(tmp_path / "const.yaml")


def test_cluster_only_fields_are_listed_in_file_order_and_left_out(tmp_path: Path) -> None:
    config = load_experiment_config(write(tmp_path, MNIST_CONST_YAML))

    assert config.ignored_fields == [
        "resources.resource_pool",
        "resources.max_slots",
        "environment",
        "max_restarts",
        "profiling",
    ]
    snapshot = config.to_dict()
    assert "environment" not in snapshot and "profiling" not in snapshot
    assert snapshot["resources"] == {"slots_per_trial": 1}


def test_every_cluster_only_field_is_accepted_and_recorded() -> None:
    data: dict = {}
    for dotted in CLUSTER_ONLY_FIELDS:
        *parents, leaf = dotted.split(".")
        target = data
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = "anything"
    data["checkpoint_storage"].update(type="directory", container_path="/ckpt")

    config = parse_experiment_config(data)

    assert sorted(config.ignored_fields) == sorted(CLUSTER_ONLY_FIELDS)


def test_a_searcher_other_than_single_is_noted_as_ignored() -> None:
    config = parse_experiment_config(
        {"searcher": {"name": "random", "max_trials": 5, "max_length": {"batches": 100}}}
    )

    assert config.searcher.name == "random"
    assert config.ignored_fields == ["searcher.max_trials", "searcher.name"]


# ------------------------------------------------------------------------------ defaults


def test_an_empty_config_has_every_determined_default() -> None:
    config = parse_experiment_config({})

    assert config.name is None and config.description is None and config.entrypoint is None
    assert config.hyperparameters == {} and config.data == {}
    assert config.searcher.name == "single"
    assert config.searcher.metric == "validation_loss"
    assert config.searcher.smaller_is_better is True
    assert config.searcher.max_length is None
    assert config.records_per_epoch is None
    assert config.min_validation_period is None
    assert config.min_checkpoint_period is None
    assert config.scheduling_unit == 100
    assert config.perform_initial_validation is False
    optimizations = config.optimizations
    assert optimizations.aggregation_frequency == 1
    assert optimizations.average_aggregated_gradients is True
    assert optimizations.average_training_metrics is True
    assert optimizations.gradient_compression is False
    assert optimizations.mixed_precision == "O0"
    assert optimizations.auto_tune_tensor_fusion is False
    assert optimizations.tensor_fusion_threshold == 64
    assert optimizations.tensor_fusion_cycle_time == 5
    assert config.checkpoint_storage is None
    assert config.checkpoint_policy == "best"
    assert config.resources.slots_per_trial == 1
    assert config.reproducibility.experiment_seed == 0
    assert config.plugins is None
    assert config.plugin_config == {}
    assert config.ignored_fields == []
    assert config.global_batch_size is None


def test_storage_retention_defaults_follow_determined() -> None:
    config = parse_experiment_config(
        {"checkpoint_storage": {"type": "directory", "container_path": "/c"}}
    )

    storage = config.checkpoint_storage
    assert isinstance(storage, DirectoryStorageConfig)
    assert storage.save_experiment_best == 0
    assert storage.save_trial_best == 1
    assert storage.save_trial_latest == 1


def test_null_means_the_default_as_in_determined(tmp_path: Path) -> None:
    config = load_experiment_config(
        write(
            tmp_path,
            """\
            searcher:
              name: single
              smaller_is_better: null
              metric:
            optimizations:
            checkpoint_policy: null
            """,
        )
    )

    assert config.searcher.smaller_is_better is True
    assert config.searcher.metric == "validation_loss"
    assert config.optimizations.aggregation_frequency == 1
    assert config.checkpoint_policy == "best"


def test_a_searcher_block_without_a_name_is_refused_in_a_file_as_determined_refuses_it(tmp_path: Path) -> None:
    """Determined's master refuses an experiment whose searcher names no searcher (or names
    ``null``); hookdet trained it as ``single``. The Python API's ``exp_conf`` is not held to it,
    as Determined's local ``pytorch.init`` does not check its ``exp_conf``."""
    for block in ("searcher:\n  metric: loss\n", "searcher:\n  name: null\n  metric: loss\n"):
        error = load_error(tmp_path, block)
        assert error.line == 1
        assert error.message == ("searcher.name is required (as Determined requires it): single, "
                                 "random, grid, adaptive_asha, async_halving or optuna")
    assert parse_experiment_config({"searcher": {"metric": "loss"}}).searcher.name == "single"


def test_a_zero_period_means_no_period() -> None:
    config = parse_experiment_config({"min_validation_period": {"batches": 0}})

    assert config.min_validation_period is None


# ------------------------------------------------------------------------------ file errors


def test_malformed_yaml_names_file_line_and_column(tmp_path: Path) -> None:
    error = load_error(
        tmp_path,
        """\
        name: broken
        hyperparameters:
          sizes: [1, 2
        searcher:
          metric: loss
        """,
    )

    assert str(error) == (
        f"{tmp_path / 'const.yaml'}:4:9: malformed YAML: expected ',' or ']', but got ':' "
        "(while parsing a flow sequence started on line 3)"
    )
    assert (error.line, error.column) == (4, 9)


def test_a_list_at_the_top_level_is_refused(tmp_path: Path) -> None:
    error = load_error(tmp_path, "- name: a\n- name: b\n")

    assert "the top level must be a mapping of fields" in str(error)
    assert "got a list" in str(error)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    error = load_error(tmp_path, "# nothing but a comment\n")

    assert "the experiment file is empty" in str(error)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such experiment file"):
        load_experiment_config(tmp_path / "nope.yaml")


def test_a_duplicated_key_names_both_lines(tmp_path: Path) -> None:
    error = load_error(
        tmp_path,
        """\
        searcher:
          metric: loss
          metric: accuracy
        """,
    )

    assert error.line == 3
    assert "duplicate key 'searcher.metric' (first given on line 2)" in str(error)


def test_parse_of_a_non_mapping_is_refused() -> None:
    expected = r"<dict>: expected a mapping of experiment fields; got a list"
    with pytest.raises(ConfigError, match=expected):
        parse_experiment_config([1, 2])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ unknown fields


def test_a_misspelt_nested_field_suggests_the_right_name_with_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: mnist
        hyperparameters:
          global_batch_size: 64
        searcher:
          name: single
          metric: validation_loss
          max_lenght:
            batches: 937
        """,
    )

    with pytest.raises(ConfigError) as caught:
        load_experiment_config(path)

    assert str(caught.value) == (
        f"{path}:7: unknown field 'searcher.max_lenght'; did you mean 'max_length'?"
    )
    assert caught.value.field == "searcher.max_lenght"


def test_a_misspelt_top_level_field_suggests_the_right_name(tmp_path: Path) -> None:
    error = load_error(tmp_path, "entrypoint: m:T\nhyperparameter:\n  lr: 0.1\n")

    assert error.line == 2
    assert "unknown field 'hyperparameter'; did you mean 'hyperparameters'?" in str(error)


def test_a_misspelt_cluster_only_field_suggests_it_too(tmp_path: Path) -> None:
    error = load_error(tmp_path, "enviroment:\n  image: x\n")

    assert "did you mean 'environment'?" in str(error)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"resources": {"slots_per_trail": 2}},
            "unknown field 'resources.slots_per_trail'; did you mean 'slots_per_trial'?",
        ),
        (
            {"optimizations": {"aggregation_frequncy": 2}},
            "unknown field 'optimizations.aggregation_frequncy'; "
            "did you mean 'aggregation_frequency'?",
        ),
        (
            {"checkpoint_storage": {"type": "s3", "bucke": "b"}},
            "unknown field 'checkpoint_storage.bucke'; did you mean 'bucket'?",
        ),
        (
            {"reproducibility": {"experiment_sed": 3}},
            "unknown field 'reproducibility.experiment_sed'; did you mean 'experiment_seed'?",
        ),
    ],
)
def test_unknown_nested_fields_suggest_their_neighbour(data: dict, expected: str) -> None:
    # The first problem; a misspelt required key also leaves that key missing, said below it.
    assert str(dict_error(data)).splitlines()[0] == f"<dict>: {expected}"


def test_an_unknown_field_with_no_neighbour_lists_the_known_ones() -> None:
    error = dict_error({"resources": {"gpus": 2}})

    assert str(error) == (
        "<dict>: unknown field 'resources.gpus'; known fields here: slots_per_trial"
    )


# ------------------------------------------------------------------------------ wrong values


def test_a_wrong_type_names_the_field_and_its_line(tmp_path: Path) -> None:
    error = load_error(
        tmp_path,
        """\
        searcher:
          name: single
          metric: validation_loss
          smaller_is_better: maybe
        """,
    )

    assert error.line == 4
    assert error.message == "searcher.smaller_is_better: expected true or false; got 'maybe'"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"scheduling_unit": "ten"}, "scheduling_unit: expected a whole number; got 'ten'"),
        ({"scheduling_unit": 0}, "scheduling_unit: must be at least 1; got 0"),
        (
            {"checkpoint_policy": "sometimes"},
            "checkpoint_policy: expected one of 'best', 'all' or 'none'; got 'sometimes'",
        ),
        (
            {"optimizations": {"mixed_precision": "O4"}},
            "optimizations.mixed_precision: expected one of",
        ),
        (
            {"resources": {"slots_per_trial": -1}},
            "resources.slots_per_trial: must be at least 0; got -1",
        ),
        (
            {"reproducibility": {"experiment_seed": 2**31}},
            "reproducibility.experiment_seed: must be at most 2147483647",
        ),
        (
            {"perform_initial_validation": 1},
            "perform_initial_validation: expected true or false; got 1",
        ),
        ({"searcher": "single"}, "searcher: expected a mapping; got 'single'"),
        ({"searcher": {"name": "singel"}}, "searcher.name: expected one of single, random, grid, "
         "adaptive_asha, async_halving, optuna; got 'singel'; did you mean 'single'?"),
        ({"searcher": {"name": "pbt"}}, "searcher.name: 'pbt' (population-based training) is a searcher "
         "of Determined's cluster that hookdet does not run"),
        ({"name": 3}, "name: expected a string; got 3"),
        (
            {"hyperparameters": {"global_batch_size": 0}},
            "hyperparameters.global_batch_size: must be a whole number of at least 1; got 0",
        ),
        (
            {"hyperparameters": {"global_batch_size": "64"}},
            "hyperparameters.global_batch_size: must be a whole number of at least 1; got '64'",
        ),
        ({"data": {"when": {1: "x"}}}, "data.when: keys must be strings; quote the key 1"),
    ],
)
def test_wrong_values_name_the_field(data: dict, expected: str) -> None:
    assert dict_error(data).message.startswith(expected)


def test_several_problems_are_all_reported_at_once() -> None:
    error = dict_error({"scheduling_unit": "x", "checkpoint_policy": "y"})

    assert error.message == "scheduling_unit: expected a whole number; got 'x'"
    assert str(error).splitlines() == [
        "<dict>: scheduling_unit: expected a whole number; got 'x'",
        "  <dict>: checkpoint_policy: expected one of 'best', 'all' or 'none'; got 'y'",
    ]


def test_every_problem_of_a_file_is_reported_in_one_message_in_file_order(tmp_path: Path) -> None:
    """Issue 19 item 4: an unknown field, a wrong type and a bad storage block, all in one
    message, each with its line and field."""
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent("""\
        entrypoint: model_def:Trial
        hyperparameters:
          global_batch_size: 0
        searcher:
          name: single
          metric: validation_loss
          max_lenght: {batches: 5}
        scheduling_unit: many
        checkpoint_storage:
          type: ftp
        """))
    with pytest.raises(ConfigError) as caught:
        load_experiment_config(path)
    lines = str(caught.value).splitlines()
    assert [line.split(": ", 1)[0].strip() for line in lines] == [f"{path}:{n}" for n in (3, 7, 8, 10)]
    assert "global_batch_size" in lines[0] and "did you mean 'max_length'" in lines[1]
    assert "scheduling_unit" in lines[2] and "'ftp' is not a storage hookdet has" in lines[3]


# ------------------------------------------------------------------------------ hyperparameters


def test_const_hyperparameters_reduce_to_their_value_at_any_depth() -> None:
    config = parse_experiment_config(
        {
            "hyperparameters": {
                "global_batch_size": {"type": "const", "val": 32},
                "optimizer": {"name": "adam", "lr": {"type": "const", "val": 0.001}},
                "schedule": {"type": "const", "val": {"type": "cosine", "warmup": 10}},
                "layers": [64, 32],
            }
        }
    )

    assert config.hyperparameters == {
        "global_batch_size": 32,
        "optimizer": {"name": "adam", "lr": 0.001},
        "schedule": {"type": "cosine", "warmup": 10},
        "layers": [64, 32],
    }


def test_a_search_space_hyperparameter_trains_trial_one_of_its_search(tmp_path: Path) -> None:
    """A typed hyperparameter is a search space (issue 16): one ``hookdet run`` trains trial 1,
    the values Determined's master draws first (its ``single`` searcher samples one)."""
    path = write(
        tmp_path,
        """\
        hyperparameters:
          global_batch_size: 64
          optimizer:
            lr:
              type: log
              minval: -4
              maxval: -1
              base: 10
        reproducibility:
          experiment_seed: 7
        """,
    )
    config = load_experiment_config(path)

    lr = config.hyperparameters["optimizer"]["lr"]
    assert 1e-4 <= lr < 1e-1
    assert config.hyperparameter_space["optimizer"]["lr"]["type"] == "log"
    assert config.trial_seed() != config.trial_seed(2)


def test_a_malformed_search_space_is_refused_at_its_line(tmp_path: Path) -> None:
    error = load_error(
        tmp_path,
        """\
        hyperparameters:
          optimizer:
            lr:
              type: log
              minval: -1
              maxval: -4
              base: 10
        """,
    )

    assert error.line == 3
    assert error.field == "hyperparameters.optimizer.lr"
    assert "minval must be less than maxval" in error.message


@pytest.mark.parametrize("kind", ["int", "double"])
def test_a_search_type_with_a_wrong_field_names_it(kind: str) -> None:
    error = dict_error({"hyperparameters": {"x": {"type": kind, "vals": [1, 2]}}})

    assert error.field == "hyperparameters.x.vals"
    assert f"a '{kind}' hyperparameter has no field 'vals'" in error.message


def test_an_unknown_hyperparameter_type_explains_how_to_pass_a_mapping() -> None:
    error = dict_error({"hyperparameters": {"optimizer": {"type": "adam", "lr": 0.1}}})

    assert error.field == "hyperparameters.optimizer.type"
    assert "unknown hyperparameter type 'adam'" in error.message
    assert "{type: const, val: {...}}" in error.message


def test_a_const_hyperparameter_needs_val() -> None:
    error = dict_error({"hyperparameters": {"lr": {"type": "const", "value": 0.1}}})

    assert error.field == "hyperparameters.lr.value"
    assert "only 'type' and 'val'" in error.message


# ------------------------------------------------------------------------------ YAML 1.2 scalars


def test_scalars_are_read_as_yaml_1_2_like_determined(tmp_path: Path) -> None:
    config = load_experiment_config(
        write(
            tmp_path,
            """\
            hyperparameters:
              learning_rate: 1e-3
              flag: yes
              clock: 1:30
              padded: 010
              octal: 0o17
              day: 2024-01-01
              on_off: on
              negative: -2.5E+2
            """,
        )
    )

    assert config.hyperparameters == {
        "learning_rate": 0.001,
        "flag": "yes",
        "clock": "1:30",
        "padded": 10,
        "octal": 15,
        "day": "2024-01-01",
        "on_off": "on",
        "negative": -250.0,
    }


# ------------------------------------------------------------------------------ lengths


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"batches": 5}, Length(unit="batches", value=5)),
        ({"epochs": 3}, Length(unit="epochs", value=3)),
        ({"records": 6400}, Length(unit="records", value=6400)),
    ],
)
def test_max_length_takes_every_determined_form(raw: object, expected: Length) -> None:
    config = parse_experiment_config({"searcher": {"max_length": raw}})

    assert config.searcher.max_length == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"batch": 5}, "unknown length unit 'batch'; did you mean 'batches'?"),
        ({"batches": 5, "epochs": 1}, "a length has exactly one of batches, epochs or records"),
        ({}, "a length has exactly one of batches, epochs or records"),
        ({"batches": -1}, "the number of batches must be at least 1; got -1"),
        ({"batches": 0}, "the number of batches must be at least 1; got 0"),
        ({"epochs": 1.5}, "the number of epochs must be a whole number; got 1.5"),
        ({"records": True}, "the number of records must be a whole number; got true"),
        ("937", "expected a length like {batches: 100}, {epochs: 2} or {records: 6400}; got '937'"),
        (
            937,
            "a bare number has no unit: write {batches: 937}, {epochs: 937} or {records: 937} "
            "(Determined reads a plain 937 as a length without a unit, and its harness stops "
            "with 'unrecognized searcher unit None')",
        ),
    ],
)
def test_bad_max_lengths_say_what_is_wrong(raw: object, expected: str) -> None:
    error = dict_error({"searcher": {"max_length": raw}})

    assert error.field == "searcher.max_length"
    assert error.message.startswith(f"searcher.max_length: {expected}")


def test_periods_take_units_but_not_a_bare_number() -> None:
    config = parse_experiment_config(
        {"min_validation_period": {"records": 640}, "min_checkpoint_period": {"epochs": 2}}
    )
    assert config.min_validation_period == Length(unit="records", value=640)
    assert config.min_checkpoint_period == Length(unit="epochs", value=2)

    error = dict_error({"min_checkpoint_period": 100})
    assert error.message == (
        "min_checkpoint_period: expected a length like {batches: 100}, {epochs: 2} or "
        "{records: 6400}; got 100"
    )


def test_length_in_batches_converts_like_determined() -> None:
    assert length_in_batches(Length(unit="batches", value=7)) == 7
    assert length_in_batches(Length(unit="epochs", value=3), epoch_length_batches=469) == 1407
    assert length_in_batches(Length(unit="records", value=6400), global_batch_size=64) == 100
    # a partial batch is dropped, but a nonzero length trains at least one batch
    assert length_in_batches(Length(unit="records", value=10), global_batch_size=3) == 3
    assert length_in_batches(Length(unit="records", value=5), global_batch_size=64) == 1
    assert length_in_batches(Length(unit="records", value=0), global_batch_size=64) == 0


def test_length_in_batches_names_the_missing_argument() -> None:
    with pytest.raises(ValueError, match="needs a global_batch_size"):
        length_in_batches(Length(unit="records", value=64))
    with pytest.raises(ValueError, match="needs epoch_length_batches"):
        length_in_batches(Length(unit="epochs", value=1), epoch_length_batches=0)


def test_a_length_prints_readably() -> None:
    assert str(Length(unit="epochs", value=2)) == "2 epochs"


# ------------------------------------------------------------------------------ entrypoint


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("model_def:MNistTrial", "model_def:MNistTrial"),
        (
            "determined_lib.trial:trial_classes.NestedTrial",
            "determined_lib.trial:trial_classes.NestedTrial",
        ),
        (
            "python3 -m determined.launch.torch_distributed --trial model_def:MNistTrial",
            "model_def:MNistTrial",
        ),
        (
            ["python3", "-m", "determined.launch.horovod", "--autohorovod"]
            + ["--trial", "model_def:T"],
            "model_def:T",
        ),
    ],
)
def test_entrypoints_naming_a_trial_class_are_accepted(raw: object, expected: str) -> None:
    assert parse_experiment_config({"entrypoint": raw}).entrypoint == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("python3 train.py --epochs 1", "python3 train.py --epochs 1"),
        ("./hello.sh", "./hello.sh"),
        (
            "python3 -m determined.launch.torch_distributed python3 train.py",
            "python3 -m determined.launch.torch_distributed python3 train.py",
        ),
        (["python3", "train.py", "--name", "two words"], "python3 train.py --name 'two words'"),
    ],
)
def test_script_and_launch_command_entrypoints_are_kept_as_commands(raw: object, expected: str) -> None:
    config = parse_experiment_config({"entrypoint": raw})

    assert config.entrypoint == expected
    assert not names_trial_class(config.entrypoint)


@pytest.mark.parametrize(
    ("raw", "hint"),
    [
        ("MNistTrial", "name its module too, e.g. 'model_def:MNistTrial'"),
        ("", "expected 'module:Class' or a command"),
        ("python3 'unclosed", "cannot split the command"),
    ],
)
def test_entrypoints_that_are_neither_a_trial_class_nor_a_command_are_refused(
    raw: str, hint: str
) -> None:
    error = dict_error({"entrypoint": raw})

    assert error.field == "entrypoint"
    assert hint in error.message


# ------------------------------------------------------------------------------ storage


def test_each_storage_type_maps_to_its_plugin() -> None:
    shared = parse_experiment_config(
        {"checkpoint_storage": {"type": "shared_fs", "host_path": "/h"}}
    )
    s3 = parse_experiment_config(
        {
            "checkpoint_storage": {
                "type": "s3",
                "bucket": "ckpts",
                "prefix": "exp/1",
                "endpoint_url": "http://127.0.0.1:9000",
                "access_key": "a",
                "secret_key": "s",
                "save_experiment_best": 3,
            }
        }
    )

    assert storage_class(shared.checkpoint_storage.type) is LocalStorage
    assert shared.checkpoint_storage.propagation == "rprivate"
    assert isinstance(s3.checkpoint_storage, S3StorageConfig)
    assert storage_class(s3.checkpoint_storage.type) is S3Storage
    assert (s3.checkpoint_storage.endpoint_url, s3.checkpoint_storage.save_experiment_best) == (
        "http://127.0.0.1:9000",
        3,
    )
    assert {name: storage_class(name) for name in ("shared_fs", "directory", "s3", "default")} == {
        "shared_fs": LocalStorage,
        "directory": LocalStorage,
        "s3": S3Storage,
        "default": LocalStorage,
    }


@pytest.mark.parametrize(
    ("storage", "field", "expected"),
    [
        (
            {"host_path": "/h"},
            "checkpoint_storage",
            "checkpoint_storage.type is required: one of shared_fs, directory, s3",
        ),
        (
            {"type": "ftp", "bucket": "b"},
            "checkpoint_storage.type",
            "checkpoint_storage.type 'ftp' is not a storage hookdet has",
        ),
        (
            {"type": "shared-fs", "host_path": "/h"},
            "checkpoint_storage.type",
            "did you mean 'shared_fs'?",
        ),
        ({"type": "s3"}, "checkpoint_storage.bucket", "checkpoint_storage.bucket is required"),
        (
            {"type": "directory"},
            "checkpoint_storage.container_path",
            "checkpoint_storage.container_path is required",
        ),
        (
            {"type": "s3", "bucket": "b", "access_key": "a"},
            "checkpoint_storage.secret_key",
            "access_key is set but secret_key is not",
        ),
        (
            {"type": "s3", "bucket": "b", "prefix": "a/../b"},
            "checkpoint_storage.prefix",
            "prefix must not contain '..'",
        ),
        (
            {"type": "shared_fs", "host_path": "/h", "save_trial_latest": -1},
            "checkpoint_storage.save_trial_latest",
            "must be at least 0",
        ),
    ],
)
def test_bad_storage_blocks_name_the_field(storage: dict, field: str, expected: str) -> None:
    error = dict_error({"checkpoint_storage": storage})

    assert error.field == field
    assert expected in error.message


# ------------------------------------------------------------------------------ plugins


def test_plugins_and_their_options_are_kept() -> None:
    config = parse_experiment_config(
        {
            "plugins": ["checkpoint", "tensorboard", "no:progress", "my_pkg.plugin"],
            "plugin_config": {"my_pkg.plugin": {"flush_secs": 5, "tags": ["a"]}, "checkpoint": None},
        }
    )

    assert config.plugins == ["checkpoint", "tensorboard", "no:progress", "my_pkg.plugin"]
    assert config.plugin_config == {
        "my_pkg.plugin": {"flush_secs": 5, "tags": ["a"]},
        "checkpoint": {},
    }


@pytest.mark.parametrize(
    ("data", "field", "expected"),
    [
        (
            {"plugins": "amp"},
            "plugins",
            "expected a list of plugin names like [checkpoint, amp]; got 'amp'",
        ),
        ({"plugins": ["amp", "amp"]}, "plugins.1", "plugin 'amp' is listed twice"),
        ({"plugins": ["amp", "two words"]}, "plugins.1", "expected a plugin name"),
        (
            {"plugin_config": {"tensorboard": 5}},
            "plugin_config.tensorboard",
            "must be a mapping; got 5",
        ),
        ({"plugin_config": ["tensorboard"]}, "plugin_config", "expected a mapping"),
    ],
)
def test_bad_plugin_settings_name_the_field(data: dict, field: str, expected: str) -> None:
    error = dict_error(data)

    assert error.field == field
    assert expected in error.message


def test_plugin_problems_point_at_their_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, "plugins:\n  - checkpoint\n  - amp\n  - amp\n")

    assert (error.line, error.field) == (4, "plugins.2")


# ------------------------------------------------------------------------------ overrides


def test_overrides_deep_merge_over_the_file_and_dotted_keys_work(tmp_path: Path) -> None:
    config = load_experiment_config(
        write(tmp_path, MNIST_CONST_YAML),
        overrides={
            "searcher.max_length": {"epochs": 2},
            "hyperparameters": {"learning_rate": 0.5},
            "checkpoint_storage": {"type": "directory", "container_path": "/tmp/ckpt"},
        },
    )

    assert config.searcher.max_length == Length(unit="epochs", value=2)
    assert config.searcher.metric == "validation_loss"
    assert config.hyperparameters["learning_rate"] == 0.5
    assert config.hyperparameters["global_batch_size"] == 64
    assert isinstance(config.checkpoint_storage, DirectoryStorageConfig)


def test_a_bad_override_is_not_blamed_on_a_file_line(tmp_path: Path) -> None:
    path = write(tmp_path, MNIST_CONST_YAML)

    with pytest.raises(ConfigError) as caught:
        load_experiment_config(path, overrides={"scheduling_unit": "often"})

    assert caught.value.line is None
    assert str(caught.value) == (
        f"{path}: scheduling_unit: expected a whole number; got 'often' (set by overrides)"
    )


# ------------------------------------------------------------------------------ snapshot and seed


def test_to_dict_round_trips_through_json_and_back_into_a_config(tmp_path: Path) -> None:
    config = load_experiment_config(
        write(tmp_path, MNIST_CONST_YAML),
        overrides={"plugins": ["my_pkg.plugin"], "plugin_config": {"my_pkg.plugin": {"keep": 2}}},
    )

    snapshot = config.to_dict()
    restored = parse_experiment_config(json.loads(json.dumps(snapshot)))

    assert json.loads(json.dumps(snapshot)) == snapshot
    assert snapshot["searcher"]["max_length"] == {"batches": 937}
    assert snapshot["min_checkpoint_period"] == {"epochs": 1}
    assert restored.to_dict() == snapshot
    assert restored.checkpoint_storage == config.checkpoint_storage
    assert restored.ignored_fields == []


def test_trial_seed_is_the_seed_determined_gives_the_first_trial() -> None:
    # Determined's nprand tests pin numpy's RandomState(999).randint(0, 1 << 31) stream:
    # 1303213504, 648491356, 118207333, 2129740257, 511579848, ...; the first trial's seed is
    # the fifth draw (four words go to its request id first).
    config = parse_experiment_config({"reproducibility": {"experiment_seed": 999}})

    assert config.trial_seed() == 511579848


@pytest.mark.parametrize("experiment_seed", [0, 1, 42, 2**31 - 1])
def test_trial_seed_matches_numpys_stream(experiment_seed: int) -> None:
    config = parse_experiment_config({"reproducibility": {"experiment_seed": experiment_seed}})
    draws = np.random.RandomState(experiment_seed).randint(0, 2**31, size=10)

    assert config.trial_seed() == draws[4]
    assert config.trial_seed(trial_id=2) == draws[9]


def test_trial_seed_is_deterministic_and_depends_on_the_experiment_seed() -> None:
    first = parse_experiment_config({"reproducibility": {"experiment_seed": 7}})
    again = parse_experiment_config({"reproducibility": {"experiment_seed": 7}})
    other = parse_experiment_config({"reproducibility": {"experiment_seed": 8}})

    assert first.trial_seed() == again.trial_seed() == first.trial_seed()
    assert first.trial_seed() != other.trial_seed()
    assert 0 <= first.trial_seed() <= 2**31 - 1
    with pytest.raises(ValueError, match="trial_id counts from 1"):
        first.trial_seed(trial_id=0)


def test_constructing_the_model_directly_validates_too() -> None:
    config = ExperimentConfig(searcher={"max_length": {"epochs": 1}})

    assert config.searcher.max_length == Length(unit="epochs", value=1)


# ------------------------------------------------------------------------------ declared plugin options


def test_declared_plugin_options_are_checked_with_the_file_every_problem_with_its_line(tmp_path: Path) -> None:
    """Plugins that declare ``Options`` (progress, tensorboard, checkpoint, metrics_log) have
    their ``plugin_config`` blocks checked as the file is read: file, line, did-you-mean, all at
    once, with the file's other problems."""
    path = tmp_path / "exp.yaml"
    path.write_text(
        "searcher:\n"
        "  max_lenght: {batches: 4}\n"
        "  name: single\n"
        "plugin_config:\n"
        "  progress:\n"
        "    log_evry_s: 5\n"
        "  tensorboard:\n"
        "    write_every_s: -1\n"
        "  checkpoint:\n"
        "    async: 'no'\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_experiment_config(path)
    assert str(raised.value).splitlines() == [
        f"{path}:2: unknown field 'searcher.max_lenght'; did you mean 'max_length'?",
        f"  {path}:6: plugin_config.progress.log_evry_s: unknown option 'log_evry_s'; did you mean 'log_every_s'?",
        f"  {path}:8: plugin_config.tensorboard.write_every_s: must be at least 0.0; got -1",
        f"  {path}:10: plugin_config.checkpoint.async: expected true or false; got 'no'",
    ]


def test_declared_options_reach_the_plugin_with_defaults_filled(tmp_path: Path) -> None:
    from hookdet import pytorch
    from hookdet.plugin import run_of

    exp_conf = {"plugins": {"only": ["progress", "checkpoint"]}, "plugin_config": {"progress": {"log_every_s": 2}}}
    with pytorch.init(exp_conf=exp_conf, run_dir=tmp_path) as context:
        plugins = run_of(context).plugins
        assert plugins.get("progress").log_every_s == 2.0
        assert plugins.get("checkpoint").asynchronous is True
