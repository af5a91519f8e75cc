"""The members the training loop and the trial context share, named in one place.

:class:`hookdet.trial_api.context.PyTorchTrialContext` is Determined's public face for trials; the loop in
:mod:`hookdet.loop.core_loop` also needs a few of its internals every batch (where it cannot afford an
indirection). Those members keep their leading underscore, so trials and plugins do not take them
for API, and are listed here: the loop uses these and no other underscore member of the context
(``tests/test_plugin_contract.py`` checks it), and a change to one of them is a change to this
interface.
"""
from __future__ import annotations

from typing import Any, Protocol


class ContextExperimentalForLoop(Protocol):
    """What the loop reads of ``context.experimental``."""

    #: ``disable_auto_to_device()`` not called: the loop moves each batch to the device.
    _auto_to_device: bool
    #: ``disable_dataset_reproducibility_checks()`` not called: plain DataLoaders are refused.
    _data_repro_checks: bool


class ContextForLoop(Protocol):
    """What the loop reads and writes of the trial context, per batch or per run."""

    experimental: ContextExperimentalForLoop
    #: The batch being trained; the loop sets it before ``train_batch``.
    _current_batch_idx: int
    #: ``set_stop_requested(True)`` was called; the loop stops after the current batch.
    _stop_requested: bool
    #: The context's ``wrap_reducer`` registry; the loop resets and reduces it per workload.
    _reducers: Any

    def _bind_hooks(self) -> None:
        """Decide again which per-step hooks have implementations (after registrations)."""

    #: Whether the run's precision takes part in the steps (its ``batch_end`` then runs in
    #: :meth:`_end_batch` every batch).
    _precision_steps: bool

    def _end_batch(self, batch_idx: int, epoch_ended: bool, epoch_idx: int) -> None:
        """Per-batch bookkeeping after ``train_batch``: the precision's batch end, then per-batch
        and per-epoch schedulers."""


#: The underscore members of the context the loop may use (``context.X`` or
#: ``context.experimental.X``).
LOOP_MEMBERS = frozenset(
    {"_current_batch_idx", "_stop_requested", "_reducers", "_bind_hooks", "_end_batch", "_precision_steps",
     "_auto_to_device", "_data_repro_checks"}
)
