"""The harness itself: where it finds Determined, and what a missing Determined does."""
from __future__ import annotations

import pytest

from tests.parity import harness
from tests.parity.compare import metric_value, values_differ


def test_missing_determined_fails_in_ci_and_skips_locally(monkeypatch, tmp_path):
    monkeypatch.setenv("HOOKDET_PARITY_DET_PYTHON", str(tmp_path / "absent" / "python"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="needs Determined 0.38.1 at .*absent"):
        harness.require_determined()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="HOOKDET_PARITY_DET_PYTHON"):
        harness.require_determined()


def test_default_location_is_the_repositorys_venv(monkeypatch):
    monkeypatch.delenv("HOOKDET_PARITY_DET_PYTHON", raising=False)
    assert harness.determined_python() == harness.REPO_ROOT / ".venv-determined" / "bin" / "python"


def test_values_compare_exactly_unless_told():
    assert values_differ({"a": [1.0, 2.0]}, {"a": [1.0, 2.0]}) == []
    assert values_differ({"a": 1.0}, {"a": 1.0 + 1e-9}) == [".a: 1.0 != 1.000000001"]
    assert values_differ({"a": 1.0}, {"a": 1.0 + 1e-9}, rtol=1e-6) == []
    assert values_differ({"a": 1}, {"b": 1}) == [".a: only in determined", ".b: only in hookdet"]


def test_metric_value_strips_containers_only():
    array = {"ndarray": "float32", "shape": [], "values": 2.5}
    assert metric_value({"dict": "dict", "items": {"x": array, "y": 2.5}}) == {"x": 2.5, "y": 2.5}
    assert metric_value({"list": [array]}) == [2.5]


@pytest.mark.slow
def test_a_runner_forked_from_the_warm_server_records_what_a_new_interpreter_records(tmp_path, monkeypatch):
    """Both frameworks' records (events, final weights, error) of one checkpointing case are
    equal whether its runners are forked from the warm servers (the default) or started cold."""
    from tests.parity.checks import PERIODS

    fit = dict(PERIODS, max_length={"Batch": 5})
    warm = harness.run_case(tmp_path / "warm", "Basic", fit)
    monkeypatch.setenv("HOOKDET_TEST_COLD", "1")
    cold = harness.run_case(tmp_path / "cold", "Basic", fit)
    for framework in harness.FRAMEWORKS:
        (warm_record,), (cold_record,) = warm[framework][0], cold[framework][0]
        assert len(warm_record["events"]) > 20
        for key in ("events", "weights", "error"):
            assert warm_record[key] == cold_record[key], (framework, key)
