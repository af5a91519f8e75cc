"""Assertions over a parity case's records; counts what it compared for the suite's summary."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from tests.parity import compare

#: Behaviours compared so far in this session, by case (conftest prints the totals).
COMPARED: Dict[str, int] = {}

#: Periods most cases train with: every boundary kind, falling on different batches.
PERIODS = {
    "validation_period": {"Batch": 3},
    "checkpoint_period": {"Batch": 4},
    "reporting_period": {"Batch": 2},
    "checkpoint_policy": "all",
}


def events(record: Dict[str, Any], kind: str, **match: Any) -> List[Dict[str, Any]]:
    """The record's events of ``kind`` whose fields equal ``match``."""
    return [e for e in record["events"] if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]


def assert_local_only_getters(case: str, determined: Dict[str, Any], hookdet: Dict[str, Any]) -> None:
    """``tensorboard-path-none``, ``trial-seed-unset``, ``local-ids-missing``: Determined's local
    values, and hookdet's."""
    det_init = events(determined, "init_local_only")
    hd_init = events(hookdet, "init_local_only")
    for record in (determined, hookdet):  # compared here, not with the rest
        record["events"] = [e for e in record["events"] if e["event"] != "init_local_only"]
    if not det_init:
        return
    assert det_init[0]["tensorboard_path_is_none"] is True
    assert det_init[0]["trial_seed"] == {"dict": "dict", "items": {"raised": "InternalException"}}
    assert hd_init[0]["tensorboard_path_is_none"] is False, case
    assert isinstance(hd_init[0]["trial_seed"], int), case
    for getter in ("trial_id", "experiment_id"):
        assert det_init[0][getter] == {"dict": "dict", "items": {"raised": "AttributeError"}}, case
        assert hd_init[0][getter] == 1, case
    COMPARED[case] = COMPARED.get(case, 0) + 4


def assert_same_records(
    case: str,
    determined: Dict[str, Any],
    hookdet: Dict[str, Any],
    culprit: Optional[str] = None,
    weights: bool = True,
) -> int:
    """Everything observable equal, but for the registered differences; returns the count."""
    compared = 0
    det_error, hd_error = determined["error"], hookdet["error"]
    if culprit is None:
        assert det_error is None, f"{case}: Determined raised {det_error}"
        assert hd_error is None, f"{case}: hookdet raised {hd_error} where Determined did not"
    else:
        assert det_error is not None and culprit in det_error["message"], f"{case}: Determined {det_error}"
        assert hd_error is not None, f"{case}: hookdet raised nothing where Determined raised {det_error}"
        assert det_error["type"] in hd_error["classes"], (
            f"{case}: hookdet raised {hd_error['type']}, Determined {det_error['type']}")
        assert culprit in hd_error["message"], f"{case}: hookdet's message does not name {culprit!r}: {hd_error}"
        compared += 1
    det_events, hd_events = determined["events"], hookdet["events"]
    det_calls, hd_calls = compare.sequence(det_events), compare.sequence(hd_events)
    assert det_calls == hd_calls, f"{case}: call sequences differ at " + compare.first_sequence_difference(det_calls, hd_calls)
    for det_event, hd_event in zip(det_events, hd_events):
        problems = compare.values_differ(det_event, hd_event)
        assert not problems, f"{case}: {compare.sequence([det_event])[0]} differs: {problems[:5]}"
        compared += 1
    if weights:
        compared += assert_same_weights(case, determined["weights"], hookdet["weights"])
    COMPARED[case] = COMPARED.get(case, 0) + compared
    return compared


def tensors(weights: List[Dict[str, Any]]) -> List[Dict[str, torch.Tensor]]:
    """The recorded weights as tensors of their recorded dtype."""
    return [
        {name: torch.tensor(value["values"], dtype=getattr(torch, value["tensor"].split(".")[1]))
         for name, value in model.items()}
        for model in weights
    ]


def assert_same_weights(case: str, determined: Any, hookdet: Any) -> int:
    det_models, hd_models = tensors(determined), tensors(hookdet)
    assert [sorted(m) for m in det_models] == [sorted(m) for m in hd_models], f"{case}: models differ"
    compared = 0
    for index, (det_model, hd_model) in enumerate(zip(det_models, hd_models)):
        for name, det_tensor in det_model.items():
            assert torch.equal(det_tensor, hd_model[name]), f"{case}: model {index} {name} differs"
            compared += 1
    return compared
