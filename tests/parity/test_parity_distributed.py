"""Determined parity on 2 ranks (gloo): each trial runs once per framework, all ranks compared.

Determined gets its local multi-process recipe (``USE_TORCH_DISTRIBUTED``, ``init_process_group``,
``DistributedContext.from_torch_distributed()``); hookdet the same environment variables only.
"""
from __future__ import annotations

import pytest

from tests.parity import harness
from tests.parity.checks import PERIODS, assert_local_only_getters, assert_same_records, events

pytestmark = pytest.mark.slow


def compare_ranks(tmp_path, case, trial, fit, **options):
    results = harness.run_case(tmp_path, trial, fit, ranks=2, **options)
    for rank in range(2):
        determined, hookdet = results["determined"][0][rank], results["hookdet"][0][rank]
        assert_local_only_getters(f"{case}[rank {rank}]", determined, hookdet)
        assert_same_records(f"{case}[rank {rank}]", determined, hookdet)
    return results


def test_two_ranks_basic(tmp_path):
    """Sharded data, averaged metrics, hooks on every rank, equal weights on both ranks."""
    results = compare_ranks(tmp_path, "2-ranks-basic", "Basic", dict(PERIODS, max_length={"Batch": 5}))
    hookdet = results["hookdet"][0]
    assert hookdet[0]["weights"] == hookdet[1]["weights"]
    assert events(hookdet[1], "train_batch")[0]["getters"]["items"]["rank"] == 1


def test_two_ranks_reducers(tmp_path):
    """Every reducer kind across ranks: what cross_slot_reduce receives, what callbacks get."""
    compare_ranks(tmp_path, "2-ranks-reducers", "Reducers", dict(PERIODS, max_length={"Batch": 4}))


def test_two_ranks_full_dataset_and_stop(tmp_path):
    """evaluate_full_dataset on the chief only, its metrics on every rank's callbacks."""
    compare_ranks(tmp_path, "2-ranks-full-dataset", "FullDataset", dict(PERIODS, max_length={"Batch": 4}))
