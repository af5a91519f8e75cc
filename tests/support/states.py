"""Comparing checkpointed state bit for bit: tensors by ``torch.equal``, containers item by item,
naming where the first difference is."""
from __future__ import annotations

from typing import Any

import torch


def assert_states_equal(expected: Any, actual: Any, where: str = "state", ordered: bool = False) -> None:
    """``ordered``: mappings must also list their keys in the same order."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and expected.dtype == actual.dtype, where
        assert torch.equal(expected, actual), where
    elif isinstance(expected, dict):
        assert (list(expected) == list(actual)) if ordered else (set(expected) == set(actual)), where
        for key in expected:
            assert_states_equal(expected[key], actual[key], f"{where}[{key!r}]", ordered)
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(actual), where
        for index, (left, right) in enumerate(zip(expected, actual)):
            assert_states_equal(left, right, f"{where}[{index}]", ordered)
    else:
        assert expected == actual, where
