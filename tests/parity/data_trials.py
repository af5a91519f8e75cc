"""Parity trials for what a trial's data looks like: batch structures, ``get_batch_length`` and
the arguments of ``DataLoader``.

Every trial here trains :class:`~tests.parity.trials.BaseTrial`'s linear model on the same
records, delivered in other shapes or by other loaders. ``BatchStructures`` records each batch
as the trial received it (container types, tensor dtypes and values) and what ``data_length``
and ``get_batch_length`` say of it; ``LoaderArguments`` picks its loader from a hyperparameter.
"""
from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List

import numpy as np
import torch
from torch.utils.data import BatchSampler, Sampler, default_collate

from tests.parity.record import event
from tests.parity.trials import RECORDS, BaseTrial, Regression, hparam, outcome, pytorch

Example = collections.namedtuple("Example", ["x", "y", "index"])


#: The batch structures a trial's loader may produce; ``BatchStructures`` gets one of each.
STRUCTURES = ("tensor", "list", "dict", "nested", "namedtuple", "numpy", "custom")


def shaped(structure: str, x: torch.Tensor, y: torch.Tensor, index: int) -> Any:
    """One record in ``structure``, for the default collate (numpy and custom: collated below)."""
    if structure == "tensor":
        return torch.cat([x, y, torch.tensor([float(index)])])
    if structure == "list":
        return [x, y, index]
    if structure == "dict":
        return {"x": x, "y": y, "index": index}
    if structure == "nested":
        return {"inputs": {"x": x, "y": y}, "meta": [index, f"record-{index}"]}
    return Example(x, y, index)


class Graphs:
    """A batch type of the trial's own (as pytorch_geometric's ``Batch``): it moves itself with
    ``.to(device)`` and knows its size only through ``num_graphs``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> None:
        self.x, self.y, self.index = x, y, index
        self.num_graphs = len(x)

    def to(self, device: Any) -> "Graphs":
        return Graphs(self.x.to(device), self.y.to(device), self.index.to(device))


def structure_of(first_index: int, batch_size: int) -> str:
    """The structure of the batch starting at record ``first_index``: each in turn."""
    return STRUCTURES[(first_index // batch_size) % len(STRUCTURES)]


def collate_mixed(records: List[Any]) -> Any:
    """Batch ``k`` of the loader in structure ``k`` (of :data:`STRUCTURES`), built as the default
    collate builds it; ``numpy`` is a tuple of numpy arrays, left for the framework's
    ``to_device`` to make tensors, and ``custom`` a :class:`Graphs`."""
    structure = structure_of(records[0][2], len(records))
    if structure in ("numpy", "custom"):
        x, y, index = (np.stack([np.asarray(record[i]) for record in records]) for i in range(3))
        return (x, y, index) if structure == "numpy" else Graphs(*map(torch.from_numpy, (x, y, index)))
    return default_collate([shaped(structure, *record) for record in records])


def unpack(batch: Any) -> Any:
    """``(x, y, index)`` from a batch of any of the structures."""
    if isinstance(batch, torch.Tensor):
        return batch[:, :3], batch[:, 3:4], batch[:, 4].long()
    if isinstance(batch, Graphs):
        return batch.x, batch.y, batch.index
    if isinstance(batch, dict) and "inputs" in batch:
        return batch["inputs"]["x"], batch["inputs"]["y"], batch["meta"][0]
    if isinstance(batch, dict):
        return batch["x"], batch["y"], batch["index"]
    return batch[0], batch[1], batch[2]


class BatchStructures(BaseTrial):
    """One loader whose batches take each structure of :data:`STRUCTURES` in turn (7 batches an
    epoch, for training and validation): tensor, list, dict, nested, namedtuple, numpy arrays
    the framework converts, and a class of the trial's own, measured by the trial's
    ``get_batch_length``."""

    def _loader(self, seed: int) -> Any:
        records = len(STRUCTURES) * self.context.get_per_slot_batch_size()
        return pytorch.DataLoader(Regression(records, seed), batch_size=self.context.get_per_slot_batch_size(),
                                  collate_fn=collate_mixed)

    def build_training_data_loader(self) -> Any:
        return self._loader(0)

    def build_validation_data_loader(self) -> Any:
        return self._loader(1)

    def observe(self, kind: str, batch: Any) -> None:
        structure = structure_of(int(unpack(batch)[2][0]), self.context.get_per_slot_batch_size())
        event(kind, structure=structure, batch=_described(batch),
              data_length=outcome(pytorch.data_length, batch), batch_length=outcome(self.get_batch_length, batch))

    def loss(self, batch: Any) -> torch.Tensor:
        x, y, _ = unpack(batch)
        return torch.nn.functional.mse_loss(self.model(x.float()), y.float())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.observe("train_batch_data", batch)
        return super().train_batch(_as_triple(batch), epoch_idx, batch_idx)

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        self.observe("evaluate_batch_data", batch)
        return super().evaluate_batch(_as_triple(batch))

    def get_batch_length(self, batch: Any) -> int:
        if not isinstance(batch, Graphs):
            return super().get_batch_length(batch)
        event("get_batch_length", num_graphs=batch.num_graphs)
        return batch.num_graphs


def _as_triple(batch: Any) -> Any:
    """The batch as BaseTrial's ``(x, y, index)``, floats as the model wants them."""
    x, y, index = unpack(batch)
    return x.float(), y.float(), index


