"""Composable samplers that make data order reproducible, resumable and shardable.

These are Determined's seven sampler families (``determined.pytorch.samplers``), with the same
class names, constructor arguments and chaining rules:

* ``ReproducibleShuffleSampler`` / ``ReproducibleShuffleBatchSampler`` shuffle what they wrap.
* ``RepeatSampler`` / ``RepeatBatchSampler`` turn a finite sampler into an endless one.
* ``DistributedSampler`` / ``DistributedBatchSampler`` keep one rank's shard.
* ``SkipSampler`` / ``SkipBatchSampler`` drop the first ``skip`` items (resume).

Chain them in the order shuffle → repeat → distribute → skip, as Determined documents: skipping
before shuffling breaks reproducibility, and shuffling after repeating never ends.

Orders and lengths are Determined's: a shuffle sampler with seed ``s`` yields, on its ``k``-th
pass, the ``k``-th shuffle of ``numpy.random.RandomState(s)`` (what Determined's yields), and a
distributed sampler's ``len()`` is the number of items its rank really gets.

Where hookdet differs from its reference, on purpose:

* A shuffle is resumable. Determined keeps one ``RandomState`` that advances with every pass, so
  a sampler rebuilt on resume starts again from the first pass's order. Here the order of pass
  ``e`` is a pure function of ``(seed, e, length)``: ``set_epoch(e)`` replays the generator
  through the ``e`` earlier shuffles (a private ``RandomState``, so the global
  ``random``/``numpy``/``torch`` generators are never touched; dropout and augmentation draw from
  the global torch RNG, so a sampler that consumed it would break bit-exact resume). Iterating a
  shuffle sampler directly gives a new order each time, exactly as Determined's does, and the
  repeat samplers set the epoch explicitly before each pass.
* The repeat samplers refuse to spin forever on a sampler that yields nothing.
* Bad arguments (negative skip, rank outside ``[0, num_workers)``, non-integer seed) raise one
  ``ValueError``/``TypeError`` naming the class and the argument.
* Hookdet's extras are keyword-only, after Determined's parameters (``RepeatSampler(sampler, *,
  start_epoch=0)``), and the ``set_epoch`` methods are additions.

Uneven shards. Sharding is round-robin: rank ``r`` of ``N`` keeps items ``r, r+N, r+2N, ...``.
When the wrapped length ``L`` is not a multiple of ``N``, ranks ``>= L % N`` get one item fewer
per pass, and their ``len()`` says so (:func:`shard_length`), as Determined's does. The training
loop defines epochs by the chief's length, ``ceil(L / N)``, on every rank (Determined broadcasts
the chief's), so all ranks fire epoch-boundary work together. What actually happens:

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


def require_non_negative_int(owner: str, argument: str, value: Any) -> int:
    """Return ``value`` if it is an int >= 0, else raise naming ``owner`` and ``argument``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}: {argument} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{owner}: {argument} must be >= 0, got {value}")
    return int(value)


def check_shard(owner: str, num_workers: Any, rank: Any) -> None:
    """Raise one clear error unless ``0 <= rank < num_workers``."""
    num_workers = require_non_negative_int(owner, "num_workers", num_workers)
    rank = require_non_negative_int(owner, "rank", rank)
    if num_workers == 0:
        raise ValueError(f"{owner}: num_workers must be positive, got 0")
    if rank >= num_workers:
        raise ValueError(f"{owner}: rank must be less than num_workers, got rank={rank} "
                         f"with num_workers={num_workers}")


def shard_length(total: int, num_workers: int, rank: int) -> int:
    """How many of ``total`` items round-robin sharding gives ``rank``: the distributed samplers' ``len()``.

    One fewer than ``ceil(total / num_workers)`` on ranks ``>= total % num_workers``. A
    validation loop can use it to know, without iterating, which ranks finish early.
    """
    check_shard("shard_length", num_workers, rank)
    full_rounds, remainder = divmod(total, num_workers)
    return full_rounds + (1 if rank < remainder else 0)


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


class _ReplayableShuffle:
    """The permutations Determined's ``RandomState(seed)`` gives pass after pass, replayable.

    ``RandomState.shuffle`` draws the same numbers whatever it shuffles, so shuffling positions
    ``0..n-1`` gives the permutation Determined applies to its list. The generator of the last
    pass is kept, so consecutive epochs cost one shuffle each; any other epoch replays from the
    seed (``epoch`` shuffles of ``n`` positions, in C).
    """

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._rng = np.random.RandomState(seed)
        self._next_epoch = 0  # the epoch the generator's next shuffle belongs to
        self._size = -1

    def permutation(self, epoch: int, size: int) -> np.ndarray:
        if epoch != self._next_epoch or size != self._size:
            self._rng = np.random.RandomState(self._seed)
            for _ in range(epoch):
                self._rng.shuffle(np.arange(size))
        positions = np.arange(size)
        self._rng.shuffle(positions)
        self._next_epoch, self._size = epoch + 1, size
        return positions


