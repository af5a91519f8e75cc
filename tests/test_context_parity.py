"""The ``PyTorchTrialContext`` methods Determined has that hookdet added for parity (issue 14):
per-optimizer gradient averaging, the reducer calls, TensorBoard switch, ``autocast_forward_pass``,
and the cluster-only ``Trainer.configure_profiler`` / class attributes."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from torch import nn

from hookdet import pytorch
from tests.support.trials import OneWeightTrial, fit

INPUTS = [1.0, 0.5, 2.0, 0.25, 1.5, 0.5]
LABELS = [1.0, 2.0, 0.5, 1.0, 0.25, 2.0]
LR = 0.125  # every number below is a short binary fraction: float32 arithmetic is exact


class TwoOptimizerTrial(pytorch.PyTorchTrial):
    """Two one-weight models, one optimizer each: ``a`` with the experiment's averaging default,
    ``b`` with ``average_aggregated_gradients`` given to ``wrap_optimizer`` (hparam ``b_average``).
    Loss per record: ``(w * x - y) ** 2`` summed over both models."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.a = context.wrap_model(nn.Linear(1, 1, bias=False))
        self.b = context.wrap_model(nn.Linear(1, 1, bias=False))
        with torch.no_grad():
            self.a.weight.zero_()
            self.b.weight.zero_()
        self.opt_a = context.wrap_optimizer(torch.optim.SGD(self.a.parameters(), lr=LR))
        self.opt_b = context.wrap_optimizer(
            torch.optim.SGD(self.b.parameters(), lr=LR),
            average_aggregated_gradients=context.get_hparam("b_average"),
        )
        self.weights: List[tuple] = []

    def _data(self) -> pytorch.DataLoader:
        dataset = torch.utils.data.TensorDataset(
            torch.tensor(INPUTS).reshape(-1, 1), torch.tensor(LABELS).reshape(-1, 1)
        )
        return pytorch.DataLoader(dataset, batch_size=1)

    build_training_data_loader = _data
    build_validation_data_loader = _data

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        x, y = batch
        loss = ((self.a(x) - y) ** 2).sum() + ((self.b(x) - y) ** 2).sum()
        self.context.backward(loss)
        self.context.step_optimizer(self.opt_a)
        self.context.step_optimizer(self.opt_b)
        self.weights.append((self.a.weight.item(), self.b.weight.item()))
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        return {"validation_loss": ((self.a(x) - y) ** 2).sum()}


def by_hand(average: bool, frequency: int = 2) -> List[float]:
    """SGD on ``(w x - y)^2`` with gradients summed over ``frequency`` records, divided by
    ``frequency`` when ``average``: the weight after each batch."""
    weight, accumulated, after = 0.0, 0.0, []
    for index, (x, y) in enumerate(zip(INPUTS, LABELS)):
        accumulated += 2 * (weight * x - y) * x
        if (index + 1) % frequency == 0:
            weight -= LR * (accumulated / frequency if average else accumulated)
            accumulated = 0.0
        after.append(weight)
    return after


@pytest.mark.parametrize("default_average, b_average", [(True, False), (False, True)])
def test_average_aggregated_gradients_is_per_optimizer(
    tmp_path: Path, default_average: bool, b_average: bool
) -> None:
    trial = fit(
        TwoOptimizerTrial,
        {"b_average": b_average, "global_batch_size": 1},
        tmp_path,
        config={"optimizations": {"aggregation_frequency": 2,
                                  "average_aggregated_gradients": default_average}},
        max_length=pytorch.Batch(len(INPUTS)),
    )
    expected_a, expected_b = by_hand(default_average), by_hand(b_average)
    assert expected_a != expected_b
    for value in expected_a + expected_b:  # exactly representable, so equality is exact
        assert float(torch.tensor(value, dtype=torch.float32)) == value
    assert [a for a, _ in trial.weights] == expected_a
    assert [b for _, b in trial.weights] == expected_b


def test_wrap_optimizer_refuses_non_bool_flags(tmp_path: Path) -> None:
    with pytorch.init(hparams={}, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path) as context:
        optimizer = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
        with pytest.raises(TypeError, match="wrap_optimizer: average_aggregated_gradients"):
            context.wrap_optimizer(optimizer, average_aggregated_gradients="no")
        with pytest.raises(TypeError, match="wrap_optimizer: fp16_compression"):
            context.wrap_optimizer(optimizer, 1, 1)
        assert context.wrap_optimizer(optimizer, 1, True, False) is optimizer


