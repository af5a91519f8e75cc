"""Using a checkpoint outside training: ``load_trial_from_checkpoint_path``, its context, export.

``load_trial_from_checkpoint_path(path)`` rebuilds the trial that wrote a checkpoint (class,
hyperparameters and experiment config come from the checkpoint's metadata) and loads its
models' weights, for inference or evaluation. ``CheckpointLoadContext(hparams, exp_conf)`` is
the context it builds, and one a user can build directly to construct a trial class that takes
extra arguments, as in Determined. Checkpoints are verified and loaded with
``torch.load(weights_only=True)`` unless ``torch_load_kwargs`` says otherwise.
"""
from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Type

import torch

from hookdet.checkpoints import format as fmt
from hookdet.checkpoints.resolver import fetched
from hookdet.trial_api.context import PyTorchTrialContext
from hookdet.distributed.context import DummyDistributedContext
from hookdet.trial_api.importing import SpecImportError, import_object
from hookdet.plugins.manager import PluginManager
from hookdet.loop.run import Run


class CheckpointLoadContext(PyTorchTrialContext):
    """A trial context for building a trial outside training (Determined's name and signature).

    One process on the CPU, no plugins, no checkpoints or metrics: ``wrap_model`` and
    ``wrap_optimizer`` register what the trial builds so a checkpoint's state can be loaded
    into it. ``hparams`` and ``exp_conf`` (an experiment file as a dict) answer ``get_hparam``
    and ``get_experiment_config``.
    """

    def __init__(
        self,
        hparams: Optional[Dict[str, Any]] = None,
        exp_conf: Optional[Dict[str, Any]] = None,
    ) -> None:
        from hookdet.config import parse_experiment_config  # pydantic: on first use

        config = parse_experiment_config(dict(exp_conf or {}), source="CheckpointLoadContext exp_conf")
        hparams = dict(hparams if hparams is not None else config.hyperparameters or {})
        run = Run(
            config=config,
            run_dir=Path.cwd(),
            plugins=PluginManager(),
            model_dir=Path.cwd(),
            hparams=hparams,
            trial_seed=config.trial_seed(),
            distributed=DummyDistributedContext(),
            device=torch.device("cpu"),
        )
        super().__init__(run)
        run.context = self


def import_trial_class(spec: str) -> type:
    """The class named by ``module:QualifiedName``."""
    try:
        target = import_object(spec)
    except SpecImportError as error:
        raise fmt.CheckpointError(
            f"cannot import trial class {spec} recorded in the checkpoint ({error}); "
            "pass trial_class= explicitly"
        ) from error
    return target


def check_trial_arguments(cls: type, context: Any, trial_kwargs: Dict[str, Any]) -> None:
    """A TypeError naming ``trial_kwargs`` when ``cls(context, **trial_kwargs)`` does not fit
    its ``__init__`` (a trial that takes ``hparams`` beside the context, as the Trainer API
    tutorial's does, needs ``trial_kwargs={"hparams": ...}``)."""
    try:
        inspect.signature(cls).bind(context, **trial_kwargs)
    except TypeError as error:
        raise TypeError(
            f"load_trial_from_checkpoint_path: {cls.__qualname__}(context, **trial_kwargs) does not fit "
            f"its __init__ ({error}); pass the arguments after the context as trial_kwargs={{...}}"
        ) from None
    except ValueError:  # no signature to read (a class built in C): let the call say
        pass


def load_trial_from_checkpoint_path(
    path: str,
    trial_class: Optional[Type[Any]] = None,
    trial_kwargs: Optional[Dict[str, Any]] = None,
    torch_load_kwargs: Optional[Dict[str, Any]] = None,
    **kwargs: Any,
) -> Any:
    """Rebuild the trial that wrote checkpoint ``path`` with its models' weights loaded.

    ``path`` is a checkpoint directory, or a run directory: its newest intact checkpoint, on
    whatever storage the run keeps them (fetched from an object store).
    ``trial_class`` defaults to the class recorded in the checkpoint; ``trial_kwargs`` are
    passed to its constructor after the context; ``torch_load_kwargs`` to ``torch.load``
    (``weights_only`` stays True unless overridden). Extra keyword arguments are the deprecated
    spelling of ``torch_load_kwargs``, as in Determined.
    """
    if kwargs:
        if torch_load_kwargs:
            raise ValueError("pass torch.load arguments as torch_load_kwargs or as **kwargs, not both")
        warnings.warn(
            "passing torch.load arguments as **kwargs to load_trial_from_checkpoint_path is "
            "deprecated; pass torch_load_kwargs={...}",
            FutureWarning,
            stacklevel=2,
        )
        torch_load_kwargs = kwargs
    load_kwargs = dict(torch_load_kwargs or {})
    with fetched(Path(path)) as directory:  # a run's newest intact checkpoint wherever its storage is
        metadata = fmt.read_metadata(directory)
        cls = trial_class or import_trial_class(str(metadata.get("trial_class") or ""))
        state = fmt.load_state(directory, map_location=load_kwargs.pop("map_location", "cpu"), **load_kwargs)
    context = CheckpointLoadContext(
        hparams=metadata.get("hparams") or {}, exp_conf=metadata.get("experiment_config") or {}
    )
    check_trial_arguments(cls, context, trial_kwargs or {})
    trial = cls(context, **(trial_kwargs or {}))
    models = state.get("models_state_dict", [])
    if len(models) != len(context.unwrapped_models):
        raise fmt.CheckpointError(
            f"checkpoint {directory} holds {len(models)} model(s) but {cls.__qualname__} wraps "
            f"{len(context.unwrapped_models)}"
        )
    for index, (model, model_state) in enumerate(zip(context.unwrapped_models, models)):
        try:
            model.load_state_dict(model_state)
        except RuntimeError as error:
            raise fmt.CheckpointError(
                f"checkpoint {directory}: model {index} does not match {cls.__qualname__}'s: {error}"
            ) from error
    return trial


def export_model_state(checkpoint: str, output: str, model_index: int = 0) -> Path:
    """Write model ``model_index``'s bare ``state_dict`` from a checkpoint to ``output``.

    The result loads in plain PyTorch:
    ``model.load_state_dict(torch.load(output, weights_only=True))``. Written to a temporary
    name and renamed, so an interrupted export never leaves a truncated file behind.
    """
    output_path = Path(output)
    if output_path.is_dir():
        raise fmt.CheckpointError(f"cannot export to {output}: it is a directory; name the .pt file to write")
    if not output_path.absolute().parent.is_dir():
        raise fmt.CheckpointError(f"cannot export to {output}: directory {output_path.absolute().parent} does not exist")
    with fetched(Path(checkpoint)) as directory:
        models = fmt.load_state(directory, map_location="cpu").get("models_state_dict", [])
        if not 0 <= model_index < len(models):
            raise fmt.CheckpointError(
                f"checkpoint {directory} holds {len(models)} model(s); there is no model {model_index}"
            )
        partial = output_path.with_name(f".{output_path.name}.partial")
        torch.save(models[model_index], partial)
    partial.replace(output_path)
    return output_path
