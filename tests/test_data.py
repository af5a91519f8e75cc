"""Tests for hookdet.data.loader: the DataLoader chain, the loop's adapters, to_device and data_length."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import random
from typing import Any, List

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from hookdet.data.batch_moving import batch_mover, data_length, to_device
from hookdet.data.loader import DataLoader, DatasetReproducibilityError
from hookdet.data.loader_adapters import PlainLoaderAdapter, adapt_training_loader, adapt_validation_loader
from hookdet.data.samplers import ReproducibleShuffleSampler, shard_length


def global_rng_states() -> tuple:
    """Snapshot of Python's, numpy's and torch's global generators, comparable with ``==``."""
    numpy_state = np.random.get_state()
    return (
        random.getstate(),
        (numpy_state[0], numpy_state[1].tobytes(), *numpy_state[2:]),
        torch.get_rng_state().tolist(),
    )


class CountingDataset(Dataset):
    """Records ``i`` at index ``i`` and counts how many records were actually loaded."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.loads = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        self.loads += 1
        return torch.tensor(index)


def records(batches: Any) -> List[List[int]]:
    """The record ids of each batch, as lists of ints."""
    return [batch.tolist() for batch in batches]


def take(loader: Any, count: int) -> List[List[int]]:
    return records(itertools.islice(iter(loader), count))


class TestDataLoaderConstruction:
    def test_len_and_epoch_length(self) -> None:
        loader = DataLoader(CountingDataset(10), batch_size=3)
        assert len(loader) == 4
        assert loader.epoch_length() == 4
        assert loader.epoch_length(num_replicas=3) == 2
        assert len(DataLoader(CountingDataset(10), batch_size=3, drop_last=True)) == 3

    def test_construction_loads_no_data(self) -> None:
        dataset = CountingDataset(10)
        loader = DataLoader(dataset, batch_size=3, shuffle=True)
        loader.get_data_loader(repeat=True, skip=5, num_replicas=2, rank=1, seed=3)
        assert dataset.loads == 0

    def test_unshuffled_matches_torch_dataloader(self) -> None:
        dataset = TensorDataset(torch.arange(11.0), torch.arange(11) * 2)
        ours = list(DataLoader(dataset, batch_size=4))
        theirs = list(torch.utils.data.DataLoader(dataset, batch_size=4))
        assert len(ours) == len(theirs) == 3
        for (our_x, our_y), (their_x, their_y) in zip(ours, theirs):
            assert torch.equal(our_x, their_x) and torch.equal(our_y, their_y)

    def test_iterating_directly_reshuffles_each_pass_like_torch(self) -> None:
        loader = DataLoader(CountingDataset(12), batch_size=4, shuffle=True)
        first, second = records(loader), records(loader)
        assert first != second
        for one_pass in (first, second):
            assert sorted(itertools.chain.from_iterable(one_pass)) == list(range(12))
        fresh = DataLoader(CountingDataset(12), batch_size=4, shuffle=True)
        assert records(fresh) == first

    def test_user_batch_sampler_is_used_as_given(self) -> None:
        batch_sampler = [[3, 1], [0], [2, 4]]
        loader = DataLoader(CountingDataset(5), batch_sampler=batch_sampler)
        assert loader.batch_size is None
        assert records(loader) == batch_sampler
        assert len(loader) == 3

    @pytest.mark.parametrize(
        "kwargs, message",
        [
            ({"shuffle": True, "sampler": [0, 1]}, "sampler and shuffle=True"),
            ({"batch_sampler": [[0]], "batch_size": 2}, "batch_sampler is mutually exclusive"),
            ({"batch_sampler": [[0]], "drop_last": True}, "batch_sampler is mutually exclusive"),
            ({"batch_size": None}, "batch_size=None needs a batch_sampler"),
            ({"num_workers": -1}, "num_workers must be an int >= 0"),
            ({"timeout": -1}, "timeout must be >= 0"),
            ({"persistent_workers": True}, "persistent_workers=True needs num_workers > 0"),
            ({"prefetch_factor": 2}, "prefetch_factor needs num_workers > 0"),
        ],
    )
    def test_bad_arguments_name_the_culprit(self, kwargs: dict, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            DataLoader(CountingDataset(4), **kwargs)

    def test_iterable_dataset_is_refused_with_the_way_out(self) -> None:
        class Stream(IterableDataset):
            def __iter__(self):  # type: ignore[no-untyped-def]
                return iter(range(3))

        with pytest.raises(ValueError, match="IterableDataset.*disable_dataset_reproducibility"):
            DataLoader(Stream())

    @pytest.mark.parametrize(
        "kwargs, culprit",
        [({"skip": -1}, "skip"), ({"seed": -2}, "seed"), ({"num_replicas": 2, "rank": 2}, "rank")],
    )
    def test_bad_get_data_loader_arguments(self, kwargs: dict, culprit: str) -> None:
        with pytest.raises(ValueError, match=f"DataLoader.get_data_loader: {culprit}"):
            DataLoader(CountingDataset(4)).get_data_loader(**kwargs)


class TestShuffleDeterminism:
    def test_same_seed_same_order_different_seed_different_order(self) -> None:
        loader = DataLoader(CountingDataset(40), batch_size=4, shuffle=True)
        first = take(loader.get_data_loader(repeat=True, seed=5), 10)
        again = take(loader.get_data_loader(repeat=True, seed=5), 10)
        other = take(loader.get_data_loader(repeat=True, seed=6), 10)
        assert first == again
        assert first != other
        assert sorted(itertools.chain.from_iterable(first)) == list(range(40))

    def test_consecutive_epochs_have_different_orders(self) -> None:
        loader = DataLoader(CountingDataset(12), batch_size=3, shuffle=True)
        stream = take(loader.get_data_loader(repeat=True, seed=1), 12)
        epochs = [stream[0:4], stream[4:8], stream[8:12]]
        assert epochs[0] != epochs[1] != epochs[2]
        for epoch in epochs:
            assert sorted(itertools.chain.from_iterable(epoch)) == list(range(12))

    def test_global_rngs_untouched_by_building_and_iterating(self) -> None:
        before = global_rng_states()
        loader = DataLoader(CountingDataset(20), batch_size=3, shuffle=True)
        take(loader.get_data_loader(repeat=True, skip=4, num_replicas=2, rank=1, seed=9), 15)
        list(adapt_validation_loader(loader, num_replicas=2, rank=0, seed=9))
        list(loader)
        assert global_rng_states() == before

    def test_global_rngs_untouched_with_worker_processes(self) -> None:
        before = global_rng_states()
        loader = DataLoader(CountingDataset(12), batch_size=3, shuffle=True, num_workers=1)
        in_workers = take(loader.get_data_loader(repeat=True, seed=2), 6)
        assert global_rng_states() == before
        in_process = DataLoader(CountingDataset(12), batch_size=3, shuffle=True)
        assert in_workers == take(in_process.get_data_loader(repeat=True, seed=2), 6)

    def test_order_does_not_depend_on_the_global_seed(self) -> None:
        loader = DataLoader(CountingDataset(30), batch_size=5, shuffle=True)
        torch.manual_seed(0)
        first = take(loader.get_data_loader(repeat=True, seed=4), 8)
        torch.manual_seed(123)
        np.random.seed(123)
        assert take(loader.get_data_loader(repeat=True, seed=4), 8) == first


class TestResume:
    @pytest.mark.parametrize("shuffle", [False, True])
    @pytest.mark.parametrize("num_replicas", [1, 2, 3])
    @pytest.mark.parametrize("skip", [0, 1, 2, 3, 4, 5, 7, 9, 13])
    def test_skip_equals_dropping_the_first_batches_of_this_rank(
        self, skip: int, num_replicas: int, shuffle: bool
    ) -> None:
        """10 records in batches of 3: 4 batches per pass, so skips cross epoch boundaries."""
        loader = DataLoader(CountingDataset(10), batch_size=3, shuffle=shuffle)
        for rank in range(num_replicas):
            straight = take(
                loader.get_data_loader(repeat=True, num_replicas=num_replicas, rank=rank, seed=8),
                skip + 6,
            )
            resumed = loader.get_data_loader(
                repeat=True, skip=skip, num_replicas=num_replicas, rank=rank, seed=8
            )
            assert take(resumed, 6) == straight[skip:]
            assert len(resumed) == shard_length(len(loader), num_replicas, rank)  # Determined's len

    @pytest.mark.parametrize("skip", [0, 3, 4, 6, 11])
    def test_whole_epoch_fast_forward_equals_the_literal_chain(self, skip: int) -> None:
        """A user sampler takes the literal repeat -> shard -> skip path; shuffle=True skips whole
        epochs arithmetically. Given the same shuffle they must yield the same batches."""
        ours = DataLoader(CountingDataset(10), batch_size=3, shuffle=True)
        literal = DataLoader(
            CountingDataset(10),
            batch_size=3,
            sampler=ReproducibleShuffleSampler(range(10), seed=8),
        )
        for rank in range(2):
            fast = ours.get_data_loader(repeat=True, skip=skip, num_replicas=2, rank=rank, seed=8)
            slow = literal.get_data_loader(
                repeat=True, skip=skip, num_replicas=2, rank=rank, seed=8
            )
            assert take(fast, 7) == take(slow, 7)

    def test_skipping_loads_no_skipped_data(self) -> None:
        dataset = CountingDataset(10)
        loader = DataLoader(dataset, batch_size=2, shuffle=True)
        resumed = loader.get_data_loader(repeat=True, skip=23, seed=1)
        next(iter(resumed))
        assert dataset.loads == 2


class TestValidation:
    @pytest.mark.parametrize("size", [12, 13, 14, 15, 5])
    @pytest.mark.parametrize("num_replicas", [1, 2, 4])
    def test_every_record_exactly_once_across_ranks(self, size: int, num_replicas: int) -> None:
        loader = DataLoader(CountingDataset(size), batch_size=3, shuffle=True)
        shards = [
            adapt_validation_loader(loader, num_replicas=num_replicas, rank=rank, seed=2)
            for rank in range(num_replicas)
        ]
        seen = sorted(itertools.chain.from_iterable(batch.tolist() for s in shards for batch in s))
        assert seen == list(range(size))
        assert [len(shard) for shard in shards] == [  # Determined's len: what each rank gets
            shard_length(len(loader), num_replicas, rank) for rank in range(num_replicas)
        ]

    def test_every_validation_pass_has_the_same_order(self) -> None:
        loader = DataLoader(CountingDataset(20), batch_size=3, shuffle=True)
        validation = adapt_validation_loader(loader, num_replicas=2, rank=1, seed=6)
        first = records(validation)
        assert records(validation) == first
        rebuilt = adapt_validation_loader(loader, num_replicas=2, rank=1, seed=6)
        assert records(rebuilt) == first
        unshuffled = DataLoader(CountingDataset(20), batch_size=3)
        assert first != records(adapt_validation_loader(unshuffled, num_replicas=2, rank=1, seed=6))


class TestPlainTorchLoader:
    def test_training_refuses_a_plain_loader_naming_method_and_opt_out(self) -> None:
        plain = torch.utils.data.DataLoader(CountingDataset(4), batch_size=2)
        with pytest.raises(DatasetReproducibilityError) as raised:
            adapt_training_loader(plain, disable_checks=False)
        message = str(raised.value)
        assert "build_training_data_loader()" in message
        assert "torch.utils.data.dataloader.DataLoader" in message
        assert "context.experimental.disable_dataset_reproducibility_checks()" in message

    def test_validation_refuses_a_plain_loader_naming_its_method(self) -> None:
        plain = torch.utils.data.DataLoader(CountingDataset(4), batch_size=2)
        with pytest.raises(DatasetReproducibilityError, match="build_validation_data_loader"):
            adapt_validation_loader(plain, disable_checks=False)

    def test_opt_out_repeats_epoch_after_epoch_and_skips(self) -> None:
        plain = torch.utils.data.DataLoader(CountingDataset(5), batch_size=2)
        one_epoch = [[0, 1], [2, 3], [4]]
        adapted = adapt_training_loader(plain, disable_checks=True)
        assert isinstance(adapted, PlainLoaderAdapter)
        assert len(adapted) == 3
        assert take(adapted, 8) == (one_epoch * 3)[:8]
        for skip in (1, 3, 4, 7):
            resumed = adapt_training_loader(plain, disable_checks=True, skip=skip)
            assert take(resumed, 5) == (one_epoch * 5)[skip : skip + 5]

    def test_opt_out_passes_the_epoch_to_a_distributed_sampler(self) -> None:
        def plain_loader() -> torch.utils.data.DataLoader:
            sampler = torch.utils.data.DistributedSampler(
                CountingDataset(8), num_replicas=2, rank=0, shuffle=True, seed=3
            )
            return torch.utils.data.DataLoader(CountingDataset(8), batch_size=2, sampler=sampler)

        stream = take(adapt_training_loader(plain_loader(), disable_checks=True), 6)
        reference = plain_loader()
        expected = []
        for epoch in range(3):
            reference.sampler.set_epoch(epoch)  # type: ignore[union-attr]
            expected.extend(records(reference))
        assert stream == expected
        resumed = adapt_training_loader(plain_loader(), disable_checks=True, skip=3)
        assert take(resumed, 3) == expected[3:6]

    def test_opt_out_returns_a_plain_validation_loader_unchanged(self) -> None:
        plain = torch.utils.data.DataLoader(CountingDataset(4), batch_size=2)
        assert adapt_validation_loader(plain, disable_checks=True) is plain

    def test_opt_out_still_needs_something_iterable(self) -> None:
        with pytest.raises(TypeError, match="build_training_data_loader.*not iterable"):
            adapt_training_loader(42, disable_checks=True)

    def test_opt_out_of_an_empty_loader_fails_instead_of_spinning(self) -> None:
        plain = torch.utils.data.DataLoader(CountingDataset(0), batch_size=2)
        with pytest.raises(ValueError, match="yielded no batches"):
            take(adapt_training_loader(plain, disable_checks=True), 1)


Pair = collections.namedtuple("Pair", ["inputs", "labels"])


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    name: str


class MovesItself:
    """A custom batch object with its own ``.to``, as Determined supports."""

    def __init__(self) -> None:
        self.moved_to: Any = None

    def to(self, device: torch.device) -> "MovesItself":
        self.moved_to = device
        return self


class TestToDevice:
    """The ``meta`` device stands in for an accelerator: it really changes a tensor's device."""

    def test_nested_structure_is_moved_and_kept(self) -> None:
        custom = MovesItself()
        batch = {
            "pair": Pair(torch.ones(2, 3), [torch.zeros(2), (torch.arange(2), "label")]),
            "ordered": collections.OrderedDict(a=torch.ones(1)),
            "numbers": np.arange(4, dtype=np.float32),
            "names": np.array(["a", "b"]),
            "sample": Sample(torch.ones(2), "x"),
            "scalars": [1, 2.5, True, None, "text", b"raw", np.float32(3)],
            "custom": custom,
        }
        moved = to_device(batch, "meta")

        assert isinstance(moved["pair"], Pair)
        assert moved["pair"].inputs.device.type == "meta"
        assert moved["pair"].labels[0].device.type == "meta"
        assert isinstance(moved["pair"].labels[1], tuple)
        assert moved["pair"].labels[1][0].device.type == "meta"
        assert moved["pair"].labels[1][1] == "label"
        assert type(moved["ordered"]) is collections.OrderedDict
        assert moved["ordered"]["a"].device.type == "meta"
        assert isinstance(moved["numbers"], torch.Tensor)
        assert moved["numbers"].device.type == "meta" and moved["numbers"].dtype == torch.float32
        assert moved["names"] is batch["names"]
        assert isinstance(moved["sample"], Sample) and moved["sample"].image.device.type == "meta"
        assert moved["sample"].name == "x"
        assert moved["scalars"] == batch["scalars"]
        assert moved["custom"] is custom and custom.moved_to == torch.device("meta")
        assert batch["pair"].inputs.device.type == "cpu", "the input batch is not modified"

    def test_cpu_target_keeps_values_and_converts_numpy(self) -> None:
        batch = [torch.arange(3), np.array([[1, 2]], dtype=np.int64), (np.array([True]),)]
        moved = to_device(batch, torch.device("cpu"))
        assert torch.equal(moved[0], torch.arange(3))
        assert torch.equal(moved[1], torch.tensor([[1, 2]]))
        assert torch.equal(moved[2][0], torch.tensor([True]))

    def test_odd_numpy_layouts_are_converted(self) -> None:
        reversed_view = np.arange(4, dtype=np.float64)[::-1]
        big_endian = np.arange(3, dtype=">i4")
        assert to_device(reversed_view, "cpu").tolist() == [3.0, 2.0, 1.0, 0.0]
        assert to_device(big_endian, "cpu").tolist() == [0, 1, 2]

    def test_defaultdict_keeps_its_factory(self) -> None:
        batch = collections.defaultdict(list, x=torch.ones(1))
        moved = to_device(batch, "meta")
        assert isinstance(moved, collections.defaultdict) and moved.default_factory is list

    def test_unknown_types_warn_once_per_type_with_a_shared_set(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        class Opaque:
            pass

        warned: set = set()
        with caplog.at_level(logging.WARNING, logger="hookdet.data.loader"):
            to_device([Opaque(), Opaque()], "cpu", warned)
            to_device({"o": Opaque()}, "cpu", warned)
            to_device(["plain strings are expected", 3], "cpu", warned)
        messages = [record.getMessage() for record in caplog.records]
        assert len(messages) == 1
        assert "Opaque" in messages[0]
        assert warned == {Opaque}


class TestBatchMover:
    """``batch_mover``: the loop's one mover per run, with a shortcut for batches already in place."""

    def test_cpu_batch_of_cpu_tensors_is_returned_as_is(self) -> None:
        mover = batch_mover("cpu")
        pair = (torch.ones(2), torch.nn.Parameter(torch.zeros(1)))
        listed = [torch.ones(2)]
        assert mover(pair) is pair
        assert mover(listed) is listed

    def test_cpu_batch_with_other_items_is_moved_item_by_item(self) -> None:
        mover = batch_mover(torch.device("cpu"))
        batch = (torch.ones(2), np.array([1.0, 2.0]), 3)
        moved = mover(batch)
        assert moved is not batch and isinstance(moved, tuple)
        assert moved[0] is batch[0]
        assert torch.equal(moved[1], torch.tensor([1.0, 2.0], dtype=torch.float64))
        assert moved[2] == 3

    def test_cpu_batch_holding_a_tensor_elsewhere_is_copied_to_the_cpu(self) -> None:
        with pytest.raises(NotImplementedError, match="meta"):  # the copy is tried: meta has no data
            batch_mover("cpu")([torch.ones(1), torch.ones(2, device="meta")])

    def test_device_batch_is_returned_as_is_and_a_host_batch_is_moved(self) -> None:
        mover = batch_mover("meta")
        on_device = (torch.ones(2, device="meta"), torch.zeros(1, device="meta"))
        assert mover(on_device) is on_device
        moved = mover([torch.ones(2), torch.ones(2, device="meta")])
        assert [tensor.device.type for tensor in moved] == ["meta", "meta"]


class TestDataLength:
    @pytest.mark.parametrize(
        "batch, expected",
        [
            (torch.zeros(5, 3), 5),
            (np.zeros((4, 2)), 4),
            ({"x": torch.zeros(6), "y": torch.zeros(6)}, 6),
            ([torch.zeros(3), torch.zeros(3)], 3),
            ((np.zeros(2),), 2),
            (Pair(torch.zeros(7, 1), torch.zeros(7)), 7),
            ({"nested": [[torch.zeros(8)]]}, 8),
            ({"text": ["a", "b", "c"], "x": torch.zeros(3)}, 3),
            ([{"x": torch.zeros(9)}], 9),
        ],
    )
    def test_batch_lengths(self, batch: Any, expected: int) -> None:
        assert data_length(batch) == expected

    @pytest.mark.parametrize("empty", [{}, [], ()])
    def test_empty_containers_raise_value_error(self, empty: Any) -> None:
        with pytest.raises(ValueError, match=f"empty {type(empty).__name__}"):
            data_length(empty)

    def test_unsupported_type_names_the_type(self) -> None:
        with pytest.raises(TypeError, match="batch, a int"):
            data_length(0)

    def test_error_says_where_in_the_batch(self) -> None:
        with pytest.raises(TypeError, match=r"batch\['count'\], a int"):
            data_length({"count": 3, "x": torch.zeros(2)})

    def test_zero_dimensional_tensor_has_no_batch_dimension(self) -> None:
        with pytest.raises(TypeError, match="0-d Tensor"):
            data_length(torch.tensor(1.0))
