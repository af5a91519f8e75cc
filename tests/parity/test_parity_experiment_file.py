"""Determined parity for the experiment-file path: one file, trained by Determined's legacy
harness (``entrypoint: module:Trial``; see ``experiment_files.py``) and by ``hookdet run``.

Every field the harness maps is exercised: ``searcher.max_length`` in batches, records and
epochs, ``min_validation_period`` / ``min_checkpoint_period`` in each unit, ``scheduling_unit``,
``perform_initial_validation``, ``checkpoint_policy`` and ``optimizations``. The seed is the trial
seed the master derives from ``reproducibility.experiment_seed`` (hookdet's ``trial_seed``,
checked against Determined's generator in ``test_search_rules.py``).
"""
from __future__ import annotations

import pytest

from hookdet.config import parse_experiment_config
from tests.parity import harness
from tests.parity.checks import assert_same_records, events

pytestmark = pytest.mark.slow

EXPERIMENT_SEED = 7


def experiment(**fields):
    config = {
        "name": "parity",
        "hyperparameters": {"global_batch_size": 4},
        "searcher": {"name": "single", "metric": "val_loss", "smaller_is_better": True,
                     "max_length": {"batches": 10}},
        "reproducibility": {"experiment_seed": EXPERIMENT_SEED},
        "checkpoint_policy": "all",
    }
    config.update(fields)
    return config


def compare_file(tmp_path, case, config, trial="Basic"):
    seed = parse_experiment_config(dict(config, entrypoint="x:Y")).trial_seed()
    results = harness.run_case(tmp_path, trial, {}, experiment_file=config, seed=seed,
                               hparams=config["hyperparameters"])
    determined, hookdet = results["determined"][0][0], results["hookdet"][0][0]
    for record in (determined, hookdet):
        record["events"] = [e for e in record["events"] if e["event"] != "init_local_only"]
        for event in record["events"]:  # Determined's side has TensorBoard off (module docstring)
            event.get("getters", {}).get("items", {}).pop("enable_tensorboard_logging", None)
    assert_same_records(case, determined, hookdet)
    return determined, hookdet


def trained_batches(record):
    return [e["batch_idx"] for e in events(record, "train_batch")]


def validated_at(record):
    return [e["trained"] for e in events(record, "callback", method="on_validation_start")]


def test_batches_and_defaults(tmp_path):
    """Only ``max_length`` given: the master's defaults (``scheduling_unit`` 100, no periodic
    validation or checkpoint) and the end's validation and checkpoint."""
    determined, _ = compare_file(tmp_path, "file-defaults", experiment())
    assert trained_batches(determined) == list(range(10))
    assert validated_at(determined) == [10]


def test_every_period_field(tmp_path):
    config = experiment(
        min_validation_period={"batches": 3}, min_checkpoint_period={"records": 16},
        scheduling_unit=2, perform_initial_validation=True,
    )
    determined, _ = compare_file(tmp_path, "file-periods", config)
    assert validated_at(determined) == [0, 3, 6, 9, 10]
    # checkpoint_policy "all": after every validation too
    assert [e["trained"] for e in events(determined, "callback", method="on_checkpoint_save_start")] == [3, 4, 6, 8, 9, 10]


def test_lengths_in_records_and_epochs(tmp_path):
    config = experiment(searcher={"name": "single", "metric": "val_loss", "max_length": {"records": 26}},
                        min_validation_period={"epochs": 1})
    determined, _ = compare_file(tmp_path, "file-records-epochs", config)
    assert trained_batches(determined) == list(range(6))  # 26 records // 4


def test_epochs_with_records_per_epoch(tmp_path):
    """``records_per_epoch`` is not read by Determined 0.38's PyTorch harness: an epoch is a pass
    over the training loader (16 records here, not 8)."""
    config = experiment(searcher={"name": "single", "metric": "val_loss", "max_length": {"epochs": 2}},
                        records_per_epoch=8, min_checkpoint_period={"epochs": 1})
    determined, _ = compare_file(tmp_path, "file-records-per-epoch", config)
    assert trained_batches(determined) == list(range(8))


def test_optimizations(tmp_path):
    config = experiment(optimizations={"aggregation_frequency": 2, "average_aggregated_gradients": False})
    compare_file(tmp_path, "file-optimizations", config, trial="Aggregated")
