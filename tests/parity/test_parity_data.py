"""Determined parity for a trial's data: every batch structure, ``get_batch_length`` and the
``DataLoader`` arguments (``data_trials.py``), each run under Determined 0.38.1 and hookdet.

Four expected differences live here (``expected_differences.py``): ``namedtuple-batch``,
``data-length-nested``, ``batch-length-in-training`` and ``plain-loader-one-epoch``; each test
asserts both sides of its difference and then compares everything else exactly.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.parity import harness
from tests.parity.checks import PERIODS, assert_local_only_getters, assert_same_records, events
from tests.parity.data_trials import STRUCTURES
from tests.parity.expected_differences import EXPECTED_DIFFERENCES

pytestmark = pytest.mark.slow


def run(tmp_path, case, trial, hparams, max_batches, **options):
    results = harness.run_case(
        tmp_path, "data_trials." + trial, dict(PERIODS, max_length={"Batch": max_batches}),
        hparams=dict(hparams, global_batch_size=4), **options,
    )
    determined, hookdet = results["determined"][0][0], results["hookdet"][0][0]
    assert_local_only_getters(case, determined, hookdet)
    return determined, hookdet


def batches_seen(record, structure):
    return [e for e in events(record, "train_batch_data") + events(record, "evaluate_batch_data")
            if e["structure"] == structure]


def test_batch_structures_and_get_batch_length(tmp_path):
    """One loader, each of its 7 batches in another structure (``data_trials.STRUCTURES``),
    trained and validated. A tensor, a list, a dict and numpy arrays (made tensors by
    ``to_device``) arrive alike; so does a batch class of the trial's own, moved by its ``.to``
    and measured by the trial's ``get_batch_length``. Three registered differences, each
    asserted on both sides before the rest is compared exactly:

    - ``namedtuple-batch``: Determined's ``to_device`` makes the collated ``Example`` a plain
      tuple; hookdet keeps it, with the same items.
    - ``data-length-nested``: for ``{"inputs": {"x", "y"}, "meta": [...]}`` Determined's
      ``data_length`` counts the inner dict's keys (2); hookdet the records (4).
    - ``batch-length-in-training``: both call ``get_batch_length`` before every validation
      batch; Determined also after every training batch, hookdet does not.
    """
    for name in ("namedtuple-batch", "data-length-nested", "batch-length-in-training"):
        assert name in EXPECTED_DIFFERENCES
    determined, hookdet = run(tmp_path, "batch-structures", "BatchStructures", {}, 7)
    for structure in STRUCTURES:
        assert len(batches_seen(determined, structure)) == len(batches_seen(hookdet, structure)) >= 2

    for det_event, hd_event in zip(batches_seen(determined, "namedtuple"), batches_seen(hookdet, "namedtuple")):
        assert list(det_event["batch"]) == ["tuple"] and list(hd_event["batch"]) == ["Example"]
        hd_event["batch"] = {"tuple": hd_event["batch"]["Example"]}

    assert all(e["data_length"] == e["batch_length"] == 2 for e in batches_seen(determined, "nested"))
    assert all(e["data_length"] == e["batch_length"] == 4 for e in batches_seen(hookdet, "nested"))
    for record in (determined, hookdet):
        for event in batches_seen(record, "nested"):
            event["data_length"] = event["batch_length"] = "compared above"

    after_training = [
        index for index, event in enumerate(determined["events"])
        if event["event"] == "get_batch_length" and determined["events"][index - 1]["event"] == "train_batch"
    ]
    assert len(after_training) == 1  # the one custom batch of the 7 trained
    determined["events"] = [e for i, e in enumerate(determined["events"]) if i not in after_training]
    # The trial's own observation calls it once per custom batch; hookdet once more per custom
    # validation batch, before evaluate_batch.
    custom = batches_seen(hookdet, "custom")
    validated = [e for e in custom if e["event"] == "evaluate_batch_data"]
    assert len(events(hookdet, "get_batch_length")) == len(custom) + len(validated) and validated

    assert_same_records("batch-structures", determined, hookdet)
    for structure in ("tensor", "list", "dict", "numpy", "custom"):
        first = batches_seen(hookdet, structure)[0]
        assert first["data_length"] == 4 or structure == "custom", (structure, first)
        assert first["batch_length"] == 4, (structure, first)
    numpy_batch = batches_seen(hookdet, "numpy")[0]["batch"]["tuple"]
    assert [item["tensor"] for item in numpy_batch] == ["torch.float32"] * 2 + ["torch.int64"]


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
