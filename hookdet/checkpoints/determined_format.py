"""Checkpoints written by Determined 0.38's ``PyTorchTrial``, read without running pickled code.

Determined users moving to hookdet hold such checkpoints: a directory with ``state_dict.pth``
(models, optimizers, LR schedulers, callbacks, the chief's RNG state and, with AMP, the loss
scaler's), ``trial_state.pkl`` (the batch and epoch counters), ``metadata.json``
(``determined_version``, ``steps_completed``) and ``load_data.json`` (the trial class,
hyperparameters, experiment config). :func:`read_metadata` and :func:`load_state` give them in
hookdet's own shapes, so ``--resume``, ``Trainer.fit(latest_checkpoint=...)`` and
``load_trial_from_checkpoint_path`` take them as they take hookdet's.

Nothing is unpickled freely. ``state_dict.pth`` goes through torch's ``weights_only`` loader
with an explicit allow-list: the NumPy array and dtype that Determined's NumPy RNG state is made
of, and nothing else. ``trial_state.pkl`` goes through an unpickler that allows no global at
all (it holds a dict of numbers). Anything else is refused in one line naming the file and what
it holds. Determined has no manifest, so there is nothing to verify the files against: a damaged
file is refused when it does not load.
"""
from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any, Dict, List

from hookdet.checkpoints.storage import METADATA_FILE, STATE_FILE, is_inside, parse_metadata, read_small_file

LOAD_DATA_FILE = "load_data.json"
TRIAL_STATE_FILE = "trial_state.pkl"


def numpy_globals() -> List[Any]:
    """What Determined's ``np.random.get_state()`` pickles into, under NumPy 2 and NumPy 1 names
    (NumPy and torch are imported when a state is loaded, not to read metadata)."""
    import numpy as np

    return [
        np.ndarray,
        np.dtype,
        np.dtypes.UInt32DType,
        (np._core.multiarray._reconstruct, "numpy._core.multiarray._reconstruct"),
        (np._core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
    ]


class DeterminedCheckpointError(ValueError):
    """A Determined checkpoint hookdet will not load; the message names the file and why."""


def written_by_determined(metadata: Dict[str, Any]) -> bool:
    """Whether a checkpoint's ``metadata.json`` is Determined's (its version, no manifest)."""
    return "determined_version" in metadata and "files" not in metadata


def read_metadata(directory: Path) -> Dict[str, Any]:
    """The checkpoint's metadata in hookdet's keys: ``steps_completed``, ``uuid``, ``trial_class``,
    ``hparams``, ``experiment_config``, ``determined_version``."""
    directory = Path(directory)
    metadata = parse_metadata(read_small_file(directory / METADATA_FILE), str(directory / METADATA_FILE))
    load_data: Dict[str, Any] = {}
    if (directory / LOAD_DATA_FILE).is_file():
        load_data = parse_metadata(read_small_file(directory / LOAD_DATA_FILE), str(directory / LOAD_DATA_FILE))
    steps = metadata.get("steps_completed")
    if type(steps) is not int:
        raise DeterminedCheckpointError(f"{directory / METADATA_FILE}: steps_completed is not a number")
    return {
        "uuid": directory.name,
        "steps_completed": steps,
        "trial_class": load_data.get("trial_cls_spec"),
        "hparams": load_data.get("hparams") or {},
        "experiment_config": load_data.get("experiment_config") or {},
        "determined_version": metadata.get("determined_version"),
    }


def load_state(directory: Path, map_location: Any = "cpu") -> Dict[str, Any]:
    """The checkpoint's state in hookdet's keys (as ``checkpoints.format.load_state`` returns
    them), read without running pickled code."""
    directory = Path(directory)
    for name in (STATE_FILE, TRIAL_STATE_FILE, LOAD_DATA_FILE):
        if (directory / name).exists() and not is_inside(directory / name, directory):
            raise DeterminedCheckpointError(f"{directory / name} leads out of the checkpoint (to "
                                            f"{(directory / name).resolve()}, through a symlink); refused")
    saved = _load_state_file(directory / STATE_FILE, map_location)
    counters = _load_trial_state(directory / TRIAL_STATE_FILE)
    state: Dict[str, Any] = {
        "models_state_dict": [_without_ddp_prefix(model) for model in saved.get("models_state_dict", [])],
        "optimizers_state_dict": _listed(saved, "optimizers_state_dict", "optimizer_state_dict"),
        "lr_schedulers_state_dict": _listed(saved, "lr_schedulers_state_dict", "lr_scheduler"),
        "callbacks": saved.get("callbacks", {}),
        "trial_state": {
            "batches_trained": counters.get("batches_trained", 0),
            "last_validation_batch": counters.get("last_val"),
            "last_checkpoint_batch": counters.get("last_ckpt"),
            "latest_checkpoint": directory.name,
        },
        "plugins": {},
    }
    if "scaler_state_dict" in saved:
        state["plugins"]["amp"] = {"scaler": saved["scaler_state_dict"]}
    if "amp_state" in saved:
        state["plugins"]["apex"] = {"amp": saved["amp_state"]}
    if "rng_state" in saved:
        state["rng_state"] = [_rng_state(saved["rng_state"], directory)]
    return state


def _load_state_file(path: Path, map_location: Any) -> Dict[str, Any]:
    if not zipfile.is_zipfile(path):
        raise DeterminedCheckpointError(
            f"{path} is not in torch's zip format, which is all Determined 0.38 writes (torch's "
            "older pickle format, or not torch's at all); hookdet never runs code from a checkpoint "
            "and does not load it"
        )
    import torch

    try:
        with torch.serialization.safe_globals(numpy_globals()):
            saved = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        raise DeterminedCheckpointError(
            f"{path} holds objects hookdet does not load ({', '.join(unsafe) or 'code'}): a "
            "Determined checkpoint holds tensors, plain values and NumPy's RNG state only, and "
            "hookdet never runs code from a checkpoint"
        ) from None
    except (OSError, RuntimeError, EOFError) as error:
        raise DeterminedCheckpointError(f"{path} does not load: {error}") from None
    if not isinstance(saved, dict):
        raise DeterminedCheckpointError(f"{path} holds a {type(saved).__name__}, not Determined's state dict")
    return saved


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name}")


