"""Checkpoints: save every piece of state, restore it exactly, keep what the policy names.

Saved (in ``state_dict.pth``, Determined's keys where Determined has one):

- ``models_state_dict``: every wrapped model, *unwrapped* (``context.unwrapped_models``), so a
  DDP or other wrapper's ``module.`` prefix never reaches the file and a checkpoint written with
  any number of ranks loads into a plain ``nn.Module``;
- ``optimizers_state_dict``, ``lr_schedulers_state_dict``;
- ``callbacks``: each ``PyTorchCallback``'s ``state_dict()`` under its ``build_callbacks`` name;
  ``plugins``: the same for every plugin that has ``state_dict``/``load_state_dict``;
- ``trial_state``: the loop's counters, which are also the data position (the samplers are pure
  functions of seed, epoch and batches consumed, so nothing else about the loaders is needed);
- ``rng_state``: every rank's Python, NumPy, torch and CUDA generator state;
- ``workloads`` (only when a preemption stopped training between two reports): every rank's
  metrics of the batches trained since the last report, which the resumed run's next report
  averages in, so its reports equal an uninterrupted run's;
- ``gradients`` (only when some gradient exists, e.g. in the middle of an
  ``aggregation_frequency`` window): every rank's accumulated ``.grad`` tensors, without which
  a stop inside the window would lose the batches already accumulated.

The files go through the run's storage (a local directory or S3), ``metadata.json`` last; see
:mod:`hookdet.checkpoints.format` for verification.

Writes are asynchronous by default (:mod:`hookdet.checkpoints.writer`): at the boundary the state
is copied to host memory and training goes on while a background thread writes it; at most one
write is in flight, and the next checkpoint, a resume and the end of the run wait for it.
``on_checkpoint_write_end`` (chief), ``on_checkpoint_upload_end``, ``on_checkpoint_end`` and
retention fire on the training thread once the write has really finished: at the next epoch end
or validation that finds it done, the next checkpoint, or the end of the run, whichever comes
first. ``on_checkpoint_write_end`` gets the published checkpoint directory (it exists, and keeps
existing, as in Determined); files it adds are sealed into the manifest by an atomic rewrite of
``metadata.json``. ``plugin_config: {checkpoint: {async: false}}`` writes synchronously instead.
With remote storage (S3) and an ``on_checkpoint_write_end`` implementation, writes are
synchronous and the hook gets the local staging directory before upload (as Determined's).
A trial whose callbacks override ``on_checkpoint_write_end``, ``on_checkpoint_upload_end`` or
``on_checkpoint_end`` also writes synchronously, so its callbacks see them in Determined's order,
right after ``on_checkpoint_save_start`` and before the next batch.

A corrupt, foreign or mismatched checkpoint is refused before anything is applied, with a
message saying what does not match.

Restoring is in :mod:`.restore`; which checkpoints retention deletes, in
:mod:`hookdet.checkpoints.retention` (the Core API's checkpoints follow the same rule).
"""
from __future__ import annotations

import logging
import sys
import uuid as uuid_module
from pathlib import Path
from typing import Any, Dict, List, Optional

import pydantic
import torch

from hookdet.plugin import (
    TRIAL_CALLBACKS,
    CheckpointNotFoundError,
    ExitReason,
    PyTorchCallback,
    get_cluster_info,
    hookimpl,
    options_for,
    rng,
)
from hookdet.plugin.checkpoint import (
    BackgroundWriter,
    HostSnapshot,
    checkpoints_to_delete,
    fmt,
    noting_the_write,
    report_resume,
    user_index,
    write_failed,
)
from .restore import find, located, metadata_of, plugin_call, restore_checkpoint, trial_spec

logger = logging.getLogger("hookdet")


