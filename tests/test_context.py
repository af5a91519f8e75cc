"""``PyTorchTrialContext``: getters, wrapping rules, reducers and stop requests inside real fits."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from hookdet import pytorch
from hookdet.metrics.reducers import MetricError
from hookdet.plugin import run_of
from tests.support.trials import OneWeightTrial, fit

HP = {"lr": 0.1, "records": 8, "global_batch_size": 2}


def test_getters(tmp_path: Path) -> None:
    exp_conf = {
        "hyperparameters": HP,
        "data": {"path": "/data"},
        "reproducibility": {"experiment_seed": 7},
        "plugins": {"only": []},
    }
    with pytorch.init(hparams=HP, exp_conf=exp_conf, run_dir=tmp_path) as context:
        assert context.get_hparams() == HP and context.get_hparam("lr") == 0.1
        with pytest.raises(ValueError, match="no hyperparameter 'lrr'"):
            context.get_hparam("lrr")
        assert context.get_global_batch_size() == 2 and context.get_per_slot_batch_size() == 2
        assert context.get_data_config() == {"path": "/data"}
        assert context.get_experiment_config()["reproducibility"]["experiment_seed"] == 7
        assert isinstance(context.get_trial_seed(), int)
        assert context.get_experiment_id() == 1 and context.get_trial_id() == 1
        assert context.distributed.get_rank() == 0 and context.distributed.get_size() == 1
        assert context.get_initial_batch() == 0
        assert context.get_tensorboard_path() == tmp_path / "tensorboard"
        assert context.to_device({"x": [torch.ones(1)]})["x"][0].device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_trial_seed_is_applied_before_the_trial_is_built(tmp_path: Path) -> None:
    draws = []
    for run in range(2):
        with pytorch.init(hparams=HP, exp_conf={"plugins": {"only": []}, "reproducibility": {"experiment_seed": 3}}, run_dir=tmp_path / str(run)):
            draws.append(torch.rand(3))
    assert torch.equal(draws[0], draws[1])


def test_position_getters_during_training(tmp_path: Path) -> None:
    seen: List[tuple] = []

    class Watching(OneWeightTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
            c = self.context
            seen.append((c.current_train_batch(), c.current_train_epoch(), c.is_epoch_start(), c.is_epoch_end()))
            return super().train_batch(batch, epoch_idx, batch_idx)

    fit(Watching, HP, tmp_path, max_length=pytorch.Batch(5))
    assert seen == [(0, 0, True, False), (1, 0, False, False), (2, 0, False, False), (3, 0, False, True), (4, 1, True, False)]


def test_step_optimizer_twice_in_one_batch_is_an_error(tmp_path: Path) -> None:
    class Twice(OneWeightTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
            metrics = super().train_batch(batch, epoch_idx, batch_idx)
            self.context.step_optimizer(self.optimizer)
            return metrics

    with pytest.raises(RuntimeError, match="once per optimizer per batch"):
        fit(Twice, HP, tmp_path, max_length=pytorch.Batch(2))


def test_step_optimizer_with_an_unwrapped_optimizer_is_an_error(tmp_path: Path) -> None:
    class Unwrapped(OneWeightTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
            self.context.step_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
            return {"loss": torch.tensor(0.0)}

    with pytest.raises(ValueError, match="not passed through wrap_optimizer"):
        fit(Unwrapped, HP, tmp_path, max_length=pytorch.Batch(1))


def test_wrap_model_refuses_non_modules(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path) as context:
        with pytest.raises(TypeError, match="wrap_model takes a torch.nn.Module, got str"):
            context.wrap_model("model")
        with pytest.raises(TypeError, match="no plugin takes them"):
            context.wrap_model(torch.nn.Linear(1, 1), find_unused_parameters=True)


def test_set_stop_requested_stops_at_the_next_batch_with_a_checkpoint(tmp_path: Path) -> None:
    class Stopping(OneWeightTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
            if batch_idx == 2:
                self.context.set_stop_requested(True)
            return super().train_batch(batch, epoch_idx, batch_idx)

    trial = fit(Stopping, HP, tmp_path, max_length=pytorch.Batch(100))
    run = run_of(trial.context)
    assert run.state.batches_trained == 3 and run.exit_reason == "stopped"
    assert run.state.last_checkpoint_batch == 3


# ---------------------------------------------------------------------------------------------
# Custom reducers in the loop
# ---------------------------------------------------------------------------------------------


class Accuracy(pytorch.MetricReducer):
    """Correct over total: a global quantity the batch average cannot give."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.correct, self.total = 0, 0

    def update(self, correct: int, total: int) -> None:
        self.correct += correct
        self.total += total

    def per_slot_reduce(self) -> Any:
        return self.correct, self.total

    def cross_slot_reduce(self, per_slot_metrics: List[Any]) -> Any:
        correct = sum(c for c, _ in per_slot_metrics)
        total = sum(t for _, t in per_slot_metrics)
        return correct / total


