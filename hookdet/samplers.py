"""Composable samplers that make data order reproducible, resumable and shardable.

These are Determined's seven sampler families (``determined.pytorch.samplers``), with the same
class names, constructor arguments and chaining rules:

* ``ReproducibleShuffleSampler`` / ``ReproducibleShuffleBatchSampler`` shuffle what they wrap.
* ``RepeatSampler`` / ``RepeatBatchSampler`` turn a finite sampler into an endless one.
* ``DistributedSampler`` / ``DistributedBatchSampler`` keep one rank's shard.
* ``SkipSampler`` / ``SkipBatchSampler`` drop the first ``skip`` items (resume).

Chain them in the order shuffle → repeat → distribute → skip, as Determined documents: skipping
before shuffling breaks reproducibility, and shuffling after repeating never ends.

Where hookdet differs from its reference, on purpose:

* A shuffle is a pure function of ``(seed, epoch)``. Determined keeps one ``RandomState`` that
  advances with every pass, so the order of pass *k* depends on how often the sampler was iterated
  before; here each pass draws from a private generator built from ``(seed, epoch)``, and the
  global ``random``/``numpy``/``torch`` generators are never touched (dropout and augmentation
  draw from the global torch RNG, so a sampler that consumed it would break bit-exact resume).
  Iterating a shuffle sampler directly still gives a new order each time (its epoch advances by
  one per pass), and the repeat samplers set the epoch explicitly before each pass.
* The repeat samplers refuse to spin forever on a sampler that yields nothing.
* Bad arguments (negative skip, rank outside ``[0, num_workers)``, non-integer seed) raise one
  ``ValueError``/``TypeError`` naming the class and the argument.

Uneven shards. Sharding is round-robin: rank ``r`` of ``N`` keeps items ``r, r+N, r+2N, ...``.
When the wrapped length ``L`` is not a multiple of ``N``, ranks ``>= L % N`` get one item fewer
per pass. As in Determined, ``len()`` reports ``ceil(L / N)`` on *every* rank, so all ranks agree on
the epoch length and fire epoch-boundary work together. What actually happens:

* Training wraps a *repeated* sampler before sharding, so the stream is endless and every rank
  always has a next batch: no rank ever runs dry, collective ops never hang. The price (also
  Determined's) is that a rank-local "epoch" of ``ceil(L / N)`` batches covers ``N*ceil(L/N)``
  global batches, slightly more than one pass, so later epochs start mid-pass.
* Validation is not repeated: every batch is seen exactly once across ranks and the short ranks
  finish one batch early. A loop must therefore not run a collective op per validation batch;
  it gathers results once, after every rank's loop has ended (Determined does the same).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator, List

import numpy as np
import torch

__all__ = [
    "ReproducibleShuffleSampler",
    "ReproducibleShuffleBatchSampler",
    "RepeatSampler",
    "RepeatBatchSampler",
    "DistributedSampler",
    "DistributedBatchSampler",
    "SkipSampler",
    "SkipBatchSampler",
    "set_sampler_epoch",
    "shard_length",
]


def _require_non_negative_int(owner: str, argument: str, value: Any) -> int:
    """Return ``value`` if it is an int >= 0, else raise naming ``owner`` and ``argument``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}: {argument} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{owner}: {argument} must be >= 0, got {value}")
    return int(value)


def _check_shard(owner: str, num_workers: Any, rank: Any) -> None:
    """Raise one clear error unless ``0 <= rank < num_workers``."""
    num_workers = _require_non_negative_int(owner, "num_workers", num_workers)
    rank = _require_non_negative_int(owner, "rank", rank)
    if num_workers == 0:
        raise ValueError(f"{owner}: num_workers must be positive, got 0")
    if rank >= num_workers:
        raise ValueError(f"{owner}: rank must be less than num_workers, got rank={rank} "
                         f"with num_workers={num_workers}")


def shard_length(total: int, num_workers: int, rank: int) -> int:
    """How many of ``total`` items round-robin sharding really gives ``rank`` (not ``len()``).

    ``len()`` of the distributed samplers is ``ceil(total / num_workers)`` on every rank; this is
    the true count, one fewer on ranks ``>= total % num_workers``. A validation loop can use it to
    know, without iterating, which ranks finish early.
    """
    _check_shard("shard_length", num_workers, rank)
    full_rounds, remainder = divmod(total, num_workers)
    return full_rounds + (1 if rank < remainder else 0)