class CheckpointPlugin:
    """Answers ``hookdet_save_checkpoint`` and ``hookdet_load_checkpoint``; applies retention.

    Its own state (the checkpoints retention still tracks) is saved in every checkpoint, so a
    resumed run keeps collecting the checkpoints written before it.
    """

    class Options(pydantic.BaseModel):
        """``plugin_config.checkpoint``."""

        model_config = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
        asynchronous: bool = pydantic.Field(
            True, alias="async", description="write checkpoints in the background while training goes on"
        )

    def __init__(self, options: Any = None) -> None:
        #: Whether checkpoints are written in the background (``plugin_config.checkpoint.async``).
        self.asynchronous: bool = options_for(CheckpointPlugin, options, "checkpoint").asynchronous
        self._writer = BackgroundWriter()
        self._snapshot = HostSnapshot()
        #: The checkpoint being written in the background: uuid, batches trained, metric.
        self._pending: Optional[Dict[str, Any]] = None
        #: Checkpoints of this trial that retention tracks: uuid, batches trained, metric.
        self._saved: List[Dict[str, Any]] = []
        #: Batches trained in each checkpoint asked about (``hookdet_resume_point``) or restored.
        self._resume_points: Dict[str, int] = {}
        #: Where each checkpoint asked about is (restore.find), looked up once.
        self._found: Dict[str, Any] = {}

    @hookimpl
    def hookdet_resume_point(self, run: Any, checkpoint: str) -> int:
        """Batches trained in ``checkpoint`` (what ``context.get_initial_batch()`` reports).

        Exact once the checkpoint is restored; before that, read from its metadata without
        loading its state.
        """
        if checkpoint not in self._resume_points:
            self._resume_points[checkpoint] = int(self._metadata(run, checkpoint).get("steps_completed", 0))
        return self._resume_points[checkpoint]

    @hookimpl
    def hookdet_resume_uuid(self, run: Any, checkpoint: str) -> Optional[str]:
        """The storage id of ``checkpoint`` (what ``on_trial_startup`` gets), read from its
        metadata before its state is loaded."""
        return self._metadata(run, checkpoint).get("uuid")

    @hookimpl
    def hookdet_resume_run_id(self, run: Any, checkpoint: str) -> Optional[str]:
        """The run id that ``checkpoint``'s metadata records (the run that wrote it)."""
        written_by = self._metadata(run, checkpoint).get("run_id")
        return None if written_by is None else str(written_by)

    def _metadata(self, run: Any, checkpoint: str) -> Dict[str, Any]:
        return metadata_of(self._find(run, checkpoint))

    def _find(self, run: Any, checkpoint: str) -> Any:
        """Where ``checkpoint`` is, looked up once per run (a run directory's newest intact
        checkpoint does not change while this run holds its lock)."""
        if checkpoint not in self._found:
            self._found[checkpoint] = find(run, checkpoint)
        return self._found[checkpoint]

    # ------------------------------------------------------------------ plugin state

    def state_dict(self) -> Dict[str, Any]:
        """The retention list (checkpoints written before the one being saved)."""
        return {"retained": [dict(entry) for entry in self._saved]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the retention list saved by :meth:`state_dict`."""
        self._saved = [dict(entry) for entry in state.get("retained", [])]

    # ------------------------------------------------------------------ hooks

    @hookimpl
    def hookdet_save_checkpoint(self, run: Any) -> Optional[str]:
        """Write a checkpoint on the chief (gathering every rank's RNG and gradients first):
        in the background from a host snapshot, or, in synchronous mode, before returning."""
        self.finish_write(run, wait=True, before="the next checkpoint")
        rank_states = run.distributed.gather(
            {"rng": rng.capture_rng_state(), "gradients": _gradients(run.context), "workload": run.carried_workload}
        )
        in_background = (
            self.asynchronous
            and not _callbacks_await_completion(run.stash.get(TRIAL_CALLBACKS, {}))
            and (_publishes_locally(run.storage) or not run.plugins.implemented("on_checkpoint_write_end"))
        )
        storage_id = location = None
        if run.is_chief:
            storage_id = str(uuid_module.uuid4())
            write = self._prepare(run, storage_id, rank_states, snapshot=in_background)
            if in_background:
                self._writer.submit(storage_id, write, run.storage)
            else:
                try:
                    location = write()
                except Exception as error:
                    raise write_failed(storage_id, error, run.storage) from error
        storage_id = run.distributed.broadcast(storage_id)
        self._pending = {
            "uuid": storage_id,
            "steps": run.state.batches_trained,
            "metric": _validation_at(run.state, run.state.batches_trained),
            "run_id": run.run_id,
        }
        if not in_background:
            self._complete(run, run.distributed.broadcast(location))
        return storage_id

    @property
    def last_write_seconds(self) -> Optional[float]:
        """How long the last background write took, from the snapshot to its publication."""
        return self._writer.last_duration

    def finish_write(self, run: Any, wait: bool, before: str = "") -> None:
        """Complete the checkpoint written in the background, if it is done (or ``wait``).

        Every rank calls this at the same points (the chief's progress is broadcast), and each
        fires the completion hooks; a failed write raises on every rank, naming the checkpoint.
        """
        if self._pending is None:
            return
        distributed = run.distributed
        if not wait:
            ready = self._writer.done() if run.is_chief else None
            if distributed.size > 1:
                ready = distributed.broadcast(ready)
            if not ready:
                return
        outcome: Any = None
        failure: Optional[fmt.CheckpointError] = None
        if run.is_chief:
            try:
                outcome = (self._writer.wait(before), None)
            except fmt.CheckpointError as error:
                failure, outcome = error, (None, str(error))
        if distributed.size > 1:
            outcome = distributed.broadcast(outcome)
        # A broadcast that brought nothing (a distributed context whose collectives are the
        # identity) leaves this rank nothing to report, as a synchronous write would.
        location, message = outcome if outcome is not None else (None, None)
        if message is not None:
            self._pending = None
            raise failure if failure is not None else fmt.CheckpointError(message)
        self._complete(run, location)

    def _complete(self, run: Any, location: str) -> None:
        """The write of ``self._pending`` finished: fire the completion hooks, apply retention."""
        pending, self._pending = self._pending, None
        storage_id = pending["uuid"]
        if run.is_chief:
            logger.info("checkpoint saved at batch %d: %s", pending["steps"], _shown(location, run.run_dir))
            directory = run.storage.local_dir(storage_id)
            if directory is not None:
                before = fmt.file_stats(directory)
                run.hook.on_checkpoint_write_end(run=run, checkpoint_dir=str(directory))
                fmt.reseal(directory, before)
            user_index.record(storage_id, run.storage.locator(), run.run_dir)
        run.state.latest_checkpoint = storage_id
        run.hook.on_checkpoint_upload_end(run=run, uuid=storage_id)
        run.hook.on_checkpoint_end(run=run, checkpoint_dir=location)
        if run.is_chief:
            self._saved.append(pending)
            self._retain(run, final=False)

    @hookimpl
    def on_training_epoch_end(self, run: Any, epoch_idx: int) -> None:
        """Complete a background write that has finished (every rank reaches epoch ends alike)."""
        if self._pending is not None:
            self.finish_write(run, wait=False)

    @hookimpl
    def on_validation_end(self, run: Any, metrics: Dict[str, Any]) -> None:
        """Complete a background write that has finished."""
        if self._pending is not None:
            self.finish_write(run, wait=False)

    @hookimpl
    def hookdet_load_checkpoint(self, run: Any, checkpoint: str) -> bool:
        """Restore everything from ``checkpoint``: a checkpoint directory, a run directory (its
        newest intact checkpoint) or a storage id."""
        self.finish_write(run, wait=True, before="a checkpoint is loaded")
        with located(self._find(run, checkpoint)) as (directory, hint_root, shown):
            metadata = restore_checkpoint(run, directory, hint_root, shown=shown)
        written_by = metadata.get("run_id")
        if run.is_chief:
            report_resume(run, metadata, shown)
        state = run.state
        self._resume_points[checkpoint] = state.batches_trained
        resumed = {
            "uuid": state.latest_checkpoint,
            "steps": state.batches_trained,
            "metric": _validation_at(state, state.batches_trained),
            "run_id": written_by,
        }
        # Retention tracks only this run's checkpoints: a fork never deletes its parent's.
        self._saved = [
            entry for entry in self._saved + [resumed]
            if entry["uuid"] != resumed["uuid"] or entry is resumed
        ]
        self._saved = [entry for entry in self._saved if entry.get("run_id") == run.run_id]
        return True

    @hookimpl
    def hookdet_warm_start(self, run: Any, checkpoint: str) -> bool:
        """Load ``checkpoint``'s state, not its place: training starts at batch 0 (Determined's
        warm start). The checkpoint stays its writer's: retention never counts it here."""
        with located(self._find(run, checkpoint)) as (directory, hint_root, shown):
            restore_checkpoint(run, directory, hint_root, warm_start=True, shown=shown)
        return True

    @hookimpl(tryfirst=True)
    def on_trial_shutdown(self, run: Any) -> None:
        """Wait for a write in flight; once training completed, apply retention exactly (the
        newest is no longer protected)."""
        if run.distributed is None:
            return
        if self._pending is not None:
            if sys.exc_info()[0] is None:
                self.finish_write(run, wait=True, before="the run ends")
            else:  # failing already: publish what was snapshotted, without collectives or hooks
                self._abandon_write(run)
        if not run.is_chief or run.storage is None:
            return
        if run.exit_reason == ExitReason.COMPLETED and self._saved:
            self._retain(run, final=True)

    # ------------------------------------------------------------------ saving

    def _abandon_write(self, run: Any) -> None:
        """The run is failing: let a background write finish (the snapshot is a valid checkpoint)
        but fire no hooks; a failure of the write is logged, not raised over the first error."""
        pending, self._pending = self._pending, None
        if run.is_chief and self._writer.busy:
            try:
                location = self._writer.wait("the failing run ends")
                logger.info("checkpoint %s saved at batch %d: %s", pending["uuid"], pending["steps"], location)
            except fmt.CheckpointError as error:
                logger.error("%s", error)

    def _prepare(self, run: Any, storage_id: str, rank_states: List[Dict[str, Any]], snapshot: bool) -> Any:
        """Build the checkpoint's state and metadata now; return the function that writes it
        under ``storage_id`` (returning its location). With ``snapshot`` the state is first
        copied to host memory, so the write may run while training changes the originals."""
        context, state = run.context, run.state
        trial_state = state.state_dict()
        # The checkpoint being written is, once loaded, the latest one, taken at this batch.
        trial_state.update(latest_checkpoint=storage_id, last_checkpoint_batch=state.batches_trained)
        checkpoint: Dict[str, Any] = {
            "models_state_dict": [model.state_dict() for model in context.unwrapped_models],
            "optimizers_state_dict": [optimizer.state_dict() for optimizer in context.optimizers],
            "lr_schedulers_state_dict": [s.state_dict() for s in context.lr_schedulers],
            "callbacks": {name: cb.state_dict() for name, cb in run.stash.get(TRIAL_CALLBACKS, {}).items()},
            "plugins": {
                name: plugin_call(name, plugin.state_dict)
                for name, plugin in run.plugins.named_plugins().items()
                if callable(getattr(plugin, "state_dict", None))
                and callable(getattr(plugin, "load_state_dict", None))
            },
            "trial_state": trial_state,
            "rng_state": [rank["rng"] for rank in rank_states],
        }
        if any(rank["gradients"] is not None for rank in rank_states):
            checkpoint["gradients"] = [rank["gradients"] for rank in rank_states]
        if any(rank["workload"] for rank in rank_states):
            checkpoint["workloads"] = [rank["workload"] for rank in rank_states]
        run.hook.on_checkpoint_save_start(run=run, checkpoint=checkpoint)
        fmt.check_weights_only(checkpoint, "checkpoint")  # a bad value fails here, before any write
        metadata = fmt.base_metadata(
            uuid=storage_id,
            steps_completed=state.batches_trained,
            trial_class=trial_spec(type(run.trial)),
            hparams=run.hparams,
            experiment_config=run.config.to_dict(),
            searcher_metric=run.config.searcher.metric,
            validation_metric=_validation_at(state, state.batches_trained),
            num_ranks=len(rank_states),
            run_id=run.run_id,
        )
        copy_done = None
        if snapshot:
            checkpoint, copy_done = self._snapshot.take(checkpoint)
        # Remote storage publishes on upload: the hook adds its files to the staging directory.
        storage = run.storage
        hook_in_staging = not snapshot and not _publishes_locally(storage)

        def write() -> str:
            if copy_done is not None:
                copy_done.synchronize()  # the device-to-host copies, ordered on the training stream
            with noting_the_write(run.run_dir, storage_id), storage.store_path(storage_id) as directory:
                directory = Path(directory)
                state_entry = fmt.write_state(directory, checkpoint)
                if hook_in_staging:
                    run.hook.on_checkpoint_write_end(run=run, checkpoint_dir=str(directory))
                fmt.write_metadata(directory, metadata, known_files={fmt.STATE_FILE: state_entry})
            return storage.location(storage_id)

        return write

    # ------------------------------------------------------------------ retention

    def _retain(self, run: Any, final: bool) -> None:
        """Delete the tracked checkpoints retention no longer keeps (chief only)."""
        spec = run.config.checkpoint_storage
        if spec is None and get_cluster_info() is None:
            return  # the Trainer API run bare, no retention configured: Determined keeps them all
        keep_latest = spec.save_trial_latest if spec is not None else 1
        keep_best = max(spec.save_trial_best, spec.save_experiment_best) if spec is not None else 1
        doomed = checkpoints_to_delete(
            [(entry["uuid"], entry["steps"], entry["metric"]) for entry in self._saved],
            keep_latest,
            keep_best,
            run.config.searcher.smaller_is_better,
            protect_newest=not final,
        )
        gone = set()
        for storage_id in doomed:
            try:
                run.storage.delete(storage_id)
            except CheckpointNotFoundError:
                # Already gone, or written to another storage by an earlier run of this trial:
                # nothing was deleted, so nothing is reported; it is no longer tracked.
                gone.add(storage_id)
                continue
            except Exception as error:  # a failed delete must not stop training; retried later
                logger.warning("could not delete checkpoint %s: %s", storage_id, error)
                continue
            gone.add(storage_id)
            user_index.forget(storage_id, deleted_by=f"retention (save_trial_latest: {keep_latest}, "
                                                      f"save_trial_best: {keep_best})", run_dir=run.run_dir)
            logger.info("retention deleted checkpoint %s", storage_id)
        self._saved = [entry for entry in self._saved if entry["uuid"] not in gone]


#: The callback methods that tell a trial a checkpoint is complete.
COMPLETION_CALLBACKS = ("on_checkpoint_write_end", "on_checkpoint_upload_end", "on_checkpoint_end")


def _callbacks_await_completion(callbacks: Dict[str, Any]) -> bool:
    """Whether any of the trial's callbacks overrides a checkpoint-completion method."""
    return any(
        getattr(type(callback), method, None) is not getattr(PyTorchCallback, method)
        for callback in callbacks.values()
        for method in COMPLETION_CALLBACKS
    )


def _publishes_locally(storage: Any) -> bool:
    """Whether ``storage`` publishes checkpoints as local directories, readable in place (asked
    with an id that names no checkpoint: the answer is the storage's, whatever the id)."""
    return storage.local_dir("any-checkpoint") is not None


def _shown(location: str, run_dir: Path) -> str:
    """A checkpoint's location as a log line shows it: relative to the run directory when inside
    it (one short line), else as it is (another directory, a URL)."""
    try:
        return str(Path(location).resolve().relative_to(Path(run_dir).resolve()))
    except ValueError:
        return location


def _gradients(context: Any) -> Optional[List[Dict[str, torch.Tensor]]]:
    """Every existing ``.grad`` of the unwrapped models, by parameter name; None when none."""
    found = False
    per_model = []
    for model in context.unwrapped_models:
        grads = {
            name: parameter.grad.detach().cpu()
            for name, parameter in model.named_parameters()
            if parameter.grad is not None
        }
        found = found or bool(grads)
        per_model.append(grads)
    return per_model if found else None


def _validation_at(state: Any, batches: int) -> Optional[float]:
    """The searcher metric of the validation at ``batches``, if one ran there."""
    if state.validation_history and state.validation_history[-1]["batches"] == batches:
        return state.validation_history[-1]["metric"]
    return None
