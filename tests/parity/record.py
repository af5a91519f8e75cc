"""What a parity trial observes, written down the same way under Determined and under hookdet.

A trial (``tests/parity/trials.py``) calls :func:`event` from its hooks, callbacks and batch
methods; the runner writes :data:`EVENTS` and the rest of the record as JSON. :func:`plain` turns
any value a user could see into JSON that keeps its type and exact value, so two records compare
with ``==`` and a tensor's float32 values survive exactly.
"""
from __future__ import annotations

import math
import numbers
import os
from typing import Any, Dict, List

#: Every observation of the current process, in order.
EVENTS: List[Dict[str, Any]] = []


#: The storage id of the latest checkpoint a callback saw uploaded (phase 2 resumes from it).
LATEST_CHECKPOINT: List[str] = []


#: The trial contexts built in this process (the runner reads the final weights from them).
CONTEXTS: List[Any] = []


def framework() -> str:
    """``determined`` or ``hookdet``: the package this process runs the trial under."""
    return os.environ["PARITY_FRAMEWORK"]


def event(kind: str, **payload: Any) -> None:
    """Record one observation (its payload made plain)."""
    EVENTS.append({"event": kind, **{key: plain(value) for key, value in payload.items()}})


def plain(value: Any) -> Any:
    """``value`` as JSON-able data keeping its type: tensors and arrays carry dtype and values."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        data = value.detach().cpu()
        return {"tensor": str(data.dtype), "shape": list(data.shape), "values": _floats(data.tolist())}
    if isinstance(value, np.ndarray):
        return {"ndarray": str(value.dtype), "shape": list(value.shape), "values": _floats(value.tolist())}
    if isinstance(value, np.generic):
        return {"numpy": type(value).__name__, "value": _floats(value.item())}
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return _floats(value)
    if isinstance(value, dict):
        return {"dict": type(value).__name__, "items": {str(k): plain(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [plain(v) for v in value]}
    if isinstance(value, numbers.Number):
        return {"number": type(value).__name__, "value": repr(value)}
    return {"object": type(value).__name__}


def _floats(value: Any) -> Any:
    """Floats (nested) as JSON numbers, non-finite ones as strings (JSON has no NaN)."""
    if isinstance(value, list):
        return [_floats(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def type_name(value: Any) -> str:
    """The type a callback or reducer received, as a user would print it."""
    return type(value).__module__.split(".")[0] + "." + type(value).__qualname__