def _described(batch: Any) -> Any:
    """The batch's structure and values; a trial-defined object by its class and fields."""
    if isinstance(batch, Graphs):
        return {"Graphs": {"x": batch.x, "y": batch.y, "index": batch.index, "num_graphs": batch.num_graphs}}
    return batch


class Reversed(Sampler):
    """A sampler of the user's own: the records in reverse order."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.length - 1, -1, -1))

    def __len__(self) -> int:
        return self.length


def seed_worker(worker_id: int) -> None:
    """A ``worker_init_fn``: each loader worker seeds numpy (the usual recipe)."""
    np.random.seed(torch.initial_seed() % 2**32)


class LoaderArguments(BaseTrial):
    """``DataLoader`` built with the arguments hparam ``loader`` names: ``drop_last``
    (19 records, batches of 4), ``sampler`` (a user sampler), ``batch_sampler``, ``workers``
    (two worker processes, ``worker_init_fn``, ``persistent_workers``, ``prefetch_factor``,
    ``pin_memory``, ``timeout``) or ``torch`` (a plain ``torch.utils.data.DataLoader`` after
    ``disable_dataset_reproducibility_checks``)."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.variant = hparam(context, "loader", "drop_last")
        if self.variant == "torch":
            context.experimental.disable_dataset_reproducibility_checks()

    def build_training_data_loader(self) -> Any:
        batch_size = self.context.get_per_slot_batch_size()
        if self.variant == "drop_last":
            return pytorch.DataLoader(Regression(19), batch_size=batch_size, drop_last=True)
        if self.variant == "sampler":
            return pytorch.DataLoader(Regression(), batch_size=batch_size, sampler=Reversed(RECORDS))
        if self.variant == "batch_sampler":
            sampler = BatchSampler(Reversed(18), batch_size=batch_size, drop_last=False)
            return pytorch.DataLoader(Regression(18), batch_sampler=sampler)
        if self.variant == "workers":
            return pytorch.DataLoader(
                Regression(), batch_size=batch_size, num_workers=2, worker_init_fn=seed_worker,
                persistent_workers=True, prefetch_factor=3, pin_memory=False, timeout=60,
            )
        return torch.utils.data.DataLoader(Regression(), batch_size=batch_size)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        Path("trained.txt").write_text(f"{self.trained} {os.getpid()}")  # read while it runs
        return metrics

    def build_validation_data_loader(self) -> Any:
        if self.variant == "torch":
            return torch.utils.data.DataLoader(Regression(8, seed=1), batch_size=4)
        return pytorch.DataLoader(Regression(9, seed=1), batch_size=4, drop_last=self.variant == "drop_last")


class PlainTorchLoader(BaseTrial):
    """Misuse: a plain ``torch.utils.data.DataLoader`` without disabling the reproducibility
    checks."""

    def build_training_data_loader(self) -> Any:
        return torch.utils.data.DataLoader(Regression(), batch_size=self.context.get_per_slot_batch_size())