def _equal_shard_len(wrapped_len: int, num_workers: int) -> int:
    """Determined's per-rank length: ``ceil(wrapped_len / num_workers)`` on every rank."""
    return -(-wrapped_len // num_workers)


def set_sampler_epoch(sampler: Any, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` on every sampler in a chain that has one.

    The chain is followed through the ``batch_sampler`` and ``sampler`` attributes, which every
    sampler here and ``torch.utils.data.BatchSampler`` expose; a user's
    ``torch.utils.data.DistributedSampler`` in the chain is advanced too. Anything without
    ``set_epoch`` (sequential samplers, plain lists) is left alone.
    """
    seen: set = set()
    pending = [sampler]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        setter = getattr(current, "set_epoch", None)
        if callable(setter):
            setter(epoch)
        for attribute in ("batch_sampler", "sampler"):
            pending.append(getattr(current, attribute, None))


def _permutation(seed: int, epoch: int, size: int) -> List[int]:
    """A permutation of ``range(size)`` determined only by ``(seed, epoch)``.

    A fresh ``numpy`` generator is seeded through ``SeedSequence([seed, epoch])`` so that nearby
    seeds and epochs give unrelated orders, and no global generator is read or advanced.
    """
    generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return generator.permutation(size).tolist()


class _EpochShuffle:
    """Shared machinery of the two shuffle samplers: seed, epoch, and a pure shuffle of a list."""

    _owner = "ReproducibleShuffleSampler"

    def _init_shuffle(self, seed: Any) -> None:
        self.seed = _require_non_negative_int(self._owner, "seed", seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass use the order of ``epoch`` (the pass after it uses ``epoch + 1``)."""
        self.epoch = _require_non_negative_int(self._owner, "epoch", epoch)

    def _shuffled(self, items: List[Any]) -> Iterator[Any]:
        order = _permutation(self.seed, self.epoch, len(items))
        self.epoch += 1
        return (items[position] for position in order)


class ReproducibleShuffleSampler(_EpochShuffle, torch.utils.data.Sampler):
    """Shuffle the indices of ``sampler`` in an order fixed by ``(seed, epoch)``.

    ``sampler`` is any sized iterable of indices (``SequentialSampler(dataset)``, a list, a user
    sampler). Each pass lists it, then yields it in the permutation of the current epoch, then
    advances the epoch; ``set_epoch`` positions it explicitly. Every rank must use the same seed,
    or the shards of a distributed run would overlap.
    """

    _owner = "ReproducibleShuffleSampler"

    def __init__(self, sampler: Iterable[int], seed: int) -> None:
        self.sampler = sampler
        self._init_shuffle(seed)

    def __iter__(self) -> Iterator[int]:
        return self._shuffled(list(self.sampler))

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]


class ReproducibleShuffleBatchSampler(_EpochShuffle, torch.utils.data.BatchSampler):
    """Shuffle the order of the batches of ``batch_sampler`` (not their contents) by ``(seed, epoch)``.

    Prefer :class:`ReproducibleShuffleSampler` where possible: shuffling samples varies what is in
    each batch from epoch to epoch, shuffling batches only their order.
    """

    _owner = "ReproducibleShuffleBatchSampler"

    def __init__(self, batch_sampler: Iterable[List[int]], seed: int) -> None:
        self.batch_sampler = batch_sampler
        self._init_shuffle(seed)

    def __iter__(self) -> Iterator[List[int]]:
        return self._shuffled(list(self.batch_sampler))

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]


_NOTHING = object()  # what ``next`` returns for a pass that yields nothing


def _repeat_forever(owner: str, wrapped: Iterable[Any], start_epoch: int) -> Iterator[Any]:
    """Yield every pass of ``wrapped`` in turn, setting the chain's epoch before each pass."""
    for epoch in itertools.count(start_epoch):
        set_sampler_epoch(wrapped, epoch)
        items = iter(wrapped)
        first = next(items, _NOTHING)
        if first is _NOTHING:
            raise ValueError(f"{owner}: the wrapped sampler yielded nothing in epoch {epoch}; "
                             "an empty dataset cannot be repeated")
        yield first
        yield from items  # the rest of the pass without a line of this loop per item


class RepeatSampler(torch.utils.data.Sampler):
    """Yield the indices of ``sampler`` pass after pass, forever; pass ``k`` uses epoch ``start_epoch + k``.

    ``len()`` is the length of one pass, which is what defines an epoch.
    """

    def __init__(self, sampler: Iterable[int], start_epoch: int = 0) -> None:
        self.sampler = sampler
        self.start_epoch = _require_non_negative_int("RepeatSampler", "start_epoch", start_epoch)

    def __iter__(self) -> Iterator[int]:
        return _repeat_forever("RepeatSampler", self.sampler, self.start_epoch)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]


class RepeatBatchSampler(torch.utils.data.BatchSampler):
    """Yield the batches of ``batch_sampler`` pass after pass, forever; pass ``k`` uses epoch ``start_epoch + k``.

    ``len()`` is the length of one pass, which is what defines an epoch.
    """

    def __init__(self, batch_sampler: Iterable[List[int]], start_epoch: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.start_epoch = _require_non_negative_int(
            "RepeatBatchSampler", "start_epoch", start_epoch
        )

    def __iter__(self) -> Iterator[List[int]]:
        return _repeat_forever("RepeatBatchSampler", self.batch_sampler, self.start_epoch)

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]


def _every_nth(wrapped: Iterable[Any], num_workers: int, rank: int) -> Iterator[Any]:
    """Yield items ``rank, rank + num_workers, ...`` of ``wrapped``."""
    if num_workers == 1:
        return iter(wrapped)
    return itertools.islice(wrapped, rank, None, num_workers)


class DistributedSampler(torch.utils.data.Sampler):
    """Keep indices ``rank, rank + num_workers, ...`` of ``sampler``: one rank's shard.

    Unlike ``torch.utils.data.DistributedSampler`` this neither shuffles nor pads: it is a link in
    a chain, and the wrapped sampler may be endless. ``len()`` is ``ceil(len(sampler) /
    num_workers)`` on every rank (see the module docstring for uneven tails).
    """

    def __init__(self, sampler: Iterable[int], num_workers: int, rank: int) -> None:
        _check_shard("DistributedSampler", num_workers, rank)
        self.sampler = sampler
        self.num_workers = int(num_workers)
        self.rank = int(rank)

    def __iter__(self) -> Iterator[int]:
        return _every_nth(self.sampler, self.num_workers, self.rank)

    def __len__(self) -> int:
        return _equal_shard_len(len(self.sampler), self.num_workers)  # type: ignore[arg-type]


class DistributedBatchSampler(torch.utils.data.BatchSampler):
    """Keep batches ``rank, rank + num_workers, ...`` of ``batch_sampler``: one rank's shard.

    Each rank trains on whole batches of the per-rank batch size, so the global batch is
    ``num_workers`` of them. ``len()`` is ``ceil(len(batch_sampler) / num_workers)`` on every rank
    (see the module docstring for uneven tails).
    """

    def __init__(self, batch_sampler: Iterable[List[int]], num_workers: int, rank: int) -> None:
        _check_shard("DistributedBatchSampler", num_workers, rank)
        self.batch_sampler = batch_sampler
        self.num_workers = int(num_workers)
        self.rank = int(rank)

    def __iter__(self) -> Iterator[List[int]]:
        return _every_nth(self.batch_sampler, self.num_workers, self.rank)

    def __len__(self) -> int:
        return _equal_shard_len(len(self.batch_sampler), self.num_workers)  # type: ignore[arg-type]


class SkipSampler(torch.utils.data.Sampler):
    """Drop the first ``skip`` indices of ``sampler`` and yield the rest.

    Meant to sit after a repeat (so the skip happens once, not every epoch); ``len()`` is
    therefore the wrapped length, unchanged. Prefer :class:`SkipBatchSampler` for resuming: the
    training loop counts batches, not records.
    """

    def __init__(self, sampler: Iterable[int], skip: int) -> None:
        self.sampler = sampler
        self.skip = _require_non_negative_int("SkipSampler", "skip", skip)

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self.sampler, self.skip, None)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]


class SkipBatchSampler(torch.utils.data.BatchSampler):
    """Drop the first ``skip`` batches of ``batch_sampler`` and yield the rest.

    Only index lists are drawn and dropped, never data. Meant to sit after a repeat and after
    sharding (``skip`` counts this rank's batches); ``len()`` is the wrapped length, unchanged.
    """

    def __init__(self, batch_sampler: Iterable[List[int]], skip: int) -> None:
        self.batch_sampler = batch_sampler
        self.skip = _require_non_negative_int("SkipBatchSampler", "skip", skip)

    def __iter__(self) -> Iterator[List[int]]:
        return itertools.islice(self.batch_sampler, self.skip, None)

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]
