"""Tests for hookdet.metrics.reducers: Determined's reducer semantics, single rank and simulated ranks.

Several ranks are simulated by threads in one process that meet in a real allgather (a barrier;
objects cross it pickled, as they would cross a process boundary). Each rank computes only its own
part and calls the reduction exactly as the loop will, so a reduction that skipped or repeated the
collective on some rank would time out here instead of passing.
"""

from __future__ import annotations

import math
import pickle
import threading
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hookdet.metrics.metric_values import check_metrics_serialisable
from hookdet.metrics.reducers import (
    FunctionReducer,
    MetricError,
    MetricReducer,
    Reducer,
    ReducerRegistry,
    single_process_allgather,
)
from hookdet.metrics import callback_metrics
from hookdet.metrics.workload_metrics import average_training_metrics, reduce_validation_metrics


class ThreadAllgather:
    """An allgather among ``world_size`` threads; each object is pickled on the way across."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._slots: list[bytes] = [b""] * world_size
        self._barrier = threading.Barrier(world_size, timeout=10)
        self.calls = [0] * world_size

    def for_rank(self, rank: int) -> Callable[[Any], list[Any]]:
        def allgather(obj: Any) -> list[Any]:
            self.calls[rank] += 1
            self._slots[rank] = pickle.dumps(obj)
            self._barrier.wait()
            gathered = [pickle.loads(blob) for blob in self._slots]
            self._barrier.wait()
            return gathered

        return allgather


def run_on_ranks(
    world_size: int, work: Callable[[int, Callable], Any], collectives: int = 1
) -> list[Any]:
    """Run ``work(rank, allgather)`` on ``world_size`` threads; return each rank's result or error.

    Asserts every rank called allgather exactly ``collectives`` times.
    """
    group = ThreadAllgather(world_size)
    outcomes: list[Any] = [None] * world_size

    def run(rank: int) -> None:
        try:
            outcomes[rank] = work(rank, group.for_rank(rank))
        except BaseException as error:  # collected so the test can assert on every rank's error
            outcomes[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
        assert not thread.is_alive(), "a rank never left the allgather"
    assert group.calls == [collectives] * world_size, f"allgather calls per rank: {group.calls}"
    return outcomes


def unwrap(outcomes: list[Any]) -> list[Any]:
    """The ranks' results, re-raising the first rank's error if any rank failed."""
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


# ---------------------------------------------------------------------------------------------
# Reducer and MetricReducer
# ---------------------------------------------------------------------------------------------


def test_reducer_members_match_determined():
    assert {member.name: member.value for member in Reducer} == {
        "AVG": 1,
        "SUM": 2,
        "MAX": 3,
        "MIN": 4,
    }


def test_metric_reducer_requires_all_three_methods():
    class OnlyReset(MetricReducer):
        def reset(self) -> None:
            pass

    with pytest.raises(TypeError, match="abstract"):
        OnlyReset()


class AccuracyReducer(MetricReducer):
    """Global accuracy: each rank sums correct and total; the sums are combined at the end."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.correct = 0
        self.total = 0

    def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
        self.correct += int((predictions == labels).sum())
        self.total += len(labels)

    def per_slot_reduce(self) -> Any:
        return self.correct, self.total

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
        corrects, totals = zip(*per_slot_metrics)
        return sum(corrects) / sum(totals)


def accuracy_from_batches(pairs: list[Any]) -> float:
    """Reducer function: the accuracy over every (predictions, labels) pair of every rank."""
    correct = sum(int((predictions == labels).sum()) for predictions, labels in pairs)
    return correct / sum(len(labels) for _, labels in pairs)


def make_batches(seed: int, num_batches: int, batch_size: int) -> list[Any]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randint(0, 3, (batch_size,), generator=generator),
            torch.randint(0, 3, (batch_size,), generator=generator),
        )
        for _ in range(num_batches)
    ]