def _load_trial_state(path: Path) -> Dict[str, Any]:
    """Determined's ``trial_state.pkl``: a dict of counters, unpickled with no global allowed."""
    if not path.is_file():
        return {}
    try:
        counters = _NoGlobals(io.BytesIO(read_small_file(path))).load()
    except (pickle.UnpicklingError, EOFError, ValueError) as error:
        raise DeterminedCheckpointError(
            f"{path} holds more than Determined's counters ({error}); hookdet never runs code from a checkpoint"
        ) from None
    if not isinstance(counters, dict) or not all(type(v) in (int, type(None)) for v in counters.values()):
        raise DeterminedCheckpointError(f"{path} is not Determined's trial state (a dict of counters)")
    return counters


def _listed(saved: Dict[str, Any], key: str, legacy_key: str) -> List[Any]:
    """A list of states, from Determined's current key or its older single-object one."""
    if key in saved:
        return list(saved[key])
    return [saved[legacy_key]] if legacy_key in saved else []


def _without_ddp_prefix(model_state: Dict[str, Any]) -> Dict[str, Any]:
    """Determined saves a DDP-wrapped model's keys with ``module.``; hookdet's are unwrapped."""
    if model_state and all(key.startswith("module.") for key in model_state):
        return type(model_state)((key[len("module."):], value) for key, value in model_state.items())
    return model_state


def _rng_state(saved: Dict[str, Any], directory: Path) -> Dict[str, Any]:
    """Determined's RNG state as hookdet's :mod:`hookdet.trial_api.rng` keeps it."""
    import numpy as np
    import torch

    try:
        version, python_state, gauss = saved["random_rng_state"]
        kind, keys, position, has_gauss, cached = saved["np_rng_state"]
        state = {
            "python": [version, list(python_state), gauss],
            "numpy": [kind, torch.from_numpy(np.asarray(keys).astype("int64")), int(position), int(has_gauss), float(cached)],
            "torch": saved["cpu_rng_state"],
        }
    except (KeyError, TypeError, ValueError) as error:
        raise DeterminedCheckpointError(f"{directory / STATE_FILE}: rng_state is not Determined's ({error})") from None
    if "gpu_rng_state" in saved:
        state["cuda"] = [saved["gpu_rng_state"]]
    return state