def halves(values: List[Any]) -> float:
    return sum(values) / 2


def test_reduce_metrics_reset_reducers_and_cross_slot_reduction(tmp_path: Path) -> None:
    with pytorch.init(hparams={}, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path) as context:
        training = context.wrap_reducer(halves, name="half", for_validation=False)
        validation = context.wrap_reducer(halves, name="vhalf", for_training=False)
        for value in (1.0, 2.0, 5.0):
            training.update(value)
            validation.update(value * 10)
        assert context.reduce_metrics(for_training=True) == {"half": 4.0}
        assert context.reduce_metrics(for_training=False) == {"vhalf": 40.0}
        assert context.reduce_metrics(True) == {"half": 4.0}, "reducing does not reset"
        gathered = [[training.per_slot_reduce(), validation.per_slot_reduce()], [[6.0], [2.0]]]
        assert context.run_cross_slot_reduction([training, validation], gathered) == {
            "half": 7.0, "vhalf": 41.0,
        }
        with pytest.raises(ValueError, match="run_cross_slot_reduction: .*wrap_reducer"):
            context.run_cross_slot_reduction([pytorch.MetricReducer], [[1]])  # type: ignore[list-item]
        context.reset_reducers()
        assert context.reduce_metrics(True) == {"half": 0.0}
        assert context.reduce_metrics(False) == {"vhalf": 0.0}


def test_set_enable_tensorboard_logging_switches_metric_writing(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class Quiet(OneWeightTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            super().__init__(context)
            assert context.get_enable_tensorboard_logging()
            context.set_enable_tensorboard_logging(False)
            assert not context.get_enable_tensorboard_logging()

    hparams = {"lr": 0.1, "records": 4, "global_batch_size": 2}
    for trial_class, name in ((OneWeightTrial, "on"), (Quiet, "off")):
        fit(trial_class, hparams, tmp_path / name, config={"plugins": {"only": ["callbacks", "tensorboard"]}},
            max_length=pytorch.Batch(4), reporting_period=pytorch.Batch(1))
    tags = {}
    for name in ("on", "off"):
        directory = tmp_path / name / "tensorboard"
        tags[name] = []
        if directory.exists():  # a writer that never writes creates no directory
            accumulator = EventAccumulator(str(directory))
            accumulator.Reload()
            tags[name] = accumulator.Tags()["scalars"]
    assert "training/loss" in tags["on"] and tags["off"] == []

    with pytorch.init(hparams={}, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path / "late") as context:
        assert not context.get_enable_tensorboard_logging()
        with pytest.raises(TypeError, match="set_enable_tensorboard_logging takes a bool"):
            context.set_enable_tensorboard_logging(1)  # type: ignore[arg-type]
        context.set_enable_tensorboard_logging(True)
        assert context.get_enable_tensorboard_logging()


def test_autocast_forward_pass_runs_the_forward_under_autocast(tmp_path: Path) -> None:
    class Probe(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.autocast_on = torch.is_autocast_enabled("cpu")
            return super().forward(x)

    with pytorch.init(hparams={}, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path) as context:
        model = Probe(2, 2)
        wrapped = context.autocast_forward_pass(model)
        output = wrapped(torch.ones(1, 2))
        assert wrapped.autocast_on and output.dtype == torch.float32
        model.autocast_on = None
        nn.Linear.__call__(Probe(2, 2), torch.ones(1, 2))  # another instance: not patched
        assert model.autocast_on is None


def test_cluster_only_names_say_what_they_do(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from hookdet.loop.core_loop import TrainingLoop

    assert pytorch.PyTorchTrial.trial_context_class is pytorch.PyTorchTrialContext
    assert pytorch.PyTorchTrial.trial_controller_class is TrainingLoop
    with pytorch.init(hparams={}, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path) as context:
        trainer = pytorch.Trainer(OneWeightTrial.__new__(OneWeightTrial), context)
        with caplog.at_level(logging.ERROR, logger="hookdet"):
            trainer.configure_profiler(enabled=True)
    assert "profiling_enabled=True" in caplog.text
