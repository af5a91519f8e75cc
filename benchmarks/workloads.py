"""The two benchmark workloads: the same model, data, optimizer and seed for every framework.

This module imports only torch (and the standard library), because every benchmark mode imports
it, and the Lightning and Determined modes run in virtual environments of their own that do not
have hookdet installed.

Each workload is a :class:`Workload`: synthetic, deterministic data (a fixed ``torch.Generator``,
nothing downloaded), a model built right after ``torch.manual_seed(seed)``, plain SGD with
momentum, cross-entropy, a fixed batch size and step count. Building the model after seeding the
global generator *inside the workload* makes the initial weights (and, for the CNN, the dropout
stream that follows) the same in every mode, whatever a framework does to seed itself first.

* ``mlp``: a tiny MLP on 32 features. A step costs so little that framework overhead per batch
  (hooks, bookkeeping, data-loader plumbing) is most of what differs between modes.
* ``cnn``: a small CNN with dropout on 3x32x32 images. A step costs milliseconds on one thread,
  so a well-behaved framework should be within noise of the raw loop.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

#: Steps per timing block (see ``workers.py``): the reporting period every mode uses, so each
#: block of this many consecutive steps holds exactly one report.
BLOCK_STEPS = 100
#: The seed every mode gives ``torch.manual_seed`` right before building the model.
MODEL_SEED = 1234
#: The seed of the synthetic data (a private generator: the global RNG is not touched).
DATA_SEED = 4321


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark configuration; every mode reads its sizes and builders from here.

    ``steps`` is how many training batches a fit runs; ``warmup`` how many first steps the
    per-step timing leaves out (allocator and autograd warm-up, first epoch's caches).
    """

    name: str
    batch_size: int
    train_records: int
    validation_records: int
    steps: int
    warmup: int
    learning_rate: float
    momentum: float
    make_model: Callable[[], nn.Module]
    make_data: Callable[[int, torch.Generator], Tuple[torch.Tensor, torch.Tensor]]

    def build_model(self) -> nn.Module:
        """The model, initialised from :data:`MODEL_SEED` (seeds torch's global generator)."""
        torch.manual_seed(MODEL_SEED)
        return self.make_model()

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """SGD with momentum (its step is a handful of foreach kernels: cheap, like the model)."""
        return torch.optim.SGD(model.parameters(), lr=self.learning_rate, momentum=self.momentum)

    def datasets(self) -> Tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
        """(training, validation) ``TensorDataset``s, identical in every process."""
        generator = torch.Generator().manual_seed(DATA_SEED)
        train = self.make_data(self.train_records, generator)
        validation = self.make_data(self.validation_records, generator)
        return torch.utils.data.TensorDataset(*train), torch.utils.data.TensorDataset(*validation)

    @property
    def epoch_length(self) -> int:
        """Training batches per epoch (the last, partial batch is kept, as torch's default)."""
        return -(-self.train_records // self.batch_size)

    def scaled(self, steps: int, warmup: int) -> "Workload":
        """The same workload with another step count and warm-up (smoke tests, quick runs)."""
        return dataclasses.replace(self, steps=steps, warmup=warmup)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The training and validation loss of both workloads."""
    return nn.functional.cross_entropy(logits, labels)


def _teacher_labels(inputs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Labels from a fixed random linear teacher, so the task is learnable and the loss falls."""
    flat = inputs.reshape(len(inputs), -1)
    teacher = torch.randn(flat.shape[1], 10, generator=generator)
    return (flat @ teacher).argmax(dim=1)


def _mlp_data(records: int, generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    inputs = torch.randn(records, 32, generator=generator)
    return inputs, _teacher_labels(inputs, generator)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _cnn_data(records: int, generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    inputs = torch.randn(records, 3, 32, 32, generator=generator)
    return inputs, _teacher_labels(inputs, generator)


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.25),
        nn.Linear(32 * 8 * 8, 10),
    )


WORKLOADS: Dict[str, Workload] = {
    "mlp": Workload(
        name="mlp",
        batch_size=32,
        train_records=2048,
        validation_records=512,
        steps=4000,
        warmup=200,
        learning_rate=0.05,
        momentum=0.9,
        make_model=_mlp,
        make_data=_mlp_data,
    ),
    "cnn": Workload(
        name="cnn",
        batch_size=32,
        train_records=1024,
        validation_records=256,
        steps=800,
        warmup=100,
        learning_rate=0.02,
        momentum=0.9,
        make_model=_cnn,
        make_data=_cnn_data,
    ),
}


def names() -> List[str]:
    """The workload names, in the order the report lists them."""
    return list(WORKLOADS)
