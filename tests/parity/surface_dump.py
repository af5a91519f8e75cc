"""Dump the public PyTorchTrial and Core API surface of ``determined`` or ``hookdet`` as JSON.

Run as ``python surface_dump.py determined`` in Determined's own virtual environment, and as
``python surface_dump.py hookdet`` in hookdet's: both print the same structure, which
``test_public_surface.py`` compares. Nothing here imports from the other framework, so the one
file serves both interpreters.

Per module: every public name (not ``_``-prefixed, and defined by the framework itself or a
submodule of it, so ``Any``/``np``/``torch`` imported for annotations don't count). Per class:
every public method (plus ``__init__`` where users construct the class) with its parameters'
names, order, kinds and defaults. A default is recorded by ``repr`` with the framework's
package name replaced by ``<pkg>`` and memory addresses dropped; an enum member as
``Type.NAME``; an object of the framework's own classes as ``Type(attribute values)``
(Determined's ``Batch(100)`` has no repr of its own). Those are the only normalisations.
"""
from __future__ import annotations

import enum
import importlib
import inspect
import json
import re
import sys
import types

MODULES = ["pytorch", "pytorch.samplers", "tensorboard.metric_writers.pytorch", "core"]

# Classes whose methods are compared (constructed by the user: ``__init__`` included).
CONSTRUCTED = [
    "pytorch.PyTorchTrial",
    "pytorch.PyTorchCallback",
    "pytorch.DataLoader",
    "pytorch.Trainer",
    "pytorch.MetricReducer",
    "pytorch.LRScheduler",
    "pytorch.samplers.RepeatSampler",
    "pytorch.samplers.RepeatBatchSampler",
    "pytorch.samplers.SkipSampler",
    "pytorch.samplers.SkipBatchSampler",
    "pytorch.samplers.DistributedSampler",
    "pytorch.samplers.DistributedBatchSampler",
    "pytorch.samplers.ReproducibleShuffleSampler",
    "pytorch.samplers.ReproducibleShuffleBatchSampler",
    "tensorboard.metric_writers.pytorch.TorchWriter",
    "core.DistributedContext",
]
# Classes the framework constructs for the trial: their ``__init__`` is internal.
PROVIDED = [
    "pytorch.PyTorchTrialContext",
    "pytorch.PyTorchExperimentalContext",
    "core.Context",
    "core.TrainContext",
    "core.CheckpointContext",
    "core.PreemptContext",
    "core.SearcherContext",
    "core.SearcherOperation",
    "core.ProfilerContext",
    "core.ExperimentalCoreContext",
]
FUNCTIONS = ["pytorch.init", "core.init"]


def _import_tensorboard_writer_module(root: str) -> types.ModuleType:
    """Import ``<root>.tensorboard.metric_writers.pytorch``.

    Determined's module imports ``torch.utils.tensorboard`` at import time, which needs the
    ``tensorboard`` package; an environment without it gets an empty stand-in for that one
    import so the module's classes can be introspected (nothing here constructs a writer).
    """
    name = f"{root}.tensorboard.metric_writers.pytorch"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != "tensorboard":
            raise
    stand_in = types.ModuleType("torch.utils.tensorboard")
    stand_in.SummaryWriter = None  # type: ignore[attr-defined]
    sys.modules["torch.utils.tensorboard"] = stand_in
    import torch.utils

    torch.utils.tensorboard = stand_in  # type: ignore[attr-defined]
    return importlib.import_module(name)


def _module(root: str, dotted: str) -> types.ModuleType:
    if dotted == "tensorboard.metric_writers.pytorch":
        return _import_tensorboard_writer_module(root)
    return importlib.import_module(f"{root}.{dotted}")


def _normalise(text: str, root: str) -> str:
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)
    return re.sub(rf"\b{root}\b", "<pkg>", text)


def _default(value: object, root: str) -> str:
    if value is inspect.Parameter.empty:
        return "<required>"
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    owner = type(value).__module__
    if owner == root or owner.startswith(f"{root}."):
        # The framework's own objects (``Batch(100)``): type and attributes, since Determined's
        # have no repr of their own.
        fields = ", ".join(repr(field) for field in vars(value).values())
        return f"{type(value).__name__}({fields})"
    return _normalise(repr(value), root)


def signature(func: object, root: str) -> object:
    """``[[name, kind, default], ...]`` of ``func``, or a string saying why there is none."""
    try:
        sig = inspect.signature(func)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        return f"<no signature: {error}>"
    return [[p.name, p.kind.name, _default(p.default, root)] for p in sig.parameters.values()]