def test_function_and_metric_reducer_agree_on_global_accuracy_and_reset_each_workload():
    # Two workloads; rank 0 and rank 1 see different numbers of batches of different sizes, so
    # averaging per-rank accuracies would differ from the global accuracy.
    workloads = [
        [
            make_batches(seed=1, num_batches=3, batch_size=8),
            make_batches(seed=2, num_batches=1, batch_size=5),
        ],
        [
            make_batches(seed=3, num_batches=2, batch_size=4),
            make_batches(seed=4, num_batches=4, batch_size=6),
        ],
    ]

    def rank_work(rank: int, allgather: Callable) -> list[dict]:
        registry = ReducerRegistry()
        by_class = registry.wrap(AccuracyReducer(), name="acc_class")
        by_function = registry.wrap(accuracy_from_batches, name="acc_function")
        assert isinstance(by_function, FunctionReducer)
        results = []
        for workload in workloads:
            registry.reset_all(for_training=False)
            for predictions, labels in workload[rank]:
                by_class.update(predictions, labels)
                by_function.update((predictions, labels))
            results.append(registry.reduce(for_training=False, allgather=allgather))
        return results

    per_rank_results = unwrap(run_on_ranks(2, rank_work, collectives=len(workloads)))
    for workload_index, workload in enumerate(workloads):
        expected = accuracy_from_batches(workload[0] + workload[1])
        naive = np.mean([accuracy_from_batches(rank_batches) for rank_batches in workload])
        assert not math.isclose(expected, naive)
        for rank in range(2):
            result = per_rank_results[rank][workload_index]
            assert result["acc_class"] == pytest.approx(expected)
            assert result["acc_function"] == pytest.approx(expected)


def test_function_reducer_sees_values_interleaved_across_ranks():
    received = []

    def record(values: list[Any]) -> int:
        received.append(values)
        return len(values)

    def rank_work(rank: int, allgather: Callable) -> dict:
        registry = ReducerRegistry()
        recorder = registry.wrap(record, name="count")
        for value in [0, 2, 4] if rank == 0 else [1, 3]:
            recorder.update(value)
        return registry.reduce(for_training=True, allgather=allgather)

    results = unwrap(run_on_ranks(2, rank_work))
    assert results == [{"count": 5}, {"count": 5}]
    assert received == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]


def test_unnamed_reducer_dict_keys_become_metrics():
    registry = ReducerRegistry()
    per_class = registry.wrap(
        lambda values: {f"class_{label}": values.count(label) for label in (0, 1)}
    )
    total = registry.wrap(len, name="total")
    for label in (0, 1, 1):
        per_class.update(label)
        total.update(label)
    assert registry.reduce(for_training=True) == {"class_0": 1, "class_1": 2, "total": 3}


def test_unnamed_reducer_returning_a_single_value_is_refused_naming_it():
    registry = ReducerRegistry()

    def mean_loss(values: list[float]) -> float:
        return sum(values) / len(values)

    registry.wrap(mean_loss).update(1.0)
    with pytest.raises(
        MetricError, match=r"mean_loss\(\).*name=None.*must be a dict.*returned a float"
    ):
        registry.reduce(for_training=True)

    class Scalar(AccuracyReducer):
        pass

    other = ReducerRegistry()
    other.wrap(Scalar()).update(torch.tensor([1]), torch.tensor([1]))
    with pytest.raises(MetricError, match=r"MetricReducer .*Scalar .*name=None.*must be a dict"):
        other.reduce(for_training=False)


def test_named_reducer_returning_a_dict_is_refused_naming_it():
    registry = ReducerRegistry()

    def per_class(values: list[int]) -> dict:
        return {"a": 1}

    registry.wrap(per_class, name="classes").update(0)
    with pytest.raises(MetricError, match=r"per_class\(\) \(name='classes'\).*returned a dict"):
        registry.reduce(for_training=False)


def test_reducer_misuse_messages_carry_determineds_words():
    """Determined's own tests match these phrases; hookdet's sentence keeps them."""
    unnamed, named = ReducerRegistry(), ReducerRegistry()
    unnamed.wrap(lambda values: 1.0).update(0)
    with pytest.raises(MetricError, match=r"name=None but it did not return a dict"):
        unnamed.reduce(for_training=False)
    named.wrap(lambda values: {"a": 1}, name="one").update(0)
    with pytest.raises(MetricError, match=r"with name set but it returned a dict anyway"):
        named.reduce(for_training=False)