def accuracy_of_pairs(values: List[Any]) -> float:
    return sum(c for c, _ in values) / sum(t for _, t in values)


class ReducingTrial(OneWeightTrial):
    """Validation batches of uneven size; accuracy through a MetricReducer and a function reducer."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.metric_reducer = context.wrap_reducer(Accuracy(), name="accuracy_metric_reducer", for_training=False)
        self.function_reducer = context.wrap_reducer(accuracy_of_pairs, name="accuracy_function", for_training=False)
        self.validations = 0

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.arange(7.0).unsqueeze(1)), batch_size=3)

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        (x,) = batch
        # Which records count as correct changes between validations, so a missing reset shows.
        correct = int((x.squeeze(1) % (2 + self.validations) == 0).sum())
        self.metric_reducer.update(correct, len(x))
        self.function_reducer.update((correct, len(x)))
        return {"validation_loss": torch.tensor(float(correct))}


def test_function_reducer_and_metric_reducer_agree_and_reset(tmp_path: Path) -> None:
    trial = fit(ReducingTrial, HP, tmp_path, max_length=pytorch.Batch(4), validation_period=pytorch.Batch(2))
    results = trial.recorder.validations
    assert len(results) == 2
    for result in results:
        assert result["accuracy_metric_reducer"] == result["accuracy_function"]
    # Records 0..6 with "x % 2 == 0" correct: 4/7; both validations used the same rule here.
    assert results[0]["accuracy_metric_reducer"] == pytest.approx(4 / 7)
    assert results[1]["accuracy_metric_reducer"] == pytest.approx(4 / 7)


def test_reducers_reset_between_workloads(tmp_path: Path) -> None:
    class ChangingRule(ReducingTrial):
        def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
            trial = self

            class Advance(pytorch.PyTorchCallback):
                def on_validation_end(self, metrics: Dict[str, Any]) -> None:
                    trial.validations += 1

            return {"recorder": self.recorder, "advance": Advance()}

    trial = fit(ChangingRule, HP, tmp_path, max_length=pytorch.Batch(4), validation_period=pytorch.Batch(2))
    first, second = trial.recorder.validations
    assert first["accuracy_function"] == pytest.approx(4 / 7)  # 0, 2, 4, 6
    assert second["accuracy_function"] == pytest.approx(3 / 7)  # 0, 3, 6: no leftovers from the first
    assert second["accuracy_metric_reducer"] == second["accuracy_function"]


def test_per_metric_reducer_dict(tmp_path: Path) -> None:
    class PerMetric(OneWeightTrial):
        def build_validation_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.arange(6.0).unsqueeze(1)), batch_size=2)

        def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
            (x,) = batch
            value = x.sum()
            return {"validation_loss": value, "total": value, "largest": value, "smallest": value}

        def evaluation_reducer(self) -> Dict[str, pytorch.Reducer]:
            return {
                "validation_loss": pytorch.Reducer.AVG,
                "total": pytorch.Reducer.SUM,
                "largest": pytorch.Reducer.MAX,
                "smallest": pytorch.Reducer.MIN,
            }

    trial = fit(PerMetric, HP, tmp_path, max_length=pytorch.Batch(1))
    # Batch sums: 1, 5, 9.
    assert trial.recorder.validations == [{"validation_loss": 5.0, "total": 15.0, "largest": 9.0, "smallest": 1.0}]


def test_reducer_name_rules(tmp_path: Path) -> None:
    class Unnamed(OneWeightTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            super().__init__(context)
            self.reducer = context.wrap_reducer(lambda values: sum(values), name=None)

        def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
            self.reducer.update(1.0)
            return super().evaluate_batch(batch)

    with pytest.raises(MetricError, match="name=None.*dict"):
        fit(Unnamed, HP, tmp_path / "unnamed", max_length=pytorch.Batch(1))

    class NamedDict(Unnamed):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            OneWeightTrial.__init__(self, context)
            self.reducer = context.wrap_reducer(lambda values: {"a": 1.0}, name="named")

    with pytest.raises(MetricError, match="name=.named.* must be a single value, but it returned a dict"):
        fit(NamedDict, HP, tmp_path / "named", max_length=pytorch.Batch(1))
