"""Restoring a checkpoint: find it (a checkpoint directory, a run directory, a storage id),
verify it, check it fits the trial, then apply every piece of state — models, optimizers,
schedulers, accumulated gradients, plugins, callbacks, the loop's counters, every RNG.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from hookdet.plugin import TRIAL_CALLBACKS, CheckpointNotFoundError, PluginError, StorageError, rng
from hookdet.plugin.checkpoint import fmt, locate, lookup, user_index

logger = logging.getLogger("hookdet")


def find(run: Any, checkpoint: str) -> Tuple[Any, Any]:
    """``(local directory, None)`` or ``(storage, storage id)`` for what the user named (the
    resolver's :func:`~hookdet.checkpoints.resolver.locate`, with the run's storage for a bare
    id). Damaged checkpoints passed over on the way are each named once, there."""
    return locate(checkpoint, run.storage)


def metadata_of(found: Tuple[Any, Any]) -> Dict[str, Any]:
    """The metadata of a checkpoint :func:`find` found, without fetching its state from a
    remote storage."""
    where, storage_id = found
    if storage_id is None:
        return fmt.read_metadata(where)
    try:
        return where.read_metadata(storage_id)
    except CheckpointNotFoundError as error:
        deleted = user_index.deletion(storage_id)
        if deleted is not None:
            raise fmt.CheckpointError(user_index.why_gone(storage_id, deleted)) from error
        raise fmt.CheckpointError(
            f"cannot resume from {storage_id!r}: no such run directory or checkpoint directory in {Path.cwd()}, "
            f"and no checkpoint with that id in this user's checkpoint index or in {where.describe()}"
        ) from error

    except StorageError as error:
        raise fmt.CheckpointError(f"cannot resume from checkpoint {storage_id!r}: {error}") from error


@contextlib.contextmanager
def located(found: Tuple[Any, Any]) -> Iterator[Tuple[Path, Optional[Path], str]]:
    """The local directory holding a checkpoint :func:`find` found (fetched from a remote
    storage, once), the folder to search for an intact alternative when this one is refused
    (None for remote storage), and the checkpoint's name for messages: where it is (an object
    store's URL, not the folder it was fetched to)."""
    where, storage_id = found
    if storage_id is None:
        yield where, where.parent, str(where)
        return
    try:
        with where.restore_path(storage_id) as restored:
            try:
                yield Path(restored), None, where.location(storage_id)
            except fmt.CheckpointError as error:  # named where it is, not where it was fetched to
                raise fmt.CheckpointError(str(error).replace(str(restored), where.location(storage_id))) from None
    except StorageError as error:
        raise fmt.CheckpointError(f"cannot resume from checkpoint {storage_id!r}: {error}") from error


def _restore_counters(run: Any, state: Dict[str, Any], metadata: Dict[str, Any], directory: Path) -> None:
    """The loop's counters as the checkpoint saved them; the epoch length stays the data's."""
    epoch_length = run.state.epoch_length
    run.state.load_state_dict(state["trial_state"])
    if epoch_length and run.state.epoch_length != epoch_length:
        logger.warning(
            "checkpoint %s was written with %d batches per epoch, the training data now has %d: "
            "epochs are counted with the new length",
            directory, run.state.epoch_length, epoch_length,
        )
        run.state.epoch_length = epoch_length
    run.state.latest_checkpoint = metadata.get("uuid", Path(str(directory)).name)
    run.state.last_checkpoint_batch = run.state.batches_trained


