"""Determined parity for a trial's data: every batch structure, ``get_batch_length`` and the
``DataLoader`` arguments (``data_trials.py``), each run under Determined 0.38.1 and hookdet.

Three expected differences live here (``expected_differences.py``): ``namedtuple-batch``,
``data-length-nested`` and ``batch-length-in-training``; each test asserts both sides of its
difference and then compares everything else exactly.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.parity import harness
from tests.parity.checks import PERIODS, assert_local_only_getters, assert_same_records, events
from tests.parity.expected_differences import EXPECTED_DIFFERENCES

pytestmark = pytest.mark.slow

PLAIN_STRUCTURES = ["tensor", "list", "dict", "numpy"]


def run(tmp_path, case, trial, hparams, max_batches, **options):
    results = harness.run_case(
        tmp_path, "data_trials." + trial, dict(PERIODS, max_length={"Batch": max_batches}),
        hparams=dict(hparams, global_batch_size=4), **options,
    )
    determined, hookdet = results["determined"][0][0], results["hookdet"][0][0]
    assert_local_only_getters(case, determined, hookdet)
    return determined, hookdet


def batches_seen(record):
    return events(record, "train_batch_data") + events(record, "evaluate_batch_data")


@pytest.mark.parametrize("structure", PLAIN_STRUCTURES)
def test_batch_structures(tmp_path, structure):
    """Tensors, lists, dicts and numpy arrays (made tensors by ``to_device``) arrive alike."""
    determined, hookdet = run(tmp_path, "batch-" + structure, "BatchStructures", {"structure": structure}, 6)
    assert_same_records("batch-" + structure, determined, hookdet)
    first = batches_seen(hookdet)[0]
    assert first["data_length"] == first["batch_length"] == 4
    if structure == "numpy":
        assert [item["tensor"] for item in first["batch"]["tuple"]] == ["torch.float32"] * 2 + ["torch.int64"]


def test_namedtuple_batches_stay_namedtuples(tmp_path):
    """``namedtuple-batch``: Determined's ``to_device`` rebuilds the collated ``Example`` as a
    plain tuple; hookdet keeps it, with the same items."""
    assert "namedtuple-batch" in EXPECTED_DIFFERENCES
    determined, hookdet = run(tmp_path, "batch-namedtuple", "BatchStructures", {"structure": "namedtuple"}, 6)
    for det_event, hd_event in zip(batches_seen(determined), batches_seen(hookdet)):
        assert list(det_event["batch"]) == ["tuple"] and list(hd_event["batch"]) == ["Example"]
        hd_event["batch"] = {"tuple": hd_event["batch"]["Example"]}
    assert_same_records("batch-namedtuple", determined, hookdet)


def test_nested_batch_length(tmp_path):
    """``data-length-nested``: for ``{"inputs": {"x", "y"}, "meta": [...]}`` Determined's
    ``data_length`` counts the inner dict's keys (2); hookdet finds the first tensor (4 records)."""
    assert "data-length-nested" in EXPECTED_DIFFERENCES
    determined, hookdet = run(tmp_path, "batch-nested", "BatchStructures", {"structure": "nested"}, 6)
    seen = batches_seen(determined)
    assert seen and all(e["data_length"] == e["batch_length"] == 2 for e in seen)
    assert all(e["data_length"] == e["batch_length"] == 4 for e in batches_seen(hookdet))
    for record in (determined, hookdet):
        for event in batches_seen(record):
            event["data_length"] = event["batch_length"] = "compared above"
    assert_same_records("batch-nested", determined, hookdet)


def test_custom_batch_type_and_get_batch_length(tmp_path):
    """A batch class of the trial's own moves itself with ``.to`` and is measured by the trial's
    ``get_batch_length``, called before every ``evaluate_batch`` by both; Determined also calls it
    after every training batch (``batch-length-in-training``), hookdet does not."""
    assert "batch-length-in-training" in EXPECTED_DIFFERENCES
    determined, hookdet = run(tmp_path, "batch-custom", "BatchStructures", {"structure": "custom"}, 6)
    after_training = [
        index for index, event in enumerate(determined["events"])
        if event["event"] == "get_batch_length" and determined["events"][index - 1]["event"] == "train_batch"
    ]
    assert len(after_training) == len(events(determined, "train_batch")) == 6
    determined["events"] = [e for i, e in enumerate(determined["events"]) if i not in after_training]
    assert_same_records("batch-custom", determined, hookdet)
    # The trial's own observation calls it once per batch; hookdet once more per validation batch.
    calls = len(events(hookdet, "get_batch_length"))
    assert calls == len(events(hookdet, "train_batch_data")) + 2 * len(events(hookdet, "evaluate_batch_data"))
    assert batches_seen(hookdet)[0]["batch"]["items"]["Graphs"]["items"]["num_graphs"] == 4