def _public_names(module: types.ModuleType, root: str) -> list:
    names = []
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            if value.__name__.startswith(f"{module.__name__}."):
                names.append(name)
            continue
        owner = getattr(value, "__module__", None)
        if isinstance(owner, str) and (owner == root or owner.startswith(f"{root}.")):
            names.append(name)
    return sorted(names)


def _member_kind(cls: type, name: str) -> str:
    for klass in cls.__mro__:
        if name in vars(klass):
            raw = vars(klass)[name]
            if isinstance(raw, staticmethod):
                return "staticmethod"
            if isinstance(raw, classmethod):
                return "classmethod"
            if isinstance(raw, property):
                return "property"
            if isinstance(raw, type):
                return "class"
            return "method" if callable(raw) else "attribute"
    return "attribute"


def class_surface(cls: type, root: str, with_init: bool) -> dict:
    """``{member: {"kind": ..., "signature": ...}}`` for the public members of ``cls``."""
    members = {}
    names = [n for n in dir(cls) if not n.startswith("_")]
    if with_init:
        names.append("__init__")
    for name in names:
        kind = _member_kind(cls, name)
        entry: dict = {"kind": kind}
        if kind in ("method", "staticmethod", "classmethod"):
            entry["signature"] = signature(getattr(cls, name), root)
        members[name] = entry
    return members


def _resolve(root: str, dotted: str) -> object:
    module_path, _, attr = dotted.rpartition(".")
    return getattr(_module(root, module_path), attr)


def _instance_names(obj: object) -> list:
    return sorted(name for name in dir(obj) if not name.startswith("_"))


def instances(root: str) -> dict:
    """Public attribute names (``dir``) of constructed objects: what ``dir(cls)`` misses, the
    attributes set in ``__init__``. The context comes from ``pytorch.init()`` run in the current
    directory (the caller's temporary one)."""
    import torch

    pytorch = importlib.import_module(f"{root}.pytorch")
    samplers = pytorch.samplers
    data = torch.utils.data
    batches = data.BatchSampler(data.SequentialSampler(range(4)), 2, False)
    built = {
        "RepeatSampler": samplers.RepeatSampler(range(4)),
        "RepeatBatchSampler": samplers.RepeatBatchSampler(batches),
        "SkipSampler": samplers.SkipSampler(range(4), 1),
        "SkipBatchSampler": samplers.SkipBatchSampler(batches, 1),
        "DistributedSampler": samplers.DistributedSampler(range(4), 2, 1),
        "DistributedBatchSampler": samplers.DistributedBatchSampler(batches, 2, 1),
        "ReproducibleShuffleSampler": samplers.ReproducibleShuffleSampler(range(4), 3),
        "ReproducibleShuffleBatchSampler": samplers.ReproducibleShuffleBatchSampler(batches, 3),
        "DataLoader": pytorch.DataLoader(list(range(4)), batch_size=2),
    }
    found = {name: _instance_names(obj) for name, obj in built.items()}
    with pytorch.init() as context:
        found["PyTorchTrialContext"] = _instance_names(context)
        found["PyTorchExperimentalContext"] = _instance_names(context.experimental)
    core = importlib.import_module(f"{root}.core")
    with core.init() as core_context:
        found["core.Context"] = _instance_names(core_context)
    return found


def root_names(root: str) -> dict:
    """The public names of the package ``root`` itself (its ``__all__``, else its public
    attributes) and the names of its submodules (``determined.pytorch`` is one: Determined's
    package imports it only when asked)."""
    import importlib
    import pkgutil

    package = importlib.import_module(root)
    listed = getattr(package, "__all__", None) or [name for name in dir(package) if not name.startswith("_")]
    return {"names": sorted(listed), "submodules": sorted(info.name for info in pkgutil.iter_modules(package.__path__))}


def dump(root: str) -> dict:
    return {
        "root": root_names(root),
        "instances": instances(root),
        "modules": {m: _public_names(_module(root, m), root) for m in MODULES},
        "classes": {
            **{c: class_surface(_resolve(root, c), root, True) for c in CONSTRUCTED},  # type: ignore[arg-type]
            **{c: class_surface(_resolve(root, c), root, False) for c in PROVIDED},  # type: ignore[arg-type]
        },
        "functions": {f: signature(_resolve(root, f), root) for f in FUNCTIONS},
    }


if __name__ == "__main__":
    json.dump(dump(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
