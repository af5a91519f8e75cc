"""Determined's ``DataLoader`` and batch helpers: reproducible, resumable, shardable data.

A trial's ``build_training_data_loader`` returns :class:`DataLoader`, which only *records* the
arguments a ``torch.utils.data.DataLoader`` would take. The core loop then calls
:func:`adapt_training_loader` (or :func:`adapt_validation_loader`), which builds the real torch
loader over the batch-sampler chain of :mod:`hookdet.data.samplers`::

    base batches (shuffle=True: ReproducibleShuffleSampler(seed) instead of RandomSampler)
      -> RepeatBatchSampler           training only: endless, epoch advanced every pass
      -> DistributedBatchSampler      when num_replicas > 1: rank r keeps batches r, r+N, ...
      -> SkipBatchSampler(skip)       resume: batches this rank already trained on

Resume is exact because the data order is a pure function of ``(seed, batches trained)``: the
shuffle of epoch ``e`` depends only on ``(seed, e)``, skipping draws index lists and never data,
and the torch loader gets its own ``torch.Generator`` so creating an iterator never consumes the
global torch RNG (which dropout uses). A checkpoint therefore needs to store only the number of
batches trained and the seed; pass them back as ``skip`` and ``seed``.

What is not exact: random augmentation done *inside* DataLoader worker processes
(``num_workers > 0``) with the workers' own RNGs, because a resumed run starts fresh workers.
Augmentation in the main process (``num_workers=0``) draws from the global RNGs, which the
checkpoint restores.

What a trial's ``build_*_data_loader`` returned becomes the loop's loader in
:mod:`hookdet.data.loader_adapters`; batches move to the device in :mod:`hookdet.data.batch_moving`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Union

import numpy as np
import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, Sampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate

from hookdet.errors import HookdetError
from hookdet.data.samplers import (
    DistributedBatchSampler,
    RepeatBatchSampler,
    ReproducibleShuffleSampler,
    SkipBatchSampler,
    check_shard,
    require_non_negative_int,
    set_sampler_epoch,
)

__all__ = [
    "DataLoader",
    "DatasetReproducibilityError",
    "adapt_batch_sampler",
]


_LOADER_SEED_DOMAIN = 0x6C6F6164  # keeps the loader's seed stream apart from the shuffle's


class DatasetReproducibilityError(HookdetError, RuntimeError):
    """A trial returned a loader hookdet cannot make reproducible, and checks are not disabled."""


def _loader_generator(seed: int, rank: int) -> torch.Generator:
    """A private generator for one rank's torch DataLoader, derived from ``(seed, rank)``.

    torch draws the worker base seed from the loader's generator (or, without one, from the global
    RNG) each time an iterator is created; a generator of our own keeps the global RNG untouched,
    and mixing in the rank gives each rank's workers different augmentation streams.
    """
    state = np.random.SeedSequence([seed, rank, _LOADER_SEED_DOMAIN]).generate_state(1, np.uint64)
    return torch.Generator().manual_seed(int(state[0]))


class _PinnedEpochBatchSampler(BatchSampler):
    """Before every pass, set the wrapped chain to the same epoch, so every pass has one order.

    Used for validation: an unrepeated shuffle would otherwise advance its epoch each validation,
    and a resumed run (whose counter restarts) would validate in a different order than the run
    that never stopped, changing float sums in the last bits.
    """

    def __init__(self, batch_sampler: Iterable[List[int]], epoch: int) -> None:
        self.batch_sampler = batch_sampler
        self.epoch = epoch

    def __iter__(self) -> Iterator[List[int]]:
        set_sampler_epoch(self.batch_sampler, self.epoch)
        return iter(self.batch_sampler)

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]


class _ReseededTorchDataLoader(torch.utils.data.DataLoader):
    """A torch DataLoader whose private generator restarts from the same seed on every ``iter()``.

    Worker base seeds are drawn from the generator per iterator; restarting it makes validation
    pass ``k`` of a resumed run identical to pass ``k`` of the run that never stopped.
    """

    def __init__(self, *args: Any, generator_seed: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._generator_seed = generator_seed

    def __iter__(self) -> Any:
        self.generator.manual_seed(self._generator_seed)
        return super().__iter__()


class DataLoader:
    """Determined's drop-in for ``torch.utils.data.DataLoader``: records arguments, builds later.

    The constructor takes exactly the arguments of ``torch.utils.data.DataLoader`` and rejects the
    same combinations, plus what Determined rejects: an ``IterableDataset`` (hookdet cannot shuffle,
    shard or skip it; return a plain torch loader and disable the checks instead) and
    ``batch_size=None`` without a ``batch_sampler``. Nothing heavy is built: the real loader comes
    from :meth:`get_data_loader`, once the loop knows the seed, the rank and where to resume.

    ``shuffle=True`` uses :class:`~hookdet.data.samplers.ReproducibleShuffleSampler` seeded by the
    trial's seed, not ``RandomSampler``; a ``generator`` given here is passed to the torch loader
    (it seeds worker processes) but does not drive the shuffle. A user ``sampler`` or
    ``batch_sampler`` is used as given: its order is as reproducible as it is.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: Optional[int] = 1,
        shuffle: bool = False,
        sampler: Optional[Union[Sampler, Iterable]] = None,
        batch_sampler: Optional[Union[Sampler, Iterable]] = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[List[Any]], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        _reject_bad_loader_arguments(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, drop_last,
            timeout, prefetch_factor, persistent_workers,
        )
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.num_workers = num_workers
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.pin_memory_device = pin_memory_device
        self.in_order = in_order
        self._user_sampler = sampler
        self._user_batch_sampler = batch_sampler
        self._standalone_loader: Optional[torch.utils.data.DataLoader] = None

        if batch_sampler is not None:
            self.batch_size: Optional[int] = None
            self.drop_last = False
        else:
            self.batch_size = batch_size
            self.drop_last = drop_last
        self.batch_sampler = self._base_batch_sampler(seed=0)
        self.sampler = getattr(self.batch_sampler, "sampler", sampler)

    def _base_batch_sampler(self, seed: int) -> Iterable[List[int]]:
        """The unsharded, unrepeated batches of one epoch; fresh objects unless the user gave them."""
        if self._user_batch_sampler is not None:
            return self._user_batch_sampler
        if self._user_sampler is not None:
            sampler = self._user_sampler
        elif self.shuffle:
            sampler = ReproducibleShuffleSampler(SequentialSampler(self.dataset), seed)
        else:
            sampler = SequentialSampler(self.dataset)
        return BatchSampler(sampler, self.batch_size, self.drop_last)  # type: ignore[arg-type]

    @property
    def _epoch_order_is_ours(self) -> bool:
        """Whether hookdet built the base sampler, so every epoch really has ``len(self)`` batches."""
        return self._user_sampler is None and self._user_batch_sampler is None

    def get_data_loader(
        self,
        repeat: bool = False,
        skip: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        *,
        seed: int = 0,
    ) -> torch.utils.data.DataLoader:
        """Build the torch DataLoader over the sampler chain (see the module docstring).

        ``skip`` counts batches already consumed *by this rank* (after sharding); ``seed`` (a
        hookdet addition: the shuffle's seed) must be the same on every rank. With ``repeat`` the
        loader is endless and ``len()`` is what this rank gets of one pass (as in Determined;
        :meth:`epoch_length` is the chief's count that defines epochs).
        """
        return self._build(repeat, skip, num_replicas, rank, seed, pinned_epoch=None)

    def _build(
        self,
        repeat: bool,
        skip: int,
        num_replicas: int,
        rank: int,
        seed: int,
        pinned_epoch: Optional[int],
    ) -> torch.utils.data.DataLoader:
        skip = require_non_negative_int("DataLoader.get_data_loader", "skip", skip)
        seed = require_non_negative_int("DataLoader.get_data_loader", "seed", seed)
        check_shard("DataLoader.get_data_loader", num_replicas, rank)

        chain = self._base_batch_sampler(seed)
        if pinned_epoch is not None:
            chain = _PinnedEpochBatchSampler(chain, pinned_epoch)
        chain = self._resumable_chain(chain, repeat, skip, num_replicas, rank)

        loader_kwargs: Dict[str, Any] = dict(
            batch_sampler=chain,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            worker_init_fn=self.worker_init_fn,
            multiprocessing_context=self.multiprocessing_context,
            prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent_workers,
            pin_memory_device=self.pin_memory_device,
            in_order=self.in_order,
        )
        if self.generator is not None:
            return torch.utils.data.DataLoader(
                self.dataset, generator=self.generator, **loader_kwargs
            )
        generator = _loader_generator(seed, rank)
        if pinned_epoch is None:
            return torch.utils.data.DataLoader(self.dataset, generator=generator, **loader_kwargs)
        return _ReseededTorchDataLoader(
            self.dataset,
            generator=generator,
            generator_seed=generator.initial_seed(),
            **loader_kwargs,
        )

    def _resumable_chain(
        self,
        base: Iterable[List[int]],
        repeat: bool,
        skip: int,
        num_replicas: int,
        rank: int,
    ) -> Iterable[List[int]]:
        """Wrap ``base`` in repeat -> distribute -> skip, fast-forwarding whole epochs when safe.

        Dropping this rank's first ``skip`` batches after sharding is the same as dropping the
        first ``skip * num_replicas`` global batches before it (rank r's k-th batch is global batch
        ``r + k * num_replicas``). When hookdet built the base sampler every epoch has exactly
        ``len(base)`` batches, so whole epochs can be skipped by starting the repeat at a later
        epoch instead of drawing their index lists. The result is the same batches either way.
        """
        pass_length = len(base)  # type: ignore[arg-type]
        if repeat and skip and self._epoch_order_is_ours and pass_length > 0:
            start_epoch, skip_in_epoch = divmod(skip * num_replicas, pass_length)
            chain: Iterable[List[int]] = RepeatBatchSampler(base, start_epoch=start_epoch)
            if skip_in_epoch:
                chain = SkipBatchSampler(chain, skip_in_epoch)
            if num_replicas > 1:
                chain = DistributedBatchSampler(chain, num_replicas, rank)
            return chain

        chain = base
        if repeat:
            chain = RepeatBatchSampler(chain)
        if num_replicas > 1:
            chain = DistributedBatchSampler(chain, num_replicas, rank)
        if skip:
            chain = SkipBatchSampler(chain, skip)
        return chain

    def epoch_length(self, num_replicas: int = 1) -> int:
        """Batches in one epoch on each rank: ``ceil(len(self) / num_replicas)``, as Determined counts.

        Under distribution the chief's value defines epochs for every rank.
        """
        check_shard("DataLoader.epoch_length", num_replicas, 0)
        return -(-len(self) // num_replicas)

    def __iter__(self) -> Iterator[Any]:
        """Iterate one unsharded epoch (seed 0), for use outside a hookdet run.

        Like a torch DataLoader with ``shuffle=True``, each pass is a new shuffle: pass ``k`` is
        epoch ``k`` of seed 0.
        """
        if self._standalone_loader is None:
            self._standalone_loader = self.get_data_loader()
        return iter(self._standalone_loader)

    def __len__(self) -> int:
        """Batches in one unsharded epoch."""
        return len(self.batch_sampler)  # type: ignore[arg-type]


def adapt_batch_sampler(
    batch_sampler: Iterable[List[int]],
    repeat: bool = False,
    skip: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
) -> Iterable[List[int]]:
    """Determined's chain over a loader's ``batch_sampler``: repeat, then shard, then skip.

    ``skip`` counts this rank's batches (it sits after sharding). For a custom
    ``torch.utils.data.DataLoader`` that a trial adapts itself, as with Determined.
    """
    if repeat:
        batch_sampler = RepeatBatchSampler(batch_sampler)
    if num_replicas > 1:
        batch_sampler = DistributedBatchSampler(batch_sampler, num_replicas, rank)
    if skip > 0:
        batch_sampler = SkipBatchSampler(batch_sampler, skip)
    return batch_sampler


def _reject_bad_loader_arguments(
    dataset: Any,
    batch_size: Optional[int],
    shuffle: bool,
    sampler: Any,
    batch_sampler: Any,
    num_workers: int,
    drop_last: bool,
    timeout: float,
    prefetch_factor: Optional[int],
    persistent_workers: bool,
) -> None:
    """Raise one ``ValueError`` naming the argument for every combination torch or Determined refuses."""
    if isinstance(dataset, IterableDataset):
        raise ValueError(
            f"DataLoader: dataset is an IterableDataset ({type(dataset).__name__}), which "
            "hookdet.pytorch.DataLoader cannot shuffle, shard or skip. Return a "
            "torch.utils.data.DataLoader instead and call "
            "context.experimental.disable_dataset_reproducibility_checks() in the trial's "
            "__init__(); you are then responsible for sharding and resuming that data."
        )
    if batch_sampler is None and batch_size is None:
        raise ValueError(
            "DataLoader: batch_size=None needs a batch_sampler; hookdet.pytorch.DataLoader "
            "always loads batches"
        )
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(
            f"DataLoader: num_workers must be an int >= 0 (0 loads in the main process), "
            f"got {num_workers!r}"
        )
    if timeout < 0:
        raise ValueError(f"DataLoader: timeout must be >= 0, got {timeout!r}")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError("DataLoader: prefetch_factor needs num_workers > 0")
    if prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError(f"DataLoader: prefetch_factor must be >= 0, got {prefetch_factor!r}")
    if persistent_workers and num_workers == 0:
        raise ValueError("DataLoader: persistent_workers=True needs num_workers > 0")
    if sampler is not None and shuffle:
        raise ValueError("DataLoader: sampler and shuffle=True are mutually exclusive")
    if batch_sampler is not None and (
        batch_size != 1 or shuffle or sampler is not None or drop_last
    ):
        raise ValueError(
            "DataLoader: batch_sampler is mutually exclusive with batch_size, shuffle, sampler "
            "and drop_last"
        )
