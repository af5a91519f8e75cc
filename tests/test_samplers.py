"""Tests for hookdet.data.samplers: shuffle, repeat, shard and skip, alone and chained."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

from hookdet.data.samplers import (
    DistributedBatchSampler,
    DistributedSampler,
    RepeatBatchSampler,
    RepeatSampler,
    ReproducibleShuffleBatchSampler,
    ReproducibleShuffleSampler,
    SkipBatchSampler,
    SkipSampler,
    set_sampler_epoch,
    shard_length,
)


def global_rng_states() -> tuple:
    """Snapshot of Python's, numpy's and torch's global generators, comparable with ``==``."""
    numpy_state = np.random.get_state()
    return (
        random.getstate(),
        (numpy_state[0], numpy_state[1].tobytes(), *numpy_state[2:]),
        torch.get_rng_state().tolist(),
    )


def batches_of(size: int, batch_size: int) -> BatchSampler:
    return BatchSampler(SequentialSampler(range(size)), batch_size, drop_last=False)


class TestReproducibleShuffleSampler:
    def test_same_seed_same_order_and_a_permutation(self) -> None:
        first = list(ReproducibleShuffleSampler(SequentialSampler(range(50)), seed=7))
        second = list(ReproducibleShuffleSampler(SequentialSampler(range(50)), seed=7))
        assert first == second
        assert sorted(first) == list(range(50))
        assert first != list(range(50))

    def test_each_pass_is_a_new_epoch_and_set_epoch_replays_it(self) -> None:
        sampler = ReproducibleShuffleSampler(SequentialSampler(range(50)), seed=7)
        passes = [list(sampler) for _ in range(3)]
        assert passes[0] != passes[1] != passes[2]

        replay = ReproducibleShuffleSampler(SequentialSampler(range(50)), seed=7)
        replay.set_epoch(2)
        assert list(replay) == passes[2]
        assert replay.epoch == 3

    def test_different_seeds_give_different_orders(self) -> None:
        orders = {
            tuple(ReproducibleShuffleSampler(range(50), seed=seed)) for seed in range(5)
        }
        assert len(orders) == 5

    def test_shuffles_the_wrapped_indices_not_positions(self) -> None:
        wrapped = [10, 20, 30, 40]
        assert sorted(ReproducibleShuffleSampler(wrapped, seed=1)) == wrapped

    def test_never_touches_global_rngs(self) -> None:
        before = global_rng_states()
        sampler = ReproducibleShuffleSampler(SequentialSampler(range(100)), seed=3)
        for _ in range(3):
            list(sampler)
        assert global_rng_states() == before

    @pytest.mark.parametrize("seed, error", [(-1, ValueError), (1.5, TypeError), ("3", TypeError)])
    def test_bad_seed_names_class_and_argument(self, seed: object, error: type) -> None:
        with pytest.raises(error, match="ReproducibleShuffleSampler: seed"):
            ReproducibleShuffleSampler(range(3), seed=seed)  # type: ignore[arg-type]

    def test_len_is_wrapped_len(self) -> None:
        assert len(ReproducibleShuffleSampler(range(13), seed=0)) == 13


class TestReproducibleShuffleBatchSampler:
    def test_shuffles_batch_order_but_keeps_batch_contents(self) -> None:
        sampler = ReproducibleShuffleBatchSampler(batches_of(10, 2), seed=777)
        first, second = list(sampler), list(sampler)
        straight = list(batches_of(10, 2))
        assert sorted(first) == straight
        assert first != straight
        assert first != second
        assert len(sampler) == 5

    def test_same_seed_and_epoch_same_order(self) -> None:
        a = ReproducibleShuffleBatchSampler(batches_of(20, 3), seed=4)
        b = ReproducibleShuffleBatchSampler(batches_of(20, 3), seed=4)
        b.set_epoch(1)
        list(a)
        assert list(a) == list(b)


class TestRepeat:
    def test_repeat_batch_sampler_yields_pass_after_pass_with_new_shuffle(self) -> None:
        base = ReproducibleShuffleBatchSampler(batches_of(6, 2), seed=5)
        repeated = RepeatBatchSampler(base)
        assert len(repeated) == 3
        stream = list(itertools.islice(repeated, 9))

        expected = []
        for epoch in range(3):
            reference = ReproducibleShuffleBatchSampler(batches_of(6, 2), seed=5)
            reference.set_epoch(epoch)
            expected.extend(reference)
        assert stream == expected

    def test_repeat_sampler_advances_a_shuffle_nested_in_a_batch_sampler(self) -> None:
        shuffle = ReproducibleShuffleSampler(range(4), seed=9)
        stream = list(itertools.islice(RepeatSampler(shuffle, start_epoch=2), 8))
        epoch2, epoch3 = (ReproducibleShuffleSampler(range(4), seed=9) for _ in range(2))
        epoch2.set_epoch(2)
        epoch3.set_epoch(3)
        assert stream == list(epoch2) + list(epoch3)

    def test_repeat_is_independent_of_earlier_iteration(self) -> None:
        shuffle = ReproducibleShuffleSampler(range(8), seed=1)
        list(shuffle)
        list(shuffle)
        fresh = ReproducibleShuffleSampler(range(8), seed=1)
        assert list(itertools.islice(RepeatSampler(shuffle), 16)) == list(
            itertools.islice(RepeatSampler(fresh), 16)
        )

    @pytest.mark.parametrize("repeat_class", [RepeatSampler, RepeatBatchSampler])
    def test_empty_sampler_raises_instead_of_spinning(self, repeat_class: type) -> None:
        with pytest.raises(ValueError, match=f"{repeat_class.__name__}: .*yielded nothing"):
            next(iter(repeat_class([])))

    def test_set_sampler_epoch_reaches_torch_distributed_sampler(self) -> None:
        torch_sampler = torch.utils.data.DistributedSampler(
            range(10), num_replicas=1, rank=0, shuffle=True, seed=0
        )
        chain = SkipBatchSampler(BatchSampler(torch_sampler, 2, False), 0)
        set_sampler_epoch(chain, 4)
        assert torch_sampler.epoch == 4


