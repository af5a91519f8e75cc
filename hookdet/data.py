"""Determined's ``DataLoader`` and batch helpers: reproducible, resumable, shardable data.

A trial's ``build_training_data_loader`` returns :class:`DataLoader`, which only *records* the
arguments a ``torch.utils.data.DataLoader`` would take. The core loop then calls
:func:`adapt_training_loader` (or :func:`adapt_validation_loader`), which builds the real torch
loader over the batch-sampler chain of :mod:`hookdet.samplers`::

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

Also here: :data:`TorchData`, :func:`to_device` (and :func:`batch_mover`, its per-run form) and
:func:`data_length`, with Determined's names and semantics.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import numbers
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Type,
    Union,
)

import numpy as np
import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, Sampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate

from hookdet.samplers import (
    DistributedBatchSampler,
    RepeatBatchSampler,
    ReproducibleShuffleSampler,
    SkipBatchSampler,
    _check_shard,
    _require_non_negative_int,
    set_sampler_epoch,
)

__all__ = [
    "TorchData",
    "DataLoader",
    "DatasetReproducibilityError",
    "PlainLoaderAdapter",
    "adapt_batch_sampler",
    "adapt_training_loader",
    "adapt_validation_loader",
    "to_device",
    "batch_mover",
    "data_length",
]

logger = logging.getLogger("hookdet.data")

TorchData = Union[Dict[str, torch.Tensor], Sequence[torch.Tensor], torch.Tensor]
"""What a batch is (Determined's alias): a tensor, a sequence of tensors or a dict of them."""

_NUMPY_KINDS_TORCH_CAN_HOLD = "fciub"
_LOADER_SEED_DOMAIN = 0x6C6F6164  # keeps the loader's seed stream apart from the shuffle's


class DatasetReproducibilityError(RuntimeError):
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

    ``shuffle=True`` uses :class:`~hookdet.samplers.ReproducibleShuffleSampler` seeded by the
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
        skip = _require_non_negative_int("DataLoader.get_data_loader", "skip", skip)
        seed = _require_non_negative_int("DataLoader.get_data_loader", "seed", seed)
        _check_shard("DataLoader.get_data_loader", num_replicas, rank)

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
        _check_shard("DataLoader.epoch_length", num_replicas, 0)
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


def _reproducibility_message(method_name: str, loader: Any) -> str:
    """Why a non-hookdet loader is refused, and the two ways out."""
    loader_type = f"{type(loader).__module__}.{type(loader).__qualname__}"
    return (
        f"{method_name}() returned a {loader_type}, not a hookdet.pytorch.DataLoader "
        "(Determined's det.pytorch.DataLoader). hookdet.pytorch.DataLoader takes the same "
        "arguments as torch.utils.data.DataLoader and makes the data order reproducible, "
        "sharded across ranks and exactly resumable; return one from "
        f"{method_name}(). If you cannot, call "
        "context.experimental.disable_dataset_reproducibility_checks() in your trial's "
        "__init__(): hookdet then uses your loader as it is (repeated epoch after epoch for "
        "training, already-trained batches skipped on resume) but does not shard it across "
        "ranks, and a shuffled loader will not resume in the same order."
    )


class PlainLoaderAdapter:
    """Iterate a user's own loader (not a hookdet :class:`DataLoader`) the way the loop needs.

    Used only when reproducibility checks are disabled. With ``repeat`` it yields the loader's
    batches epoch after epoch, forever; it first drops ``skip`` batches. Whole epochs are skipped
    without touching the loader when it has a length; the rest of the current epoch is skipped by
    drawing and discarding batches, which does load their data. Before each training epoch the
    epoch number is passed to any sampler in the loader that has ``set_epoch`` (a
    ``torch.utils.data.DistributedSampler``, say), so such samplers resume in the right epoch.

    Not resume-exact for loaders that shuffle with ``RandomSampler``: its order comes from a
    generator hookdet does not control. Nothing is sharded: the loader must do that itself.
    """

    def __init__(self, loader: Iterable[Any], *, repeat: bool, skip: int, method_name: str) -> None:
        self.loader = loader
        self.repeat = repeat
        self.skip = skip
        self.method_name = method_name

    def _epoch_length(self) -> Optional[int]:
        try:
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            return None

    def __len__(self) -> int:
        """Batches per epoch of the wrapped loader; ``TypeError`` when it has no length."""
        length = self._epoch_length()
        if length is None:
            raise TypeError(
                f"{self.method_name}() returned a {type(self.loader).__name__} without a length, "
                "so the epoch length is unknown"
            )
        return length

    def __iter__(self) -> Iterator[Any]:
        epoch_length = self._epoch_length()
        start_epoch, skip_in_epoch = 0, self.skip
        if self.repeat and epoch_length:
            start_epoch, skip_in_epoch = divmod(self.skip, epoch_length)
        return itertools.islice(self._passes(start_epoch), skip_in_epoch, None)

    def _passes(self, start_epoch: int) -> Iterator[Any]:
        epochs = itertools.count(start_epoch) if self.repeat else iter([start_epoch])
        for epoch in epochs:
            if self.repeat:
                set_sampler_epoch(self.loader, epoch)
            yielded_any = False
            for batch in self.loader:
                yielded_any = True
                yield batch
            if not yielded_any and self.repeat:
                raise ValueError(
                    f"{self.method_name}() returned a loader that yielded no batches in epoch "
                    f"{epoch}; an empty loader cannot be trained on"
                )


def _refuse_or_accept_plain_loader(loader: Any, disable_checks: bool, method_name: str) -> None:
    """Raise :class:`DatasetReproducibilityError` unless checks are off; ``TypeError`` if not iterable."""
    if not disable_checks:
        raise DatasetReproducibilityError(_reproducibility_message(method_name, loader))
    if not isinstance(loader, Iterable):
        raise TypeError(
            f"{method_name}() returned a {type(loader).__name__}, which is not iterable; return "
            "a hookdet.pytorch.DataLoader"
        )


def adapt_training_loader(
    loader: Any,
    *,
    disable_checks: bool = False,
    repeat: bool = True,
    skip: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
    seed: int = 0,
) -> Iterable[Any]:
    """Turn what ``build_training_data_loader()`` returned into this rank's stream of batches.

    A hookdet :class:`DataLoader` becomes its endless, sharded, resumed torch loader
    (``get_data_loader(repeat, skip, num_replicas, rank, seed=seed)``); ``len()`` of the result is
    what this rank gets of one pass (the loop's epoch length is :meth:`DataLoader.epoch_length`).
    Anything else raises :class:`DatasetReproducibilityError` unless ``disable_checks`` (set by
    ``context.experimental.disable_dataset_reproducibility_checks()``), in which case it is
    wrapped in a :class:`PlainLoaderAdapter`.
    """
    if isinstance(loader, DataLoader):
        return loader.get_data_loader(
            repeat=repeat, skip=skip, num_replicas=num_replicas, rank=rank, seed=seed
        )
    _refuse_or_accept_plain_loader(loader, disable_checks, "build_training_data_loader")
    skip = _require_non_negative_int("adapt_training_loader", "skip", skip)
    return PlainLoaderAdapter(
        loader, repeat=repeat, skip=skip, method_name="build_training_data_loader"
    )


def adapt_validation_loader(
    loader: Any,
    *,
    disable_checks: bool = False,
    num_replicas: int = 1,
    rank: int = 0,
    seed: int = 0,
) -> Iterable[Any]:
    """Turn what ``build_validation_data_loader()`` returned into this rank's validation batches.

    A hookdet :class:`DataLoader` becomes one unrepeated pass, sharded round-robin when
    ``num_replicas > 1`` (every batch exactly once across ranks; ranks ``>= len % num_replicas``
    get one batch fewer, see :mod:`hookdet.samplers`). Every pass has the same order, so a resumed
    run validates exactly like the run that never stopped. For ``evaluate_full_dataset`` pass
    ``num_replicas=1`` on the chief, as Determined does. Anything else raises
    :class:`DatasetReproducibilityError` unless ``disable_checks``, and is then returned as is:
    Determined does not shard a user's own validation loader either.
    """
    if isinstance(loader, DataLoader):
        return loader._build(
            repeat=False, skip=0, num_replicas=num_replicas, rank=rank, seed=seed, pinned_epoch=0
        )
    _refuse_or_accept_plain_loader(loader, disable_checks, "build_validation_data_loader")
    return loader  # type: ignore[no-any-return]


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def to_device(
    data: Any, device: Union[torch.device, str, int], warned_types: Optional[Set[Type]] = None
) -> Any:
    """Move every tensor in a batch to ``device``, keeping the batch's structure.

    Handles, nested to any depth: tensors; numpy arrays of numbers or bools (made tensors, as
    Determined does; other dtypes are left alone); dicts and other mappings; lists; tuples and
    namedtuples (kept namedtuples, where Determined makes them plain tuples); dataclass instances;
    any object with a callable ``.to(device)``. Strings, bytes, numbers and ``None`` pass through
    unchanged and silently. Anything else passes through unchanged with a warning logged once per
    type; pass the same ``warned_types`` set on every call to keep that to once per run.

    Copies to an accelerator are ``non_blocking`` (safe: the source is host memory the loader does
    not reuse); copies to the CPU block, since a non-blocking device-to-host copy could be read
    before it lands. Values are never inspected, so no device-to-host sync is forced.
    """
    target, non_blocking = _target(device)
    return _move(data, target, non_blocking, set() if warned_types is None else warned_types)


#: A tensor's ``is_cpu`` flag, read without building a ``torch.device`` (as ``.device`` does);
#: raises TypeError when given anything but a tensor.
_tensor_is_cpu = torch.Tensor.is_cpu.__get__


def batch_mover(
    device: Union[torch.device, str, int], warned_types: Optional[Set[Type]] = None
) -> Callable[[Any], Any]:
    """:func:`to_device` bound to ``device``: ``mover(data)`` moves one batch.

    What does not change from batch to batch is worked out here, once: the target device,
    whether copies are ``non_blocking``, and one ``warned_types`` set for every batch it moves
    (so an unknown type is warned about once per mover). The training loop makes one per run.
    Unlike :func:`to_device`, a tuple or list whose items are all tensors on ``device`` already
    comes back as the same object.
    """
    target, non_blocking = _target(device)
    warned = set() if warned_types is None else warned_types

    if target.type == "cpu":

        def mover(data: Any) -> Any:
            # The usual batch of a CPU run, a tuple or list of CPU tensors, is returned as it is,
            # checked by one ``all`` over the tensors' ``is_cpu`` flags without a Python line per
            # item (``_tensor_is_cpu`` raises TypeError for anything that is not a tensor).
            kind = type(data)
            if kind is tuple or kind is list:
                try:
                    if all(map(_tensor_is_cpu, data)):
                        return data
                except TypeError:
                    pass
            return _move(data, target, non_blocking, warned)

        return mover

    def mover(data: Any) -> Any:
        # A tuple or list of tensors on the device already is returned as it is, without
        # rebuilding it around the same tensors.
        kind = type(data)
        if kind is tuple or kind is list:
            for item in data:
                if type(item) is not torch.Tensor or item.device != target:
                    break
            else:
                return data
        return _move(data, target, non_blocking, warned)

    return mover


def _target(device: Union[torch.device, str, int]) -> Tuple[torch.device, bool]:
    """``device`` as a ``torch.device``, and whether copies to it are non-blocking."""
    target = device if isinstance(device, torch.device) else torch.device(device)
    return target, target.type != "cpu"


def _move(data: Any, device: torch.device, non_blocking: bool, warned_types: Set[Type]) -> Any:
    if isinstance(data, torch.Tensor):
        if data.device == device:  # already there: skip the dispatcher round trip of .to()
            return data
        return data.to(device, non_blocking=non_blocking)
    # The usual batches, by exact type first: the checks below (numbers.Number, Mapping) are
    # abstract-base-class isinstance checks costing about 0.4 µs each, paid on every batch.
    kind = type(data)
    if kind is tuple or kind is list:
        return kind([_move(item, device, non_blocking, warned_types) for item in data])
    if kind is dict:
        return {key: _move(value, device, non_blocking, warned_types) for key, value in data.items()}
    if isinstance(data, np.ndarray):
        if data.dtype.kind not in _NUMPY_KINDS_TORCH_CAN_HOLD:
            _warn_once(data, device, warned_types, detail=f" with dtype {data.dtype}")
            return data
        return _tensor_from_numpy(data).to(device, non_blocking=non_blocking)
    if isinstance(data, (str, bytes, numbers.Number, np.generic)) or data is None:
        return data
    if isinstance(data, Mapping):
        moved = {key: _move(value, device, non_blocking, warned_types) for key, value in data.items()}
        return _rebuild_mapping(data, moved)
    if _is_namedtuple(data):
        return type(data)(*(_move(item, device, non_blocking, warned_types) for item in data))
    if isinstance(data, (list, tuple)):
        moved_items = [_move(item, device, non_blocking, warned_types) for item in data]
        return _rebuild_sequence(data, moved_items)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {
            field.name: _move(getattr(data, field.name), device, non_blocking, warned_types)
            for field in dataclasses.fields(data)
            if field.init
        }
        return dataclasses.replace(data, **changes)
    mover = getattr(data, "to", None)
    if callable(mover):
        return mover(device)
    _warn_once(data, device, warned_types)
    return data


def _tensor_from_numpy(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy``, first making the array native-endian and positively strided if needed."""
    try:
        return torch.from_numpy(array)
    except (TypeError, ValueError):
        native = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
        return torch.from_numpy(native)


def _rebuild_mapping(original: Mapping, moved: Dict[Any, Any]) -> Any:
    """A mapping of ``original``'s type holding ``moved``; a plain dict if the type won't rebuild."""
    if type(original) is dict:
        return moved
    if isinstance(original, collections.defaultdict):
        return collections.defaultdict(original.default_factory, moved)
    try:
        return type(original)(moved)
    except TypeError:
        return moved


def _rebuild_sequence(original: Sequence, moved: List[Any]) -> Any:
    """A list/tuple of ``original``'s type holding ``moved``; the base type if it won't rebuild."""
    if type(original) in (list, tuple):
        return type(original)(moved)
    try:
        return type(original)(moved)
    except TypeError:
        return tuple(moved) if isinstance(original, tuple) else moved


def _warn_once(data: Any, device: torch.device, warned_types: Set[Type], detail: str = "") -> None:
    if type(data) in warned_types:
        return
    warned_types.add(type(data))
    logger.warning(
        "to_device: cannot move a %s%s to %s; it is passed through unchanged",
        type(data).__name__, detail, device,
    )


def data_length(data: Any) -> int:
    """The number of records in a batch: the size of the first dimension of its first array.

    A tensor or numpy array gives ``shape[0]`` (read from metadata: no device sync). A mapping
    gives the length of its first value, a list or tuple (namedtuples included) that of its first
    element, recursively; a list or tuple whose first element is not itself an array or container
    (a collated list of strings, say) is the batch, so its own length counts. Raises
    ``ValueError`` for an empty container and ``TypeError`` naming the type (and where it sits)
    for anything else; override ``get_batch_length`` in the trial for custom batch types.
    """
    return _length_at(data, "batch")


def _length_at(data: Any, where: str) -> int:
    if isinstance(data, (torch.Tensor, np.ndarray)):
        if data.ndim == 0:
            raise TypeError(
                f"data_length: {where} is a 0-d {type(data).__name__}, which has no batch dimension"
            )
        return int(data.shape[0])
    if isinstance(data, Mapping):
        if not data:
            raise ValueError(f"data_length: {where} is an empty {type(data).__name__}")
        first_key = next(iter(data))
        return _length_at(data[first_key], f"{where}[{first_key!r}]")
    if isinstance(data, (list, tuple)):
        if not data:
            raise ValueError(f"data_length: {where} is an empty {type(data).__name__}")
        first = data[0]
        if isinstance(first, (torch.Tensor, np.ndarray, Mapping, list, tuple)):
            return _length_at(first, f"{where}[0]")
        return len(data)
    raise TypeError(
        f"data_length: cannot find the batch length of {where}, a {type(data).__name__}; a batch "
        "must be a tensor, numpy array, or a dict/list/tuple of them (override "
        "get_batch_length() in the trial for other types)"
    )
