"""The profiler plugin: torch.profiler traces of the scheduled batches in the TensorBoard directory."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, List, Set

import pytest
import torch

from hookdet import pytorch
from hookdet.config import ConfigError
from hookdet.plugin import run_of
from tests.support.trials import OneWeightTrial, fit

HP = {"lr": 0.1, "records": 8, "global_batch_size": 2}
PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def traces(run_dir: Path) -> List[Path]:
    """The trace files written into the run's TensorBoard directory."""
    return sorted((run_dir / "tensorboard").glob("*.pt.trace.json"))


def profiled_steps(trace: Path) -> Set[int]:
    """The profiler step numbers a chrome trace recorded (parsing the whole file as JSON)."""
    events = json.loads(trace.read_text())["traceEvents"]
    steps = set()
    for event in events:
        match = PROFILER_STEP.match(str(event.get("name", "")))
        if match:
            steps.add(int(match.group(1)))
    return steps


def no_directory_named_none(*roots: Path) -> bool:
    return not any(path.name == "None" for root in roots for path in root.rglob("*"))


def test_experiment_file_schedule_records_only_the_chosen_batches(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    config = {
        "plugins": {"only": ["callbacks", "profiler"]},
        "plugin_config": {"profiler": {"begin_on_batch": 3, "end_after_batch": 5, "activities": ["cpu"]}},
    }
    fit(OneWeightTrial, HP, tmp_path / "run", config=config, max_length=pytorch.Batch(10))
    (trace,) = traces(tmp_path / "run")
    assert "_rank0." in trace.name
    assert profiled_steps(trace) == {3, 4, 5}
    assert no_directory_named_none(tmp_path)


class SetProfilerTrial(OneWeightTrial):
    """Calls ``context.set_profiler`` as a Determined trial does."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        context.set_profiler(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
        )


def test_set_profiler_loads_the_plugin_and_writes_into_the_tensorboard_directory(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    trial = fit(SetProfilerTrial, HP, tmp_path / "run", max_length=pytorch.Batch(8))
    assert run_of(trial.context).plugins.get("profiler") is not None
    (trace,) = traces(tmp_path / "run")
    assert profiled_steps(trace) == {2, 3}
    assert no_directory_named_none(tmp_path)


class OwnHandlerTrial(OneWeightTrial):
    """Passes its own ``on_trace_ready``; no schedule, so the whole training is one trace."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.ready: List[Any] = []
        context.set_profiler(activities=[torch.profiler.ProfilerActivity.CPU], on_trace_ready=self.ready.append)


def test_a_trials_own_trace_handler_is_kept(tmp_path: Path) -> None:
    trial = fit(OwnHandlerTrial, HP, tmp_path, max_length=pytorch.Batch(3))
    (profile,) = trial.ready
    assert isinstance(profile, torch.profiler.profile)
    assert traces(tmp_path) == []


def test_resumed_run_profiles_the_same_batches_as_a_fresh_one(tmp_path: Path) -> None:
    options = {"begin_on_batch": 5, "end_after_batch": 6, "activities": ["cpu"]}
    config = {"plugins": {"only": ["callbacks", "checkpoint", "profiler"]}, "plugin_config": {"profiler": options}}
    fit(OneWeightTrial, HP, tmp_path / "first", config=config, max_length=pytorch.Batch(4))
    assert traces(tmp_path / "first") == []
    fit(OneWeightTrial, HP, tmp_path / "resumed", config=config, max_length=pytorch.Batch(8),
        latest_checkpoint=str(tmp_path / "first"))
    (trace,) = traces(tmp_path / "resumed")
    # The profiler counts its steps from the resume point (batch 4): batches 5 and 6 are steps 1, 2.
    assert profiled_steps(trace) == {1, 2}


def test_profiling_enabled_uses_the_default_schedule(tmp_path: Path) -> None:
    fit(OneWeightTrial, HP, tmp_path, max_length=pytorch.Batch(6), profiling_enabled=True)
    (trace,) = traces(tmp_path)
    assert profiled_steps(trace) == {1, 2, 3}


@pytest.mark.parametrize(
    "options, culprit",
    [
        ({"begin_on_batch": 4, "end_after_batch": 2}, ": end_after_batch (2) is before begin_on_batch (4)"),
        ({"begin_on_batch": -1}, ".begin_on_batch: must be at least 0; got -1"),
        ({"activities": ["tpu"]}, ".activities.0: expected one of 'cpu' or 'cuda'; got 'tpu'"),
        ({"record_shapes": "yes"}, ".record_shapes: expected true or false; got 'yes'"),
        ({"start": 3}, ".start: unknown option 'start'; known options: begin_on_batch, end_after_batch"),
    ],
)
def test_bad_options_name_the_plugin_and_the_field(tmp_path: Path, options: dict, culprit: str) -> None:
    """Declared options (``ProfilerPlugin.Options``): refused when the experiment is read."""
    config = {"plugins": {"only": ["profiler"]}, "plugin_config": {"profiler": options}}
    with pytest.raises(ConfigError) as error:
        fit(OneWeightTrial, HP, tmp_path, config=config, max_length=pytorch.Batch(2))
    assert str(error.value).startswith(f"exp_conf: plugin_config.profiler{culprit}"), str(error.value)
