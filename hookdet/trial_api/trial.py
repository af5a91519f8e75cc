"""The trial API a user implements: ``PyTorchTrial``, ``PyTorchCallback``, training units.

Names, signatures and semantics follow ``determined.pytorch`` so that a trial written for
Determined runs here after one changed import.
"""
from __future__ import annotations

import abc
import collections.abc
import inspect
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

import torch

from hookdet.trial_api.context import PyTorchTrialContext
from hookdet.errors import TrialError  # noqa: F401 (re-exported: the trial API's error, defined with hookdet's others)

if TYPE_CHECKING:  # pragma: no cover
    from hookdet.data.loader import DataLoader
    from hookdet.metrics.reducers import Reducer


class TrainUnit:
    """A length of training: an int is a period (every ``n``), a container a schedule.

    ``Batch(100)`` means "every 100 batches" as a period and "100 batches" as a length;
    ``Batch([5, 10])`` means "after batch 5 and after batch 10".
    """

    def __init__(self, value: Union[int, collections.abc.Container]) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, collections.abc.Container)):
            raise TypeError(
                f"{type(self).__name__}() takes an int or a container of ints, got {value!r}"
            )
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{type(self).__name__}({value}): the value must be at least 1")
        self.value = value

    def should_stop(self, step_num: int) -> bool:
        """Whether ``step_num`` (counted in this unit, from 1) ends a period or is scheduled."""
        if isinstance(self.value, int):
            return step_num > 0 and step_num % self.value == 0
        return step_num in self.value

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.value == other.value  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self.value)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"


class Batch(TrainUnit):
    """A number of batches (global batches: one step of every rank)."""


class Epoch(TrainUnit):
    """A number of epochs; an epoch is one pass of the chief's training loader."""


class ShouldExit(Exception):
    """Raise from trial code to stop training cleanly.

    The loop checkpoints before exiting unless ``skip_exit_checkpoint`` is True.
    """

    def __init__(self, skip_exit_checkpoint: bool = False) -> None:
        super().__init__("training was asked to exit")
        self.skip_exit_checkpoint = skip_exit_checkpoint


class PyTorchTrial(abc.ABC):
    """Determined's ``PyTorchTrial``: the model, optimizers and data of one training run.

    Override ``train_batch``, the two loader builders, and exactly one of ``evaluate_batch`` or
    ``evaluate_full_dataset``.
    """

    #: The context class a trial is constructed with (Determined's attribute).
    trial_context_class = PyTorchTrialContext
    #: The loop that drives the trial (Determined's attribute): :class:`hookdet.loop.core_loop.TrainingLoop`,
    #: which sets it when it is defined, the loop sitting above the trial API in the import layers.
    trial_controller_class: Any = None

    @abc.abstractmethod
    def __init__(self, context: "PyTorchTrialContext") -> None:
        """Build and wrap models, optimizers and schedulers through ``context``."""

    @abc.abstractmethod
    def train_batch(
        self, batch: Any, epoch_idx: int, batch_idx: int
    ) -> Union[torch.Tensor, Dict[str, Any]]:
        """Train on one batch; return a dict of metrics (or a tensor, meaning ``{"loss": t}``)."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> "DataLoader":
        """Return a :class:`hookdet.pytorch.DataLoader` of training batches."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> "DataLoader":
        """Return a :class:`hookdet.pytorch.DataLoader` of validation batches."""

    def build_callbacks(self) -> Dict[str, "PyTorchCallback"]:
        """Return callbacks by name; their state is checkpointed under that name."""
        return {}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> Dict[str, Any]:
        """Evaluate one validation batch; return a dict of metrics reduced per metric."""
        raise NotImplementedError

    def evaluate_full_dataset(self, data_loader: torch.utils.data.DataLoader) -> Dict[str, Any]:
        """Evaluate the whole validation set in one call (chief only under distribution)."""
        raise NotImplementedError

    def evaluation_reducer(self) -> Union["Reducer", Dict[str, "Reducer"]]:
        """How ``evaluate_batch`` metrics are reduced: one :class:`Reducer` or one per metric."""
        from hookdet.metrics.reducers import Reducer

        return Reducer.AVG

    def get_batch_length(self, batch: Any) -> int:
        """The number of records in ``batch``; override it for a batch type of your own.

        Called on every validation batch, before ``evaluate_batch``, for the count of records
        validated (logged at DEBUG), as Determined does. Unlike Determined, hookdet does not call
        it on training batches, where Determined computes a throughput it never reports
        (expected difference ``batch-length-in-training``)."""
        from hookdet.data.batch_moving import data_length

        return data_length(batch)


def overridden_evaluation_method(trial: PyTorchTrial) -> str:
    """Return ``"evaluate_batch"`` or ``"evaluate_full_dataset"``: the one the trial overrides.

    Raises :class:`TrialError` when it overrides neither or both, as Determined requires exactly one.
    """
    overridden = [
        name
        for name in ("evaluate_batch", "evaluate_full_dataset")
        if getattr(type(trial), name) is not getattr(PyTorchTrial, name)
    ]
    if len(overridden) != 1:
        which = "neither" if not overridden else "both"
        raise TrialError(
            f"{type(trial).__qualname__} overrides {which} of evaluate_batch and "
            "evaluate_full_dataset; a PyTorchTrial must override exactly one"
        )
    return overridden[0]


def evaluate_batch_takes_index(trial: PyTorchTrial) -> bool:
    """Whether the trial's ``evaluate_batch`` accepts ``batch_idx`` (it is optional, as in Determined)."""
    parameters = inspect.signature(trial.evaluate_batch).parameters
    return "batch_idx" in parameters or len(parameters) >= 2


class PyTorchCallback:
    """Determined's callback: override any lifecycle method; each becomes a hook implementation.

    ``state_dict``/``load_state_dict`` are saved in and restored from checkpoints under the name
    the trial gives the callback in ``build_callbacks``.
    """

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
        """The trial is built; training resumes at ``first_batch_idx``."""

    def on_training_start(self) -> None:
        """Training is about to draw its first batch."""

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        """Epoch ``epoch_idx`` starts (the zero-argument form is deprecated but still called)."""

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        """Epoch ``epoch_idx`` ended."""

    def on_training_workload_end(
        self, avg_metrics: Dict[str, Any], batch_metrics: List[Dict[str, Any]]
    ) -> None:
        """A training workload ended with these metrics."""

    def on_validation_start(self) -> None:
        """Validation starts."""

    def on_validation_epoch_start(self) -> None:
        """The first validation batch is about to be evaluated."""

    def on_validation_epoch_end(self, outputs: List[Any]) -> None:
        """All validation batches were evaluated."""

    def on_validation_end(self, metrics: Dict[str, Any]) -> None:
        """Validation finished with ``metrics``."""

    def on_checkpoint_load_start(self, checkpoint: Dict[str, Any]) -> None:
        """A checkpoint is about to be applied."""

    def on_checkpoint_save_start(self, checkpoint: Dict[str, Any]) -> None:
        """A checkpoint is about to be written."""

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        """A checkpoint's files are written."""

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        """A checkpoint is committed to storage."""

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """Checkpointing finished."""

    def on_before_optimizer_step(self, parameters: List[torch.nn.Parameter]) -> None:
        """The optimizer is about to step these parameters."""

    def on_trial_shutdown(self) -> None:
        """The trial shuts down."""

    def state_dict(self) -> Dict[str, Any]:
        """State to checkpoint (plain values and tensors only)."""
        return {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