def test_wrap_refuses_bad_registrations_with_one_clear_error():
    registry = ReducerRegistry()
    accuracy = registry.wrap(AccuracyReducer(), name="acc")
    with pytest.raises(
        ValueError, match=r"name 'acc' is already used by MetricReducer .*AccuracyReducer"
    ):
        registry.wrap(len, name="acc")
    with pytest.raises(ValueError, match="twice"):
        registry.wrap(accuracy, name="acc2")
    with pytest.raises(TypeError, match=r"class AccuracyReducer, not an instance"):
        registry.wrap(AccuracyReducer, name="acc3")
    with pytest.raises(TypeError, match="function or a MetricReducer instance.*int"):
        registry.wrap(3, name="three")
    with pytest.raises(ValueError, match="never report"):
        registry.wrap(len, name="idle", for_training=False, for_validation=False)
    with pytest.raises(TypeError, match="non-empty string"):
        registry.wrap(len, name="")
    assert len(registry) == 1


def test_a_name_may_be_shared_by_a_training_and_a_validation_reducer():
    registry = ReducerRegistry()
    training = registry.wrap(lambda values: max(values), name="score", for_validation=False)
    validation = registry.wrap(lambda values: min(values), name="score", for_training=False)
    for value in (1, 5, 3):
        training.update(value)
        validation.update(value)
    assert registry.reduce(for_training=True) == {"score": 5}
    assert registry.reduce(for_training=False) == {"score": 1}


def test_reset_all_resets_only_the_requested_workload_kind():
    registry = ReducerRegistry()
    training_only = registry.wrap(len, name="train_count", for_validation=False)
    validation_only = registry.wrap(len, name="val_count", for_training=False)
    training_only.update(1)
    validation_only.update(1)
    registry.reset_all(for_training=False)
    assert registry.reduce(for_training=True) == {"train_count": 1}
    assert registry.reduce(for_training=False) == {"val_count": 0}
    registry.reset_all()
    assert registry.reduce(for_training=True) == {"train_count": 0}


def test_a_failing_reducer_is_named_in_the_error():
    class Broken(AccuracyReducer):
        def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
            raise ZeroDivisionError("nothing seen")

    registry = ReducerRegistry()
    registry.wrap(Broken(), name="broken")
    with pytest.raises(
        MetricError, match=r"Broken \(name='broken'\) failed in cross_slot_reduce\(\)"
    ):
        registry.reduce(for_training=True)


def test_two_reducers_reporting_the_same_metric_are_refused():
    registry = ReducerRegistry()
    registry.wrap(lambda values: {"loss": 1.0})
    registry.wrap(lambda values: 2.0, name="loss")
    with pytest.raises(MetricError, match="metric 'loss' is reported by both"):
        registry.reduce(for_training=True)


def test_reducer_results_are_converted_to_plain_python():
    registry = ReducerRegistry()
    mean = registry.wrap(lambda values: torch.stack(values).mean(), name="mean")
    histogram = registry.wrap(
        lambda values: {"hist": np.bincount(np.array([int(v) for v in values]))}
    )
    for value in (torch.tensor(1.0), torch.tensor(2.0)):
        mean.update(value)
        histogram.update(value)
    result = registry.reduce(for_training=True)
    assert result == {"mean": 1.5, "hist": [0, 1, 1]}
    assert type(result["mean"]) is float


# ---------------------------------------------------------------------------------------------
# Validation metrics
# ---------------------------------------------------------------------------------------------


RANK_VALUES = {0: [1.0, 2.0, 3.0, 10.0], 1: [20.0]}


def validation_on_two_ranks(reducer: Any) -> list[Any]:
    def rank_work(rank: int, allgather: Callable) -> dict:
        batches = [{"m": torch.tensor(value)} for value in RANK_VALUES[rank]]
        return reduce_validation_metrics(batches, len(batches), reducer, allgather)

    return run_on_ranks(2, rank_work)


def test_avg_is_batch_weighted_across_ranks_with_unequal_batch_counts():
    all_values = RANK_VALUES[0] + RANK_VALUES[1]
    global_mean = sum(all_values) / len(all_values)
    mean_of_rank_means = np.mean([np.mean(v) for v in RANK_VALUES.values()])
    assert not math.isclose(global_mean, mean_of_rank_means)
    for result in unwrap(validation_on_two_ranks(Reducer.AVG)):
        assert result == {"m": pytest.approx(global_mean)}


@pytest.mark.parametrize(
    "reducer, expected", [(Reducer.SUM, 36.0), (Reducer.MAX, 20.0), (Reducer.MIN, 1.0)]
)
def test_sum_max_min_act_over_every_batch_of_every_rank(reducer: Reducer, expected: float):
    for result in unwrap(validation_on_two_ranks(reducer)):
        assert result == {"m": expected}


