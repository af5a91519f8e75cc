"""What a trial's ``build_training_data_loader``/``build_validation_data_loader`` returned, made
into the loader the loop iterates: a hookdet :class:`~hookdet.data.loader.DataLoader` is built over
its sampler chain (sharded, skipping on resume); anything else is refused with the two ways out,
or, with the dataset-reproducibility checks disabled, wrapped in :class:`PlainLoaderAdapter`.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator, Optional

from hookdet.data.loader import DataLoader, DatasetReproducibilityError
from hookdet.data.samplers import require_non_negative_int, set_sampler_epoch

__all__ = ["PlainLoaderAdapter", "adapt_training_loader", "adapt_validation_loader"]



def _reproducibility_message(method_name: str, loader: Any) -> str:
    """Why a non-hookdet loader is refused, and the two ways out."""
    loader_type = f"{type(loader).__module__}.{type(loader).__qualname__}"
    return (
        f"{method_name}() returned a {loader_type}, not a hookdet.pytorch.DataLoader "
        "(Determined's det.pytorch.DataLoader). hookdet.pytorch.DataLoader takes the same "
        "arguments as torch.utils.data.DataLoader and makes the data order reproducible, "
        "sharded across ranks and exactly resumable; return one from "
        f"{method_name}(). If you cannot, you can disable this check by calling "
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
    skip = require_non_negative_int("adapt_training_loader", "skip", skip)
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
    get one batch fewer, see :mod:`hookdet.data.samplers`). Every pass has the same order, so a resumed
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
