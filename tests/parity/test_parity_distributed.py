"""Determined parity on 2 ranks (gloo): each trial runs once per framework, all ranks compared.

Determined gets its local multi-process recipe (``USE_TORCH_DISTRIBUTED``, ``init_process_group``,
``DistributedContext.from_torch_distributed()``); hookdet the same environment variables only.
"""
from __future__ import annotations

import pytest

from tests.parity import harness
from tests.parity.checks import PERIODS, assert_local_only_getters, assert_same_records, assert_same_weights, events

pytestmark = pytest.mark.slow


def compare_ranks(tmp_path, case, trial, fit, **options):
    results = harness.run_case(tmp_path, trial, fit, ranks=2, **options)
    for rank in range(2):
        determined, hookdet = results["determined"][0][rank], results["hookdet"][0][rank]
        assert_local_only_getters(f"{case}[rank {rank}]", determined, hookdet)
        assert_same_records(f"{case}[rank {rank}]", determined, hookdet)
    return results


def test_two_ranks_basic(tmp_path):
    """Sharded data, averaged metrics, hooks on every rank, equal weights on both ranks; a
    training metric with several elements is averaged across ranks and elements to one number
    per batch, as Determined does."""
    results = compare_ranks(tmp_path, "2-ranks-basic", "VectorTrainingMetric", dict(PERIODS, max_length={"Batch": 5}))
    hookdet = results["hookdet"][0]
    assert hookdet[0]["weights"] == hookdet[1]["weights"]
    assert events(hookdet[1], "train_batch")[0]["getters"]["items"]["rank"] == 1
    workload = events(hookdet[0], "callback", method="on_training_workload_end")[0]
    averaged = workload["batch_metrics"]["list"][0]["items"]["vector"]
    assert (averaged["ndarray"], averaged["shape"]) == ("float32", []), averaged  # one number per batch


def test_two_ranks_reducers(tmp_path):
    """Every reducer kind across ranks: what cross_slot_reduce receives, what callbacks get."""
    compare_ranks(tmp_path, "2-ranks-reducers", "Reducers", dict(PERIODS, max_length={"Batch": 4}))


def test_two_ranks_reducer_result_shapes(tmp_path):
    """Lists, tuples, arrays, tensors, NumPy scalars and a dict from cross_slot_reduce, across
    ranks: the callbacks on every rank get what Determined's get."""
    compare_ranks(tmp_path, "2-ranks-reducer-shapes", "ReducerResultShapes", dict(PERIODS, max_length={"Batch": 4}))


def test_two_ranks_full_dataset_and_stop(tmp_path):
    """evaluate_full_dataset on the chief only, its metrics on every rank's callbacks."""
    compare_ranks(tmp_path, "2-ranks-full-dataset", "FullDataset", dict(PERIODS, max_length={"Batch": 4}))


def test_two_ranks_resume(tmp_path):
    """Stop at batch 3 and resume to batch 7, both on 2 ranks, in new processes.

    The first run is compared on both ranks. Resumed: both frameworks call ``on_trial_startup``
    before the checkpoint loads on every rank; ``local-resume-restarts-data`` as on one rank
    (Determined's ranks start over at batch 0, hookdet's continue at batch 3 with their own
    shards), and hookdet's ranks end bit for bit where a 2-rank run that never stopped ends.
    """
    from tests.parity.test_parity import RESUME_PERIODS, _batch_metrics, _validations

    results = harness.run_case(
        tmp_path / "resumed", "Resumable", dict(RESUME_PERIODS, max_length={"Batch": 3}),
        resume_fit=dict(RESUME_PERIODS, max_length={"Batch": 7}), ranks=2,
    )
    for rank in range(2):
        determined, hookdet = results["determined"][0][rank], results["hookdet"][0][rank]
        assert_local_only_getters(f"2-ranks-resume[rank {rank}]", determined, hookdet)
        assert_same_records(f"2-ranks-resume[rank {rank}]", determined, hookdet)
    straight = harness.run_case(tmp_path / "straight", "Resumable", dict(RESUME_PERIODS, max_length={"Batch": 7}),
                                ranks=2, frameworks=("hookdet",))["hookdet"][0]
    startup = ["on_trial_startup", "on_checkpoint_load_start", "load_state_dict", "on_training_start"]
    for rank in range(2):
        det_resumed, hd_resumed = results["determined"][1][rank], results["hookdet"][1][rank]
        for record in (det_resumed, hd_resumed):
            assert [c["method"] for c in events(record, "callback")[:4]] == startup
        assert events(det_resumed, "callback", method="on_trial_startup")[0]["first_batch_idx"] == 0
        assert events(hd_resumed, "callback", method="on_trial_startup")[0]["first_batch_idx"] == 3
        assert events(det_resumed, "train_batch")[0]["batch_idx"] == 0
        hd_first = events(hd_resumed, "train_batch")[0]
        uninterrupted = {e["batch_idx"]: e["records"] for e in events(straight[rank], "train_batch")}
        assert hd_first["batch_idx"] == 3 and hd_first["records"] == uninterrupted[3]
        expected, resumed = _batch_metrics(straight[rank]), _batch_metrics(hd_resumed)
        assert sorted(resumed) == [3, 4, 5, 6]
        assert {index: expected[index] for index in resumed} == resumed
        assert {k: v for k, v in _validations(straight[rank]).items() if k > 3} == _validations(hd_resumed)
        assert_same_weights(f"2-ranks-resume[rank {rank}]", straight[rank]["weights"], hd_resumed["weights"])