def test_a_rank_without_batches_contributes_nothing():
    def rank_work(rank: int, allgather: Callable) -> dict:
        batches = [{"m": 4.0}, {"m": 6.0}] if rank == 0 else []
        return reduce_validation_metrics(batches, None, Reducer.AVG, allgather)

    assert unwrap(run_on_ranks(2, rank_work)) == [{"m": 5.0}, {"m": 5.0}]
    assert reduce_validation_metrics([], 0) == {}


def test_per_metric_reducer_dict():
    batches = [{"loss": 1.0, "errors": 2, "best": 0.5}, {"loss": 3.0, "errors": 5, "best": 0.75}]
    reducers = {"loss": Reducer.AVG, "errors": Reducer.SUM, "best": Reducer.MAX}
    assert reduce_validation_metrics(batches, 2, reducers) == {
        "loss": 2.0,
        "errors": 7.0,
        "best": 0.75,
    }


def test_reducer_dict_must_cover_exactly_the_metrics():
    batches = [{"loss": 1.0, "accuracy": 0.5}]
    with pytest.raises(MetricError, match=r"no reducer for validation metric\(s\) \['accuracy'\]"):
        reduce_validation_metrics(batches, 1, {"loss": Reducer.AVG})
    with pytest.raises(
        MetricError, match=r"names metric\(s\) \['f1'\] that evaluate_batch did not return"
    ):
        reduce_validation_metrics(
            batches, 1, {"loss": Reducer.AVG, "accuracy": Reducer.MAX, "f1": Reducer.SUM}
        )
    with pytest.raises(MetricError, match=r"maps metric 'loss' to 'avg'"):
        reduce_validation_metrics(batches, 1, {"loss": "avg", "accuracy": Reducer.MAX})
    with pytest.raises(MetricError, match="must return a Reducer or a dict"):
        reduce_validation_metrics(batches, 1, "avg")


def test_validation_values_of_every_kind_become_floats():
    batches = [
        {
            "a": torch.tensor(1.0, requires_grad=True),
            "b": torch.tensor([2], dtype=torch.int64),
            "c": np.float32(1.5),
            "d": 4,
        },
        {
            "a": torch.tensor(3.0, dtype=torch.bfloat16),
            "b": torch.tensor([4], dtype=torch.int64),
            "c": np.array(2.5),
            "d": True,
        },
    ]
    result = reduce_validation_metrics(batches, 2, Reducer.AVG)
    assert result == {"a": 2.0, "b": 3.0, "c": 2.0, "d": 2.5}
    assert all(type(value) is float for value in result.values())


def test_array_metrics_reduce_over_all_elements_as_in_determined():
    batches = [{"per_class": np.array([1.0, 3.0])}, {"per_class": torch.tensor([5.0, 7.0])}]
    assert reduce_validation_metrics(batches, 2, Reducer.AVG) == {"per_class": 4.0}
    assert reduce_validation_metrics(batches, 2, Reducer.MAX) == {"per_class": 7.0}
    mismatched = batches + [{"per_class": [1.0, 2.0, 3.0]}]
    with pytest.raises(
        MetricError, match=r"metric 'per_class' .* at batch 2: its shape \(3,\) differs"
    ):
        reduce_validation_metrics(mismatched, 3)


class DeviceToHostCounter(TorchDispatchMode):
    """Counts tensor ops that read values back to the host or copy them between devices."""

    READBACK_OPS = {"aten::_local_scalar_dense", "aten::_to_copy", "aten::copy_"}

    def __init__(self) -> None:
        super().__init__()
        self.readbacks: list[str] = []
        self.stacks = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in self.READBACK_OPS:
            self.readbacks.append(name)
        if name in ("aten::stack", "aten::cat"):
            self.stacks += 1
        return func(*args, **(kwargs or {}))