def restore_checkpoint(run: Any, directory: Path, hint_root: Optional[Path], warm_start: bool = False,
                       shown: Optional[str] = None) -> Dict[str, Any]:
    """Verify ``directory``, check it fits the trial, then apply every piece of state; return
    its metadata. A ``warm_start`` leaves the loop's place alone (its counters, a stopped
    workload, accumulated gradients): the run trains from batch 0 with the checkpoint's state.
    Messages name the checkpoint ``shown`` (where it is), else ``directory``."""
    context, trial = run.context, run.trial

    def refuse(error: fmt.CheckpointError) -> fmt.CheckpointError:
        hint = lookup.intact_hint(hint_root, exclude=directory) if hint_root is not None else ""
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
    state = copied_out_of_the_file(state)
    named: Any = shown or directory  # for messages only: the files are read from directory

    _check_structure(state, context, trial, named)  # before applying anything

    run.hook.on_checkpoint_load_start(run=run, checkpoint=state)
    _load_list("model", context.unwrapped_models, state.get("models_state_dict", []), named)
    _load_list("optimizer", context.optimizers, state.get("optimizers_state_dict", []), named)
    for optimizer in context.optimizers:
        _own_cpu_tensors(optimizer)
    _load_list("LR scheduler", context.lr_schedulers, state.get("lr_schedulers_state_dict", []), named)
    rank, size = run.distributed.rank, run.distributed.size
    if not warm_start:
        _restore_place(run, state, named)
    _restore_plugins_and_callbacks(run, state, named)
    if not warm_start:
        _restore_counters(run, state, metadata, named)
    rng_states = state["rng_state"]
    if len(rng_states) != size:
        logger.warning(
            "checkpoint %s was written by %d rank(s), resuming on %d: RNG streams cannot continue exactly",
            named, len(rng_states), size,
        )
    rng.restore_rng_state(rng_states[rank % len(rng_states)])
    if warm_start:
        logger.info("warm-started from checkpoint %s (its state; training starts at batch 0)", named)
    else:
        logger.info("resumed from checkpoint %s at batch %d", named, run.state.batches_trained)
    return metadata


def _restore_place(run: Any, state: Dict[str, Any], directory: Path) -> None:
    """Where in its training the checkpoint stopped: gradients accumulated toward an optimizer
    step, and the batches a preemption stopped between two reports."""
    rank, size = run.distributed.rank, run.distributed.size
    gradients = state.get("gradients")
    if gradients:
        _restore_gradients(run.context, gradients[rank % len(gradients)], directory)
    workloads = state.get("workloads")
    if workloads and len(workloads) == size:
        run.carried_workload = _to_device(workloads[rank], run.device)
    elif workloads:
        logger.warning(
            "checkpoint %s carries a workload of %d rank(s), resuming on %d: its batches are left "
            "out of the next training report", directory, len(workloads), size,
        )


def _check_structure(state: Dict[str, Any], context: Any, trial: Any, directory: Path) -> None:
    """Refuse a checkpoint with another number of models, optimizers or schedulers than the
    trial wraps, so a mismatch changes nothing."""
    for kind, objects, key in (
        ("model", context.unwrapped_models, "models_state_dict"),
        ("optimizer", context.optimizers, "optimizers_state_dict"),
        ("LR scheduler", context.lr_schedulers, "lr_schedulers_state_dict"),
    ):
        saved = state.get(key, [])
        if len(saved) != len(objects):
            raise fmt.CheckpointMismatchError(
                f"cannot resume: checkpoint {directory} holds {len(saved)} {kind} state(s) but "
                f"{type(trial).__qualname__} wraps {len(objects)}; it was written by a trial "
                "with a different structure"
            )


def _restore_plugins_and_callbacks(run: Any, state: Dict[str, Any], directory: Path) -> None:
    """Give each running plugin and callback its saved state; warn of saved state nobody takes."""
    for name, plugin_state in state.get("plugins", {}).items():
        plugin = run.plugins.named_plugins().get(name)
        if plugin is not None and callable(getattr(plugin, "load_state_dict", None)):
            plugin_call(name, plugin.load_state_dict, plugin_state)
        else:
            logger.warning("checkpoint %s holds state of plugin %r, which is not running", directory, name)
    callbacks = run.stash.get(TRIAL_CALLBACKS, {})
    saved_callbacks = state.get("callbacks", {})
    for name, callback_state in saved_callbacks.items():
        if name in callbacks:
            callbacks[name].load_state_dict(callback_state)
        else:
            logger.warning("checkpoint %s holds state of callback %r, which the trial no longer builds", directory, name)


