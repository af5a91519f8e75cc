"""``Run``: everything one training run shares with plugins, and ``TrainState``, its counters."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, Optional, Tuple

from hookdet.plugins.selection import Launch
from hookdet.runs.files import TENSORBOARD_DIR
from hookdet.loop.stash import Stash, StashKey

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from hookdet.config import ExperimentConfig
    from hookdet.trial_api.context import PyTorchTrialContext
    from hookdet.distributed.context import DistributedContext
    from hookdet.exit_codes import ExitReason
    from hookdet.plugins.manager import PluginManager
    from hookdet.checkpoints.storage import CheckpointStorage
    from hookdet.runs.metrics import ReportLog
    from hookdet.trial_api.trial import PyTorchTrial


@dataclasses.dataclass
class TrainState:
    """The loop's counters: what a checkpoint needs besides the objects' own state."""

    batches_trained: int = 0
    epoch_length: int = 0
    last_validation_batch: Optional[int] = None
    last_checkpoint_batch: Optional[int] = None
    latest_checkpoint: Optional[str] = None
    best_validation: Optional[float] = None
    validation_history: list = dataclasses.field(default_factory=list)

    @property
    def epoch_idx(self) -> int:
        """The epoch the next batch belongs to."""
        return self.batches_trained // self.epoch_length if self.epoch_length else 0

    def state_dict(self) -> Dict[str, Any]:
        """Plain values only, so a checkpoint loads with ``weights_only=True``."""
        return dataclasses.asdict(self)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore counters saved by ``state_dict``."""
        for field in dataclasses.fields(self):
            if field.name in state:
                setattr(self, field.name, state[field.name])


#: The trial's ``build_callbacks()`` by name, once a plugin runs them (``hookdet_add_callbacks``);
#: their state goes into checkpoints. Absent when the trial has none running.
TRIAL_CALLBACKS: StashKey[Dict[str, Any]] = StashKey("trial callbacks")
#: The metrics of each batch of the current workload, in order, as ``train_batch`` returned them
#: (tensors possibly on the device); the loop appends to it. For observers that read the latest
#: batch without a per-batch hook: read only, and never force a device sync.
WORKLOAD_METRICS: StashKey[list] = StashKey("workload metrics")
#: A Core API script's own word of how far it is and what it does: ``{"progress": 0.42,
#: "status": "evaluating"}`` (either may be absent), from ``core_context.train.report_progress``
#: and ``set_status``. Absent for a trial class (its progress is batches of ``max_batches``).
REPORTED_PROGRESS: StashKey[Dict[str, Any]] = StashKey("reported progress")
#: Whether reported metrics go to TensorBoard (``context.set_enable_tensorboard_logging``);
#: absent means yes. A TensorBoard plugin reads it; the trial's own writer works either way.
TENSORBOARD_METRICS: StashKey[bool] = StashKey("tensorboard metrics")


@dataclasses.dataclass
class Run:
    """One training run, as plugins see it.

    Built by :func:`hookdet.loop.trainer.init`; the loop fills ``trial`` and ``context`` as they exist.
    """

    config: "ExperimentConfig"
    run_dir: Path
    plugins: "PluginManager"
    model_dir: Path
    hparams: Dict[str, Any]
    trial_seed: int
    distributed: "DistributedContext" = None  # type: ignore[assignment]
    device: "torch.device" = None  # type: ignore[assignment]
    storage: Optional["CheckpointStorage"] = None
    context: Optional["PyTorchTrialContext"] = None
    trial: Optional["PyTorchTrial"] = None
    state: TrainState = dataclasses.field(default_factory=TrainState)
    resume_from: Optional[str] = None
    #: The checkpoint a fresh run warm-starts from (``searcher.source_checkpoint_uuid``).
    warm_start_from: Optional[str] = None
    #: The batch count ``Trainer.fit`` trains to (its ``max_length``); set once the data loaders
    #: are built, after ``on_trial_startup`` and before ``on_training_start``.
    max_batches: Optional[int] = None
    #: Batches the chief validates per pass, when the validation loader has a length; set with
    #: ``max_batches`` (for progress displays).
    validation_length: Optional[int] = None
    #: The run's ``metrics.jsonl`` (:class:`hookdet.runs.metrics.ReportLog`), written by the loop
    #: on the chief; None on other ranks.
    report_log: Optional["ReportLog"] = None
    #: The batches of a workload a preemption stopped between two reports, each rank's own:
    #: the loop sets it before the stop's checkpoint, which keeps it; a resume restores it and
    #: the loop starts its first workload with them (None otherwise).
    carried_workload: Optional[list] = None
    #: The batch this process started training from (after any restore); None until training
    #: starts. A run that fails with nothing trained past it changed nothing of its history.
    first_batch: Optional[int] = None
    #: The run directory's records as they were before this process wrote its own (file name
    #: -> bytes, None where absent), put back by :func:`hookdet.runs.record.record_end` when a
    #: resume fails before training a batch.
    prior_records: Optional[Dict[str, Optional[bytes]]] = None
    #: Why training ended (:class:`hookdet.exit_codes.ExitReason`, equal to its string value).
    exit_reason: Optional["ExitReason"] = None
    #: Which run this is: made when the run directory is first used, kept across resumes into it.
    run_id: Optional[str] = None
    #: The plugins this run loaded from the experiment file's ``plugins:`` list, resolved once
    #: (:mod:`hookdet.plugins.selection`) plus any passed to ``init(plugins=...)``: ask this, never the
    #: raw list, whether a plugin is on.
    plugin_names: Tuple[str, ...] = ()
    #: Names the experiment file removed with ``no:<name>``; never switched on later.
    removed_plugins: FrozenSet[str] = frozenset()
    #: How this process was started (ranks, launcher): the facts the plugin selection was made for.
    launch: Launch = dataclasses.field(default_factory=Launch)
    #: Per-run state by typed key (:mod:`hookdet.loop.stash`): each plugin's own, and what the host
    #: shares with plugins under :data:`TRIAL_CALLBACKS`, :data:`WORKLOAD_METRICS` and
    #: :data:`TENSORBOARD_METRICS`.
    stash: Stash = dataclasses.field(default_factory=Stash)

    @property
    def hook(self) -> Any:
        """The pluggy hook relay: ``run.hook.on_validation_end(metrics=...)``."""
        return self.plugins.hook

    @property
    def is_chief(self) -> bool:
        """Whether this process is rank 0."""
        return self.distributed.is_chief

    @property
    def tensorboard_dir(self) -> Path:
        """Where TensorBoard files of this run go (never None)."""
        return self.run_dir / TENSORBOARD_DIR

    def options(self, plugin_name: str) -> Dict[str, Any]:
        """The ``plugin_config`` block for ``plugin_name`` (empty when absent)."""
        return dict((self.config.plugin_config or {}).get(plugin_name) or {})