def test_validation_reads_cpu_scalars_in_place_and_stacks_arrays_once_per_metric():
    """Scalars as in training (below); array-valued metrics are stacked once per metric."""
    batches = [{"loss": torch.tensor(float(i)), "acc": torch.tensor(0.5)} for i in range(50)]
    with DeviceToHostCounter() as counter:
        result = reduce_validation_metrics(batches, 50, Reducer.AVG)
    assert result == {"loss": pytest.approx(24.5), "acc": 0.5}
    assert counter.stacks == 0
    assert counter.readbacks == ["aten::_local_scalar_dense"] * 100
    arrays = [{"hist": torch.full((3,), float(i)), "acc": torch.tensor(0.5)} for i in range(50)]
    with DeviceToHostCounter() as counter:
        result = reduce_validation_metrics(arrays, 50, Reducer.AVG)
    assert result == {"hist": 24.5, "acc": 0.5}  # AVG over every element, as Determined
    assert counter.stacks == 1  # the array metric, once
    assert counter.readbacks.count("aten::_local_scalar_dense") == 50  # the scalars


def test_training_reads_cpu_scalars_in_place_without_stacking_or_copying():
    """CPU scalars are already on the host: one read each, no stack, no cast, no copy (a
    device's scalars are stacked and copied once per metric: the CUDA test below)."""
    batches = [{"loss": torch.tensor(float(i))} for i in range(50)]
    with DeviceToHostCounter() as counter:
        average = average_training_metrics(batches)
    assert average == {"loss": 24.5}
    assert counter.stacks == 0
    assert counter.readbacks == ["aten::_local_scalar_dense"] * 50


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_metrics_are_moved_to_the_host_once_per_metric():
    batches = [{"loss": torch.tensor(float(i), device="cuda")} for i in range(20)]
    with DeviceToHostCounter() as counter:
        validation = reduce_validation_metrics(batches, 20)
        training = average_training_metrics(batches)
    assert validation == {"loss": pytest.approx(9.5)} and training == {"loss": pytest.approx(9.5)}
    assert counter.stacks == 2
    assert len(counter.readbacks) <= 4


def test_a_string_validation_metric_names_the_metric_and_batch():
    batches = [{"loss": 1.0, "label": "cat"}]
    with pytest.raises(
        MetricError, match=r"evaluate_batch returned metric 'label' = 'cat' .* at batch 0"
    ):
        reduce_validation_metrics(batches, 1)


def test_inconsistent_metric_names_across_batches_name_the_batch():
    batches = [{"loss": 1.0}, {"loss": 2.0}, {"loss": 3.0, "extra": 1.0}]
    with pytest.raises(MetricError, match=r"batch 2 lacks \[\] and adds \['extra'\]"):
        reduce_validation_metrics(batches, 3)
    with pytest.raises(MetricError, match=r"must return a dict .* at batch 1"):
        reduce_validation_metrics([{"loss": 1.0}, 2.0], 2)


def test_batch_count_that_disagrees_with_the_metrics_is_refused():
    with pytest.raises(
        MetricError, match="told this rank evaluated 3 batches but was given metrics for 2"
    ):
        reduce_validation_metrics([{"m": 1.0}, {"m": 2.0}], 3)


def test_one_ranks_bad_metric_raises_on_every_rank_without_hanging():
    def rank_work(rank: int, allgather: Callable) -> dict:
        value = "oops" if rank == 1 else 1.0
        return reduce_validation_metrics([{"m": value}], 1, Reducer.AVG, allgather)

    rank0_error, rank1_error = run_on_ranks(2, rank_work)
    assert isinstance(rank1_error, MetricError)
    assert str(rank1_error).startswith("evaluate_batch returned metric 'm' = 'oops'")
    assert isinstance(rank0_error, MetricError)
    assert "rank 1 failed" in str(rank0_error) and "'oops'" in str(rank0_error)


def test_ranks_reporting_different_metric_names_are_refused():
    def rank_work(rank: int, allgather: Callable) -> dict:
        return reduce_validation_metrics(
            [{"loss" if rank == 0 else "lost": 1.0}], 1, Reducer.AVG, allgather
        )

    for outcome in run_on_ranks(2, rank_work):
        assert isinstance(outcome, MetricError)
        assert "rank 1 reported ['lost'] but rank 0 reported ['loss']" in str(outcome)


# ---------------------------------------------------------------------------------------------
# Training metrics
# ---------------------------------------------------------------------------------------------