def trial_spec(trial_class: type) -> str:
    """``module:QualifiedName`` of a trial class, as a checkpoint's metadata records it."""
    return f"{trial_class.__module__}:{trial_class.__qualname__}"


def written_by(recorded: str, trial_class: type) -> str:
    """Whether the trial class a checkpoint records (``module:Class``) is ``trial_class``:
    ``"same"``; ``"moved"`` (the same class name in another module); ``"other"``. A script's
    class, run as ``__main__``, is the same as one recorded under the script's own name
    (``train:MNistTrial`` for ``python3 train.py``, as Determined records it)."""
    module, _, name = recorded.partition(":")
    if recorded == trial_spec(trial_class):
        return "same"
    if name != trial_class.__qualname__:
        return "other"
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if trial_class.__module__ == "__main__" and main_file and Path(main_file).stem == module:
        return "same"
    return "moved"


def _check_trial_class(metadata: Dict[str, Any], trial_class: type, directory: Path) -> None:
    """Refuse a checkpoint of another trial class; a moved module only earns a warning."""
    recorded = str(metadata.get("trial_class") or "")
    expected = trial_spec(trial_class)
    found = written_by(recorded, trial_class)
    if found == "same":
        return
    if found == "moved":
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
            raise fmt.CheckpointMismatchError(
                f"cannot resume: checkpoint {directory}: {kind} {index} ({name}) does not match "
                f"the trial's: {error}"
            ) from error


def _to_device(value: Any, device: Any) -> Any:
    """Carried metrics with their tensors back on the run's device, where ``train_batch`` made
    the metrics they will be averaged with."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: _to_device(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(item, device) for item in value)
    return value


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
                raise fmt.CheckpointMismatchError(
                    f"cannot resume: checkpoint {directory}: the saved gradient of {name} has "
                    f"shape {tuple(grad.shape)}, the parameter {tuple(parameter.shape)}"
                )
            parameter.grad = grad.to(device=parameter.device, dtype=parameter.dtype).clone()


def plugin_call(name: str, method: Any, *args: Any) -> Any:
    """A plugin's ``state_dict``/``load_state_dict``, whose failure names that plugin (not the
    checkpoint plugin, whose hook called it)."""
    try:
        return method(*args)
    except Exception as error:
        raise PluginError(f"plugin {name!r} failed in {method.__name__}: {error!r}") from error


def copied_out_of_the_file(state: Dict[str, Any]) -> Dict[str, Any]:
    """``state`` with every tensor that may outlive the restore copied into memory of its own.

    The state was loaded onto a memory map of the checkpoint file, and a tensor kept on the map
    keeps the whole file mapped for the rest of the run, its disk space held after retention
    deletes the file. Models copy their weights into their parameters, so ``models_state_dict``
    stays mapped; optimizers do too, and :func:`_own_cpu_tensors` copies afterwards only what an
    optimizer kept on the CPU (on a GPU its moments were copied to the device by its own
    ``load_state_dict``: a copy here first would be paid twice). A callback or a plugin may keep
    anything, so their state is copied here: one copy, at memory speed, as a plain ``torch.load``
    pays for everything.
    """
    kept_mapped = ("models_state_dict", "optimizers_state_dict")
    return {key: value if key in kept_mapped else _copied(value) for key, value in state.items()}


def _own_cpu_tensors(optimizer: Any) -> None:
    """Copy off the checkpoint's map the CPU tensors ``optimizer`` kept from its loaded state
    (all its state on a CPU run; step counts and the like on a GPU run)."""
    for parameter_state in optimizer.state.values():
        for key, value in list(parameter_state.items()):
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                parameter_state[key] = value.clone()
    for group in optimizer.param_groups:
        for key, value in list(group.items()):
            if key != "params" and isinstance(value, torch.Tensor) and value.device.type == "cpu":
                group[key] = value.clone()


def _copied(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_copied(item) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(item) for item in value)
    return value
