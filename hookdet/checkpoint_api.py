"""Using a checkpoint outside training: ``load_trial_from_checkpoint_path`` and its context."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Dict, Optional, Type

import torch

from hookdet import checkpoint_format as fmt
from hookdet.config import parse_experiment_config
from hookdet.context import PyTorchTrialContext
from hookdet.distributed import DistributedContext
from hookdet.plugin_manager import PluginManager
from hookdet.run import Run


class CheckpointLoadContext(PyTorchTrialContext):
    """The context a trial is rebuilt with for inference: one process, no plugins, no training."""


def import_trial_class(spec: str) -> type:
    """The class named by ``module:QualifiedName``."""
    module_name, _, qualname = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as error:
        raise fmt.CheckpointError(
            f"cannot import trial class {spec} recorded in the checkpoint ({error}); "
            "pass trial_class= explicitly"
        ) from error
    return target


def load_trial_from_checkpoint_path(
    path: str,
    trial_class: Optional[Type[Any]] = None,
    trial_kwargs: Optional[Dict[str, Any]] = None,
    torch_load_kwargs: Optional[Dict[str, Any]] = None,
) -> Any:
    """Rebuild the trial that wrote checkpoint ``path`` with its models' weights loaded.

    ``trial_class`` defaults to the class recorded in the checkpoint; ``trial_kwargs`` are passed
    to its constructor after the context; ``torch_load_kwargs`` to ``torch.load``
    (``weights_only`` stays True unless overridden).
    """
    directory = fmt.resolve_checkpoint_dir(Path(path))
    metadata = fmt.read_metadata(directory)
    cls = trial_class or import_trial_class(metadata["trial_class"])
    state = fmt.load_state(directory, map_location="cpu", **(torch_load_kwargs or {}))
    config = parse_experiment_config(metadata.get("experiment_config") or {}, source=str(directory))
    run = Run(
        config=config,
        run_dir=directory,
        plugins=PluginManager(),
        model_dir=Path.cwd(),
        hparams=dict(metadata.get("hparams") or {}),
        trial_seed=config.trial_seed(),
        distributed=DistributedContext(),
        device=torch.device("cpu"),
    )
    context = CheckpointLoadContext(run)
    run.context = context
    trial = cls(context, **(trial_kwargs or {}))
    models = state.get("models_state_dict", [])
    if len(models) != len(context.unwrapped_models):
        raise fmt.CheckpointError(
            f"checkpoint {directory} holds {len(models)} models but {cls.__qualname__} wraps "
            f"{len(context.unwrapped_models)}"
        )
    for model, model_state in zip(context.unwrapped_models, models):
        model.load_state_dict(model_state)
    return trial


def export_model_state(checkpoint: str, output: str, model_index: int = 0) -> Path:
    """Write model ``model_index``'s bare ``state_dict`` from a checkpoint to ``output``.

    The result loads in plain PyTorch: ``model.load_state_dict(torch.load(output))``.
    """
    directory = fmt.resolve_checkpoint_dir(Path(checkpoint))
    models = fmt.load_state(directory, map_location="cpu").get("models_state_dict", [])
    if not 0 <= model_index < len(models):
        raise fmt.CheckpointError(
            f"checkpoint {directory} holds {len(models)} model(s); there is no model {model_index}"
        )
    torch.save(models[model_index], output)
    return Path(output)