def test_training_metrics_are_the_unweighted_batch_mean_averaged_across_ranks():
    rank_losses = {0: [1.0, 2.0, 6.0], 1: [3.0, 4.0, 8.0]}

    def batches(rank: int) -> list[dict[str, Any]]:
        return [{"loss": torch.tensor(loss), "lr": 0.1} for loss in rank_losses[rank]]

    def averages(rank: int, allgather: Callable) -> Any:
        return average_training_metrics(batches(rank), allgather, first_batch_idx=30)

    def for_callbacks(rank: int, allgather: Callable) -> Any:
        return callback_metrics.training_workload(batches(rank), {}, 33, 1, allgather, 2)

    for result in unwrap(run_on_ranks(2, averages)):
        assert result == {"loss": pytest.approx(4.0), "lr": pytest.approx(0.1)}
    for hook_averages, hook_batches in unwrap(run_on_ranks(2, for_callbacks)):
        # Callbacks get Determined's types: each batch's mean over the ranks, a 0-d float32
        # array for a tensor metric and a numpy float64 for a Python number.
        assert [batch["loss"].tolist() for batch in hook_batches] == [2.0, 3.0, 7.0]
        assert {(type(batch["loss"]), str(batch["loss"].dtype), batch["loss"].shape) for batch in hook_batches} == {
            (np.ndarray, "float32", ())
        }
        assert {type(batch["lr"]) for batch in hook_batches} == {np.float64}
        assert hook_averages == {"loss": 4.0, "lr": pytest.approx(0.1), "batches": 33, "epochs": 1}
        assert type(hook_averages["loss"]) is float


def test_training_metrics_skip_none_like_determined():
    batches = [{"loss": 1.0, "grad_norm": None}, {"loss": 3.0, "grad_norm": torch.tensor([5.0])}]
    assert average_training_metrics(batches, single_process_allgather) == {
        "loss": 2.0,
        "grad_norm": 5.0,
    }
    assert average_training_metrics([{"aux": None}]) == {"aux": None}


@pytest.mark.parametrize(
    "bad_value, described",
    [("high", "'high'"), (torch.ones(3), r"Tensor of shape \(3,\)"), ({"nested": 1}, "dict")],
)
def test_a_non_numeric_training_metric_names_the_metric_and_batch(bad_value: Any, described: str):
    batches = [{"loss": 1.0}, {"loss": bad_value}]
    with pytest.raises(
        MetricError, match=rf"train_batch returned metric 'loss' = .*{described}.* at batch 101"
    ):
        average_training_metrics(batches, first_batch_idx=100)


# ---------------------------------------------------------------------------------------------
# Reporting boundary
# ---------------------------------------------------------------------------------------------


def test_check_metrics_serialisable_converts_tensors_and_numpy_values():
    metrics = {
        "loss": torch.tensor(0.25),
        "confusion": torch.tensor([[1, 2], [3, 4]]),
        "count": np.int64(7),
        "hist": np.array([0.5, 1.5]),
        "note": "warmup",
        "flag": True,
        "missing": None,
        "nested": {"a": [np.float32(1.0), (2, 3)]},
    }
    plain = check_metrics_serialisable(metrics, origin="evaluate_batch")
    assert plain == {
        "loss": 0.25,
        "confusion": [[1, 2], [3, 4]],
        "count": 7,
        "hist": [0.5, 1.5],
        "note": "warmup",
        "flag": True,
        "missing": None,
        "nested": {"a": [1.0, [2, 3]]},
    }
    assert type(plain["loss"]) is float and type(plain["count"]) is int


@pytest.mark.parametrize(
    "value, where",
    [
        ({1, 2}, r"at 'bad'"),
        (object(), r"at 'bad'"),
        ({"inner": [1, b"raw"]}, r"at 'bad'\['inner'\]\[1\]"),
        (complex(1, 2), r"at 'bad'"),
    ],
)
def test_non_serialisable_metric_errors_name_origin_and_key(value: Any, where: str):
    with pytest.raises(
        MetricError,
        match=rf"^evaluate_batch reported metric 'bad' .*{where}, which cannot be written as JSON",
    ):
        check_metrics_serialisable({"fine": 1.0, "bad": value}, origin="evaluate_batch")


def test_non_string_metric_names_are_refused():
    with pytest.raises(MetricError, match=r"on_validation_end reported a metric named 3 \(a int\)"):
        check_metrics_serialisable({3: 1.0}, origin="on_validation_end")
    with pytest.raises(MetricError, match="must produce a dict"):
        check_metrics_serialisable([1.0], origin="evaluate_full_dataset")
