"""Determined parity, single process: each case runs its trial under Determined 0.38.1 and hookdet.

See ``harness.py`` for how, ``expected_differences.py`` for what may differ and why.
"""
from __future__ import annotations

import pytest

from tests.parity import harness
from tests.parity.checks import assert_same_records

pytestmark = pytest.mark.slow

PERIODS = {
    "validation_period": {"Batch": 3},
    "checkpoint_period": {"Batch": 4},
    "reporting_period": {"Batch": 2},
    "checkpoint_policy": "all",
}


def single(results, phase=0):
    return results["determined"][phase][0], results["hookdet"][phase][0]


def test_basic(tmp_path):
    results = harness.run_case(tmp_path, "Basic", dict(PERIODS, max_length={"Batch": 6}))
    assert_same_records("basic", *single(results))
