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
- ``gradients`` (only when some gradient exists, e.g. in the middle of an
  ``aggregation_frequency`` window): every rank's accumulated ``.grad`` tensors, without which
  a stop inside the window would lose the batches already accumulated.

The files go through the run's storage (a local directory or S3), ``metadata.json`` last; see
:mod:`hookdet.checkpoint_format` for verification. A corrupt, foreign or mismatched checkpoint
is refused before anything is applied, with a message saying what does not match.

Retention follows Determined's checkpoint garbage collection: a checkpoint is kept when it is
among the ``save_trial_latest`` newest (by batches trained), or among the
``max(save_trial_best, save_experiment_best)`` best by ``searcher.metric`` (a local experiment
has one trial, so its best are the experiment's best) — "best" counts only checkpoints taken
right after a validation, whose metric is that validation's. Determined collects garbage when
the experiment ends; hookdet applies the same rule after every checkpoint to bound disk use,
but while training goes on it never deletes the newest checkpoint (the resume point), even
when the counts are 0. When training completes, the rule is applied exactly.
"""
from __future__ import annotations

import contextlib
import logging
import math
import uuid as uuid_module
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from hookdet import checkpoint_format as fmt
from hookdet.markers import hookimpl
from hookdet.storage_backends import CheckpointNotFoundError, LocalStorage, StorageError

logger = logging.getLogger("hookdet")


class CheckpointPlugin:
    """Answers ``hookdet_save_checkpoint`` and ``hookdet_load_checkpoint``; applies retention.

    Its own state (the checkpoints retention still tracks) is saved in every checkpoint, so a
    resumed run keeps collecting the checkpoints written before it.
    """

    def __init__(self) -> None:
        self._run: Any = None
        #: Checkpoints of this trial that retention tracks: uuid, batches trained, metric.
        self._saved: List[Dict[str, Any]] = []
        #: Batches trained in each checkpoint asked about (``hookdet_resume_point``) or restored.
        self._resume_points: Dict[str, int] = {}

    @hookimpl
    def hookdet_resume_point(self, run: Any, checkpoint: str) -> int:
        """Batches trained in ``checkpoint`` (what ``context.get_initial_batch()`` reports).

        Exact once the checkpoint is restored; before that, read from its metadata without
        loading its state.
        """
        if checkpoint not in self._resume_points:
            with _located(run, checkpoint) as (directory, _hint_root):
                metadata = fmt.read_metadata(directory)
            self._resume_points[checkpoint] = int(metadata.get("steps_completed", 0))
        return self._resume_points[checkpoint]

    # ------------------------------------------------------------------ plugin state

    def state_dict(self) -> Dict[str, Any]:
        """The retention list (checkpoints written before the one being saved)."""
        return {"retained": [dict(entry) for entry in self._saved]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the retention list saved by :meth:`state_dict`."""
        self._saved = [dict(entry) for entry in state.get("retained", [])]

    # ------------------------------------------------------------------ hooks

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Remember the run (retention at shutdown needs it)."""
        self._run = run

    @hookimpl
    def hookdet_save_checkpoint(self, run: Any) -> Optional[str]:
        """Write a checkpoint on the chief (gathering every rank's RNG and gradients first)."""
        rank_states = run.distributed.gather(
            {"rng": fmt.rank_rng_state(), "gradients": _gradients(run.context)}
        )
        storage_id = checkpoint_dir = None
        if run.is_chief:
            storage_id, checkpoint_dir = self._write(run, rank_states)
        storage_id, checkpoint_dir = run.distributed.broadcast((storage_id, checkpoint_dir))
        run.state.latest_checkpoint = storage_id
        run.hook.on_checkpoint_upload_end(uuid=storage_id)
        run.hook.on_checkpoint_end(checkpoint_dir=checkpoint_dir)
        if run.is_chief:
            self._saved.append(
                {
                    "uuid": storage_id,
                    "steps": run.state.batches_trained,
                    "metric": _validation_at(run.state, run.state.batches_trained),
                }
            )
            self._retain(run, final=False)
        return storage_id

    @hookimpl
    def hookdet_load_checkpoint(self, run: Any, checkpoint: str) -> bool:
        """Restore everything from ``checkpoint``: a checkpoint directory, a run directory (its
        newest intact checkpoint) or a storage id."""
        with _located(run, checkpoint) as (directory, hint_root):
            _restore(run, directory, hint_root)
        state = run.state
        self._resume_points[checkpoint] = state.batches_trained
        resumed = {
            "uuid": state.latest_checkpoint,
            "steps": state.batches_trained,
            "metric": _validation_at(state, state.batches_trained),
        }
        self._saved = [entry for entry in self._saved if entry["uuid"] != resumed["uuid"]] + [resumed]
        return True

    @hookimpl
    def on_trial_shutdown(self) -> None:
        """Training completed: apply retention exactly (the newest is no longer protected)."""
        run = self._run
        if run is None or run.distributed is None or not run.is_chief or run.storage is None:
            return
        if run.exit_reason == "completed" and self._saved:
            self._retain(run, final=True)

    # ------------------------------------------------------------------ saving

    def _write(self, run: Any, rank_states: List[Dict[str, Any]]) -> Tuple[str, str]:
        context, state = run.context, run.state
        storage_id = str(uuid_module.uuid4())
        trial_state = state.state_dict()
        # The checkpoint being written is, once loaded, the latest one, taken at this batch.
        trial_state.update(latest_checkpoint=storage_id, last_checkpoint_batch=state.batches_trained)
        checkpoint: Dict[str, Any] = {
            "models_state_dict": [model.state_dict() for model in context.unwrapped_models],
            "optimizers_state_dict": [optimizer.state_dict() for optimizer in context.optimizers],
            "lr_schedulers_state_dict": [s.state_dict() for s in context.lr_schedulers],
            "callbacks": {name: cb.state_dict() for name, cb in _callbacks(run).items()},
            "plugins": {
                name: plugin.state_dict()
                for name, plugin in run.plugins.named_plugins().items()
                if callable(getattr(plugin, "state_dict", None))
                and callable(getattr(plugin, "load_state_dict", None))
            },
            "trial_state": trial_state,
            "rng_state": [rank["rng"] for rank in rank_states],
        }
        if any(rank["gradients"] is not None for rank in rank_states):
            checkpoint["gradients"] = [rank["gradients"] for rank in rank_states]
        run.hook.on_checkpoint_save_start(checkpoint=checkpoint)
        validation = _validation_at(state, state.batches_trained)
        with run.storage.store_path(storage_id) as directory:
            directory = Path(directory)
            state_entry = fmt.write_state(directory, checkpoint)
            run.hook.on_checkpoint_write_end(checkpoint_dir=str(directory))
            fmt.write_metadata(
                directory,
                fmt.base_metadata(
                    uuid=storage_id,
                    steps_completed=state.batches_trained,
                    trial_class=fmt.trial_spec(type(run.trial)),
                    hparams=run.hparams,
                    experiment_config=run.config.to_dict(),
                    searcher_metric=run.config.searcher.metric,
                    validation_metric=validation,
                    num_ranks=len(rank_states),
                ),
                known_files={fmt.STATE_FILE: state_entry},
            )
        location = run.storage.location(storage_id)
        logger.info("checkpoint %s saved at batch %d: %s", storage_id, state.batches_trained, location)
        return storage_id, location

    # ------------------------------------------------------------------ retention

    def _retain(self, run: Any, final: bool) -> None:
        """Delete the tracked checkpoints retention no longer keeps (chief only)."""
        spec = run.config.checkpoint_storage
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
                # Already gone, or written to another storage by an earlier run of this trial.
                pass
            except Exception as error:  # a failed delete must not stop training; retried later
                logger.warning("could not delete checkpoint %s: %s", storage_id, error)
                continue
            gone.add(storage_id)
            logger.info("retention deleted checkpoint %s", storage_id)
        self._saved = [entry for entry in self._saved if entry["uuid"] not in gone]


# ---------------------------------------------------------------------------------------------
# Restoring
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _located(run: Any, checkpoint: str) -> Iterator[Tuple[Path, Optional[Path]]]:
    """The local directory holding ``checkpoint`` and where its intact siblings are.

    ``checkpoint`` is a checkpoint directory, a run directory (its newest intact checkpoint) or
    a storage id (fetched through the run's storage). The second value is the folder to search
    for an intact alternative when this one is refused (None for remote storage).
    """
    path = Path(checkpoint)
    if path.exists():
        directory = fmt.resolve_checkpoint_dir(path)
        yield directory, directory.parent
        return
    if "/" in checkpoint or "\\" in checkpoint or checkpoint.startswith("."):
        raise fmt.CheckpointError(f"cannot resume: {checkpoint} does not exist")
    try:
        with run.storage.restore_path(checkpoint) as restored:
            restored = Path(restored)
            yield restored, restored.parent if isinstance(run.storage, LocalStorage) else None
    except StorageError as error:
        raise fmt.CheckpointError(f"cannot resume from checkpoint {checkpoint!r}: {error}") from error


def _restore(run: Any, directory: Path, hint_root: Optional[Path]) -> None:
    """Verify ``directory``, check it fits the trial, then apply every piece of state."""
    context, trial = run.context, run.trial

    def refuse(error: fmt.CheckpointError) -> fmt.CheckpointError:
        hint = fmt.intact_hint(hint_root, exclude=directory) if hint_root is not None else ""
        return fmt.CheckpointError(f"cannot resume: {error}{hint}")

    try:
        metadata = fmt.read_metadata(directory)
    except fmt.CheckpointError as error:
        raise refuse(error) from error
    _check_trial_class(metadata, type(trial), directory)
    try:
        state = fmt.load_state(directory, map_location="cpu")
    except fmt.CheckpointError as error:
        raise refuse(error) from error

    # Check the structure before applying anything, so a mismatch changes nothing.
    for kind, objects, key in (
        ("model", context.unwrapped_models, "models_state_dict"),
        ("optimizer", context.optimizers, "optimizers_state_dict"),
        ("LR scheduler", context.lr_schedulers, "lr_schedulers_state_dict"),
    ):
        saved = state.get(key, [])
        if len(saved) != len(objects):
            raise fmt.CheckpointError(
                f"cannot resume: checkpoint {directory} holds {len(saved)} {kind} state(s) but "
                f"{type(trial).__qualname__} wraps {len(objects)}; it was written by a trial "
                "with a different structure"
            )

    run.hook.on_checkpoint_load_start(checkpoint=state)
    _load_list("model", context.unwrapped_models, state.get("models_state_dict", []), directory)
    _load_list("optimizer", context.optimizers, state.get("optimizers_state_dict", []), directory)
    _load_list("LR scheduler", context.lr_schedulers, state.get("lr_schedulers_state_dict", []), directory)
    rank, size = run.distributed.rank, run.distributed.size
    gradients = state.get("gradients")
    if gradients:
        _restore_gradients(context, gradients[rank % len(gradients)], directory)
    for name, plugin_state in state.get("plugins", {}).items():
        plugin = run.plugins.named_plugins().get(name)
        if plugin is not None and callable(getattr(plugin, "load_state_dict", None)):
            plugin.load_state_dict(plugin_state)
        else:
            logger.warning("checkpoint %s holds state of plugin %r, which is not running", directory, name)
    callbacks = _callbacks(run)
    saved_callbacks = state.get("callbacks", {})
    for name, callback_state in saved_callbacks.items():
        if name in callbacks:
            callbacks[name].load_state_dict(callback_state)
        else:
            logger.warning("checkpoint %s holds state of callback %r, which the trial no longer builds", directory, name)

    epoch_length = run.state.epoch_length
    run.state.load_state_dict(state["trial_state"])
    if epoch_length and run.state.epoch_length != epoch_length:
        logger.warning(
            "checkpoint %s was written with %d batches per epoch, the training data now has %d: "
            "epochs are counted with the new length",
            directory, run.state.epoch_length, epoch_length,
        )
        run.state.epoch_length = epoch_length
    run.state.latest_checkpoint = metadata.get("uuid", directory.name)
    run.state.last_checkpoint_batch = run.state.batches_trained

    rng_states = state["rng_state"]
    if len(rng_states) != size:
        logger.warning(
            "checkpoint %s was written by %d rank(s), resuming on %d: RNG streams cannot continue exactly",
            directory, len(rng_states), size,
        )
    fmt.restore_rng_state(rng_states[rank % len(rng_states)])
    logger.info("resumed from checkpoint %s at batch %d", directory, run.state.batches_trained)


def _check_trial_class(metadata: Dict[str, Any], trial_class: type, directory: Path) -> None:
    """Refuse a checkpoint of another trial class; a moved module only earns a warning."""
    recorded = str(metadata.get("trial_class") or "")
    expected = fmt.trial_spec(trial_class)
    if recorded == expected:
        return
    recorded_name = recorded.partition(":")[2]
    if recorded_name == trial_class.__qualname__:
        logger.warning(
            "checkpoint %s was written by %s, resuming with %s (same class name, other module)",
            directory, recorded, expected,
        )
        return
    raise fmt.CheckpointError(
        f"cannot resume: checkpoint {directory} was written by trial class {recorded or '(unknown)'}, not "
        f"{expected}; resume it with the trial that wrote it"
    )


def _load_list(kind: str, objects: List[Any], states: List[Any], directory: Path) -> None:
    for index, (obj, obj_state) in enumerate(zip(objects, states)):
        try:
            obj.load_state_dict(obj_state)
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as error:
            name = type(getattr(obj, "scheduler", obj)).__name__
            raise fmt.CheckpointError(
                f"cannot resume: checkpoint {directory}: {kind} {index} ({name}) does not match "
                f"the trial's: {error}"
            ) from error


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


def _restore_gradients(context: Any, saved: Optional[List[Dict[str, torch.Tensor]]], directory: Path) -> None:
    if not saved:
        return
    for model, grads in zip(context.unwrapped_models, saved):
        for name, parameter in model.named_parameters():
            grad = grads.get(name)
            if grad is None:
                parameter.grad = None
                continue
            if grad.shape != parameter.shape:
                raise fmt.CheckpointError(
                    f"cannot resume: checkpoint {directory}: the saved gradient of {name} has "
                    f"shape {tuple(grad.shape)}, the parameter {tuple(parameter.shape)}"
                )
            parameter.grad = grad.to(device=parameter.device, dtype=parameter.dtype).clone()


def _callbacks(run: Any) -> Dict[str, Any]:
    """The trial's callbacks that run (``run.callbacks``, set when a plugin adopted them)."""
    return run.callbacks


def _validation_at(state: Any, batches: int) -> Optional[float]:
    """The searcher metric of the validation at ``batches``, if one ran there."""
    if state.validation_history and state.validation_history[-1]["batches"] == batches:
        return state.validation_history[-1]["metric"]
    return None


# ---------------------------------------------------------------------------------------------
# Retention rule
# ---------------------------------------------------------------------------------------------


def checkpoints_to_delete(
    saved: List[Tuple[str, int, Optional[float]]],
    keep_latest: int,
    keep_best: int,
    smaller_is_better: bool,
    protect_newest: bool = False,
) -> List[str]:
    """Which of ``saved`` (``(id, batches trained, metric or None)``, oldest first) to delete.

    Determined's rule for one trial: keep a checkpoint whose rank by batches trained (newest
    first, equal batches sharing a rank) is within ``keep_latest``, or whose rank by metric
    (best first, ties to the older, NaN after every number) is within ``keep_best``;
    checkpoints with no metric are kept only as latest. ``protect_newest`` also keeps the last
    one saved.
    """
    keep = set()
    for storage_id, steps, _metric in saved:
        newer = sum(1 for _, other_steps, _ in saved if other_steps > steps)
        if newer < keep_latest:
            keep.add(storage_id)
    sign = 1.0 if smaller_is_better else -1.0

    def order(item: Tuple[int, Tuple[str, int, Optional[float]]]) -> Tuple[int, float, int]:
        index, (_storage_id, _steps, metric) = item
        value = float(metric)  # type: ignore[arg-type]
        return (1, 0.0, index) if math.isnan(value) else (0, sign * value, index)

    scored = [
        (index, entry)
        for index, entry in enumerate(saved)
        if isinstance(entry[2], (int, float)) and not isinstance(entry[2], bool)
    ]
    keep.update(entry[0] for _, entry in sorted(scored, key=order)[:keep_best])
    if protect_newest and saved:
        keep.add(saved[-1][0])
    return [storage_id for storage_id, _, _ in saved if storage_id not in keep]