class _EpochShuffle:
    """Shared machinery of the two shuffle samplers: seed, epoch, and Determined's shuffle of a list."""

    _owner = "ReproducibleShuffleSampler"

    def _init_shuffle(self, seed: Any) -> None:
        self.seed = require_non_negative_int(self._owner, "seed", seed)
        self.epoch = 0
        self._permutations = _ReplayableShuffle(self.seed)

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass use the order of ``epoch`` (the pass after it uses ``epoch + 1``)."""
        self.epoch = require_non_negative_int(self._owner, "epoch", epoch)

    def _shuffled(self, items: List[Any]) -> Iterator[Any]:
        order = self._permutations.permutation(self.epoch, len(items)).tolist()
        self.epoch += 1
        return (items[position] for position in order)


class ReproducibleShuffleSampler(_EpochShuffle, torch.utils.data.Sampler):
    """Shuffle the indices of ``sampler`` in an order fixed by ``(seed, epoch)``: Determined's.

    ``sampler`` is any sized iterable of indices (``SequentialSampler(dataset)``, a list, a user
    sampler). Each pass lists it, then yields it in the permutation of the current epoch (the
    order Determined's sampler yields on that pass), then advances the epoch; ``set_epoch``
    positions it explicitly. Every rank must use the same seed,
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

    def __init__(self, sampler: Iterable[int], *, start_epoch: int = 0) -> None:
        self.sampler = sampler
        self.start_epoch = require_non_negative_int("RepeatSampler", "start_epoch", start_epoch)

    def __iter__(self) -> Iterator[int]:
        return _repeat_forever("RepeatSampler", self.sampler, self.start_epoch)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]


class RepeatBatchSampler(torch.utils.data.BatchSampler):
    """Yield the batches of ``batch_sampler`` pass after pass, forever; pass ``k`` uses epoch ``start_epoch + k``.

    ``len()`` is the length of one pass, which is what defines an epoch.
    """

    def __init__(self, batch_sampler: Iterable[List[int]], *, start_epoch: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.start_epoch = require_non_negative_int(
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
    a chain, and the wrapped sampler may be endless. ``len()`` is what this rank gets of one pass
    (:func:`shard_length`), as in Determined.
    """

    def __init__(self, sampler: Iterable[int], num_workers: int, rank: int) -> None:
        check_shard("DistributedSampler", num_workers, rank)
        self.sampler = sampler
        self.num_workers = int(num_workers)
        self.rank = int(rank)

    def __iter__(self) -> Iterator[int]:
        return _every_nth(self.sampler, self.num_workers, self.rank)

    def __len__(self) -> int:
        return shard_length(len(self.sampler), self.num_workers, self.rank)  # type: ignore[arg-type]


class DistributedBatchSampler(torch.utils.data.BatchSampler):
    """Keep batches ``rank, rank + num_workers, ...`` of ``batch_sampler``: one rank's shard.

    Each rank trains on whole batches of the per-rank batch size, so the global batch is
    ``num_workers`` of them. ``len()`` is what this rank gets of one pass (:func:`shard_length`),
    as in Determined.
    """

    def __init__(self, batch_sampler: Iterable[List[int]], num_workers: int, rank: int) -> None:
        check_shard("DistributedBatchSampler", num_workers, rank)
        self.batch_sampler = batch_sampler
        self.num_workers = int(num_workers)
        self.rank = int(rank)

    def __iter__(self) -> Iterator[List[int]]:
        return _every_nth(self.batch_sampler, self.num_workers, self.rank)

    def __len__(self) -> int:
        return shard_length(len(self.batch_sampler), self.num_workers, self.rank)  # type: ignore[arg-type]


class SkipSampler(torch.utils.data.Sampler):
    """Drop the first ``skip`` indices of ``sampler`` and yield the rest.

    Meant to sit after a repeat (so the skip happens once, not every epoch); ``len()`` is
    therefore the wrapped length, unchanged. Prefer :class:`SkipBatchSampler` for resuming: the
    training loop counts batches, not records.
    """

    def __init__(self, sampler: Iterable[int], skip: int) -> None:
        self.sampler = sampler
        self.skip = require_non_negative_int("SkipSampler", "skip", skip)

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
        self.skip = require_non_negative_int("SkipBatchSampler", "skip", skip)

    @property
    def length(self) -> int:
        """The wrapped length (Determined's attribute; same as ``len()``)."""
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[List[int]]:
        return itertools.islice(self.batch_sampler, self.skip, None)

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]