DETERMINED_19_RECORDS_4_RANKS = [
    [[0, 1], [8, 9], [16, 17]],
    [[2, 3], [10, 11], [18]],
    [[4, 5], [12, 13]],
    [[6, 7], [14, 15]],
]


class TestDistributed:
    def test_matches_determined_on_an_uneven_tail(self) -> None:
        for rank, expected in enumerate(DETERMINED_19_RECORDS_4_RANKS):
            shard = DistributedBatchSampler(batches_of(19, 2), num_workers=4, rank=rank)
            assert list(shard) == expected
            assert len(shard) == len(expected), "Determined's len(): what this rank really gets"
            assert shard_length(10, 4, rank) == len(expected)

    @pytest.mark.parametrize("num_batches", [8, 9, 10, 11, 1, 3])
    @pytest.mark.parametrize("num_workers", [1, 2, 4])
    def test_every_batch_exactly_once_across_ranks(self, num_batches: int, num_workers: int) -> None:
        straight = list(batches_of(num_batches * 2, 2))
        shards = [
            list(DistributedBatchSampler(batches_of(num_batches * 2, 2), num_workers, rank))
            for rank in range(num_workers)
        ]
        seen = sorted(batch for shard in shards for batch in shard)
        assert seen == straight
        for rank, shard in enumerate(shards):
            assert shard == straight[rank::num_workers]
            assert len(shard) == shard_length(num_batches, num_workers, rank)

    @pytest.mark.parametrize("size", [12, 13, 14, 15])
    def test_sample_level_sharding_covers_each_index_once(self, size: int) -> None:
        shards = [list(DistributedSampler(range(size), 4, rank)) for rank in range(4)]
        assert sorted(itertools.chain.from_iterable(shards)) == list(range(size))
        assert [len(DistributedSampler(range(size), 4, rank)) for rank in range(4)] == [
            len(shard) for shard in shards
        ]

    def test_sharding_an_endless_stream_never_runs_dry(self) -> None:
        shards = [
            list(itertools.islice(DistributedBatchSampler(RepeatBatchSampler(batches_of(5, 1)),
                                                          2, rank), 7))
            for rank in range(2)
        ]
        assert [len(shard) for shard in shards] == [7, 7]
        assert shards[0][:3] == [[0], [2], [4]]
        assert shards[1][:3] == [[1], [3], [0]]

    @pytest.mark.parametrize(
        "num_workers, rank, message",
        [(2, 2, "rank must be less than num_workers"), (0, 0, "num_workers must be positive"),
         (2, -1, "rank must be >= 0")],
    )
    def test_bad_shard_arguments(self, num_workers: int, rank: int, message: str) -> None:
        with pytest.raises(ValueError, match=f"DistributedBatchSampler: {message}"):
            DistributedBatchSampler(batches_of(4, 2), num_workers, rank)


class TestSkip:
    @pytest.mark.parametrize("skip", [0, 1, 4, 5, 9])
    def test_skip_batch_sampler_drops_the_first_batches(self, skip: int) -> None:
        straight = list(batches_of(10, 2))
        skipped = SkipBatchSampler(batches_of(10, 2), skip)
        assert list(skipped) == straight[skip:]
        assert len(skipped) == 5, "length is the wrapped length: skip sits after a repeat"

    def test_skip_sampler_drops_indices(self) -> None:
        assert list(SkipSampler(range(6), 4)) == [4, 5]
        assert len(SkipSampler(range(6), 4)) == 6

    def test_negative_skip_is_refused(self) -> None:
        with pytest.raises(ValueError, match="SkipBatchSampler: skip must be >= 0"):
            SkipBatchSampler(batches_of(4, 2), -1)


class TestChain:
    @staticmethod
    def rank_stream(num_workers: int, rank: int, skip: int, count: int) -> list:
        """``count`` batches of shuffle(seed 11) -> repeat -> shard -> skip over 7 records, batch 2."""
        chain = DistributedBatchSampler(
            RepeatBatchSampler(BatchSampler(ReproducibleShuffleSampler(range(7), seed=11), 2, False)),
            num_workers,
            rank,
        )
        return list(itertools.islice(SkipBatchSampler(chain, skip), count))

    @pytest.mark.parametrize("num_workers", [1, 2, 3])
    @pytest.mark.parametrize("skip", [0, 1, 3, 4, 5, 8, 11])
    def test_repeat_then_skip_equals_dropping_the_first_batches(
        self, skip: int, num_workers: int
    ) -> None:
        """One pass is 4 global batches, so the skips land before, on and after epoch boundaries."""
        for rank in range(num_workers):
            straight = self.rank_stream(num_workers, rank, skip=0, count=skip + 10)
            assert self.rank_stream(num_workers, rank, skip=skip, count=10) == straight[skip:]

    def test_consecutive_passes_in_the_stream_are_different_shuffles(self) -> None:
        stream = self.rank_stream(1, 0, skip=0, count=8)
        first_pass, second_pass = stream[:4], stream[4:]
        assert first_pass != second_pass
        for one_pass in (first_pass, second_pass):
            assert sorted(itertools.chain.from_iterable(one_pass)) == list(range(7))
