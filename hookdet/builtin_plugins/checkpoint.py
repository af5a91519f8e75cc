"""Checkpoints: save every piece of state, restore it exactly, keep what the policy names.

Saved: every wrapped model (unwrapped, so DDP's ``module.`` prefix never appears), optimizer and
LR scheduler; the state of every plugin and callback that has ``state_dict`` (under its name); the
loop's counters, which are also the data position (the samplers are stateless functions of seed,
epoch and batches consumed); and every rank's Python, NumPy, torch and CUDA RNG state. The files
go through the run's storage (a local directory or S3), ``metadata.json`` last.
"""
from __future__ import annotations

import logging
import uuid as uuid_module
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hookdet import checkpoint_format as fmt
from hookdet.builtin_plugins.callbacks import ADAPTER_NAME
from hookdet.markers import hookimpl

logger = logging.getLogger("hookdet")


class CheckpointPlugin:
    """Answers ``hookdet_save_checkpoint`` and ``hookdet_load_checkpoint``; applies retention."""

    @hookimpl
    def hookdet_save_checkpoint(self, run: Any) -> Optional[str]:
        """Write a checkpoint on the chief (gathering every rank's RNG first); return its id."""
        rng_states = run.distributed.gather(fmt.rank_rng_state())
        storage_id = checkpoint_dir = None
        if run.is_chief:
            storage_id, checkpoint_dir = self._write(run, rng_states)
        storage_id, checkpoint_dir = run.distributed.broadcast((storage_id, checkpoint_dir))
        run.state.latest_checkpoint = storage_id
        run.hook.on_checkpoint_upload_end(uuid=storage_id)
        run.hook.on_checkpoint_end(checkpoint_dir=checkpoint_dir)
        if run.is_chief:
            self._retain(run, storage_id)
        return storage_id

    def __init__(self) -> None:
        self._saved: List[Tuple[str, Optional[float]]] = []

    def _retain(self, run: Any, storage_id: str) -> None:
        """Record the new checkpoint and delete the ones retention no longer keeps."""
        self._saved.append((storage_id, _validation_at(run.state, run.state.batches_trained)))
        spec = run.config.checkpoint_storage
        keep_latest = spec.save_trial_latest if spec is not None else 1
        keep_best = max(spec.save_trial_best, spec.save_experiment_best) if spec is not None else 1
        doomed = checkpoints_to_delete(
            self._saved, keep_latest, keep_best, run.config.searcher.smaller_is_better
        )
        for storage_id in doomed:
            run.storage.delete(storage_id)
        self._saved = [entry for entry in self._saved if entry[0] not in doomed]

    def _write(self, run: Any, rng_states: List[Dict[str, Any]]) -> Tuple[str, str]:
        context, state = run.context, run.state
        checkpoint: Dict[str, Any] = {
            "models_state_dict": [model.state_dict() for model in context.unwrapped_models],
            "optimizers_state_dict": [optimizer.state_dict() for optimizer in context.optimizers],
            "lr_schedulers_state_dict": [s.state_dict() for s in context.lr_schedulers],
            "callbacks": {name: cb.state_dict() for name, cb in _callbacks(run).items()},
            "plugins": {
                name: plugin.state_dict()
                for name, plugin in run.plugins.named_plugins().items()
                if callable(getattr(plugin, "state_dict", None))
            },
            "trial_state": state.state_dict(),
            "rng_state": rng_states,
        }
        run.hook.on_checkpoint_save_start(checkpoint=checkpoint)
        storage_id = str(uuid_module.uuid4())
        validation = _validation_at(state, state.batches_trained)
        with run.storage.store_path(storage_id) as directory:
            fmt.write_state(directory, checkpoint)
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
                    num_ranks=len(rng_states),
                ),
            )
        location = run.storage.location(storage_id)
        logger.info("checkpoint %s saved at batch %d: %s", storage_id, state.batches_trained, location)
        return storage_id, location

    @hookimpl
    def hookdet_load_checkpoint(self, run: Any, checkpoint: str) -> bool:
        """Restore everything from ``checkpoint`` (a directory, run directory or storage id)."""
        directory = _local_checkpoint(run, checkpoint)
        if directory is not None:
            _restore(run, directory)
        else:
            with run.storage.restore_path(checkpoint) as restored:
                _restore(run, restored)
        return True