@pytest.mark.parametrize("loader", ["drop_last", "sampler", "batch_sampler", "workers"])
def test_data_loader_arguments(tmp_path, loader):
    """``drop_last``, a user ``sampler``, a ``batch_sampler``, worker processes with their
    arguments, and a plain torch ``DataLoader``: the same records in the same batches and epochs."""
    determined, hookdet = run(tmp_path, "loader-" + loader, "LoaderArguments", {"loader": loader}, 11)
    assert_same_records("loader-" + loader, determined, hookdet)
    epochs = {e["epoch_idx"] for e in events(hookdet, "train_batch")}
    assert len(epochs) >= 2, "the case must cross an epoch boundary"


def test_plain_torch_loader_needs_the_checks_disabled(tmp_path):
    """A ``torch.utils.data.DataLoader`` without ``disable_dataset_reproducibility_checks()``
    is refused by both, naming the method that built it."""
    determined, hookdet = run(tmp_path, "plain-torch-loader", "PlainTorchLoader", {}, 4)
    assert_same_records("plain-torch-loader", determined, hookdet, culprit="build_training_data_loader", weights=False)


def test_plain_torch_loader_in_its_first_epoch(tmp_path):
    """A plain ``torch.utils.data.DataLoader`` after ``disable_dataset_reproducibility_checks()``,
    within its first epoch (where Determined works): the same batches, metrics and weights."""
    determined, hookdet = run(tmp_path, "loader-torch", "LoaderArguments", {"loader": "torch"}, 4)
    assert_same_records("loader-torch", determined, hookdet)


#: How long a run that trained its 4th batch must then train nothing more to count as stuck (the
#: 2 batches left take milliseconds).
STUCK_S = 6


def kill_when_stuck(progress, batches, seconds):
    """SIGKILL the process that wrote ``progress`` ("<batches> <pid>") once it has said
    ``batches`` for ``seconds`` without a change (or give up after 3 minutes)."""
    deadline, since = time.monotonic() + 180, None
    while time.monotonic() < deadline:
        text = progress.read_text() if progress.exists() else ""
        if text.split()[:1] == [batches]:
            since = since or time.monotonic()
            if time.monotonic() - since >= seconds:
                os.kill(int(text.split()[1]), signal.SIGKILL)
                return
        else:
            since = None
        time.sleep(0.2)


def test_plain_torch_loader_past_its_first_epoch(tmp_path):
    """``plain-loader-one-epoch``: Determined iterates a plain loader once and then spins
    without end (its training enumerator is exhausted; no error, no batch); hookdet starts the
    loader's next epoch, as it does for its own ``DataLoader``."""
    assert "plain-loader-one-epoch" in EXPECTED_DIFFERENCES
    hparams = {"loader": "torch", "global_batch_size": 4}
    fit = dict(PERIODS, max_length={"Batch": 6})
    progress = tmp_path / "determined" / "cwd" / "trained.txt"
    watchdog = threading.Thread(target=kill_when_stuck, args=(progress, "4", STUCK_S), daemon=True)
    watchdog.start()
    with pytest.raises(AssertionError, match=r"rc -9"):
        harness.run_case(tmp_path, "data_trials.LoaderArguments", fit, hparams=hparams,
                         frameworks=("determined",), timeout_s=180)
    watchdog.join()
    assert progress.read_text().split()[0] == "4", "not stuck after one epoch"
    results = harness.run_case(tmp_path, "data_trials.LoaderArguments", dict(fit, max_length={"Batch": 11}),
                               hparams=hparams, frameworks=("hookdet",))
    trained = events(results["hookdet"][0][0], "train_batch")
    assert [(e["epoch_idx"], e["batch_idx"]) for e in trained] == [(i // 4, i) for i in range(11)]
    assert [e["records"]["values"] for e in trained[4:8]] == [e["records"]["values"] for e in trained[:4]]