def _local_checkpoint(run: Any, checkpoint: str) -> Optional[Path]:
    """The checkpoint directory ``checkpoint`` names on this machine, or None for a storage id."""
    path = Path(checkpoint)
    if path.exists():
        return fmt.resolve_checkpoint_dir(path)
    if "/" in checkpoint or checkpoint.startswith("."):
        raise fmt.CheckpointError(f"checkpoint {checkpoint} does not exist")
    return None


def _restore(run: Any, directory: Path) -> None:
    context, trial = run.context, run.trial
    metadata = fmt.read_metadata(directory)
    expected = fmt.trial_spec(type(trial))
    if metadata.get("trial_class") != expected:
        raise fmt.CheckpointError(
            f"checkpoint {directory} was written by trial {metadata.get('trial_class')}, "
            f"not {expected}; resume it with the trial that wrote it"
        )
    try:
        state = fmt.load_state(directory, map_location="cpu")
    except fmt.CheckpointError as error:
        intact = fmt.newest_intact(directory.parent, exclude=directory)
        hint = f"; the newest intact checkpoint is {intact}" if intact else ""
        raise fmt.CheckpointError(f"{error}{hint}") from error
    run.hook.on_checkpoint_load_start(checkpoint=state)
    _load_list("model", context.unwrapped_models, state.get("models_state_dict", []), directory)
    _load_list("optimizer", context.optimizers, state.get("optimizers_state_dict", []), directory)
    _load_list("LR scheduler", context.lr_schedulers, state.get("lr_schedulers_state_dict", []), directory)
    for name, plugin_state in state.get("plugins", {}).items():
        plugin = run.plugins.get(name)
        if plugin is not None and callable(getattr(plugin, "load_state_dict", None)):
            plugin.load_state_dict(plugin_state)
    callbacks = _callbacks(run)
    for name, callback_state in state.get("callbacks", {}).items():
        if name in callbacks:
            callbacks[name].load_state_dict(callback_state)
    run.state.load_state_dict(state["trial_state"])
    run.state.latest_checkpoint = metadata.get("uuid", directory.name)
    rng_states = state["rng_state"]
    rank = run.distributed.rank
    if len(rng_states) != run.distributed.size:
        logger.warning(
            "checkpoint %s was written by %d ranks, resuming on %d: RNG streams cannot continue exactly",
            directory, len(rng_states), run.distributed.size,
        )
    fmt.restore_rng_state(rng_states[rank % len(rng_states)])
    logger.info("resumed from checkpoint %s at batch %d", directory, run.state.batches_trained)


def _load_list(kind: str, objects: List[Any], states: List[Any], directory: Path) -> None:
    if len(objects) != len(states):
        raise fmt.CheckpointError(
            f"checkpoint {directory} holds {len(states)} {kind} state(s) but the trial wraps "
            f"{len(objects)}; it was written by a trial with a different structure"
        )
    for index, (obj, obj_state) in enumerate(zip(objects, states)):
        try:
            obj.load_state_dict(obj_state)
        except (RuntimeError, ValueError, KeyError) as error:
            raise fmt.CheckpointError(
                f"checkpoint {directory}: {kind} {index} does not match the trial's: {error}"
            ) from error


def _callbacks(run: Any) -> Dict[str, Any]:
    plugin = run.plugins.get("callbacks")
    return plugin.callbacks if plugin is not None and run.plugins.get(ADAPTER_NAME) else {}


def _validation_at(state: Any, batches: int) -> Optional[float]:
    if state.validation_history and state.validation_history[-1]["batches"] == batches:
        return state.validation_history[-1]["metric"]
    return None


def checkpoints_to_delete(
    saved: List[Tuple[str, Optional[float]]],
    keep_latest: int,
    keep_best: int,
    smaller_is_better: bool,
) -> List[str]:
    """Which of ``saved`` (id and validation metric, oldest first) retention deletes.

    Kept: the ``keep_latest`` newest, and the ``keep_best`` best by metric (only checkpoints taken
    right after a validation have one), as Determined's ``save_trial_latest``/``save_trial_best``.
    """
    keep = {storage_id for storage_id, _ in saved[len(saved) - keep_latest:]} if keep_latest else set()
    scored = sorted(
        ((metric, index, storage_id) for index, (storage_id, metric) in enumerate(saved) if metric is not None),
        key=lambda item: item[0] if smaller_is_better else -item[0],
    )
    keep.update(storage_id for _, _, storage_id in scored[:keep_best])
    return [storage_id for storage_id, _ in saved if storage_id not in keep]
