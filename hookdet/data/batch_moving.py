"""Moving a batch to the training device, with Determined's names and semantics:
:data:`TorchData`, :func:`to_device` (and :func:`batch_mover`, its per-run form) and
:func:`data_length`.

Tensors (and numpy arrays torch can hold) inside any nesting of mappings, sequences and named
tuples move; containers are rebuilt as their own type; anything else stays as it is, with one
warning per type.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import numbers
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Type, Union

import numpy as np
import torch

__all__ = ["TorchData", "batch_mover", "data_length", "to_device"]

logger = logging.getLogger("hookdet.data.loader")

TorchData = Union[Dict[str, torch.Tensor], Sequence[torch.Tensor], torch.Tensor]
"""What a batch is (Determined's alias): a tensor, a sequence of tensors or a dict of them."""

_NUMPY_KINDS_TORCH_CAN_HOLD = "fciub"


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def to_device(
    data: Any, device: Union[torch.device, str, int], warned_types: Optional[Set[Type]] = None
) -> Any:
    """Move every tensor in a batch to ``device``, keeping the batch's structure.

    Handles, nested to any depth: tensors; numpy arrays of numbers or bools (made tensors, as
    Determined does; other dtypes are left alone); dicts and other mappings; lists; tuples and
    namedtuples (kept namedtuples, where Determined makes them plain tuples); dataclass instances;
    any object with a callable ``.to(device)``. Strings, bytes, numbers and ``None`` pass through
    unchanged and silently. Anything else passes through unchanged with a warning logged once per
    type; pass the same ``warned_types`` set on every call to keep that to once per run.

    Copies to an accelerator are ``non_blocking`` (safe: the source is host memory the loader does
    not reuse); copies to the CPU block, since a non-blocking device-to-host copy could be read
    before it lands. Values are never inspected, so no device-to-host sync is forced.
    """
    target, non_blocking = _target(device)
    return _move(data, target, non_blocking, set() if warned_types is None else warned_types)


#: A tensor's ``is_cpu`` flag, read without building a ``torch.device`` (as ``.device`` does);
#: raises TypeError when given anything but a tensor.
_tensor_is_cpu = torch.Tensor.is_cpu.__get__


def batch_mover(
    device: Union[torch.device, str, int], warned_types: Optional[Set[Type]] = None
) -> Callable[[Any], Any]:
    """:func:`to_device` bound to ``device``: ``mover(data)`` moves one batch.

    What does not change from batch to batch is worked out here, once: the target device,
    whether copies are ``non_blocking``, and one ``warned_types`` set for every batch it moves
    (so an unknown type is warned about once per mover). The training loop makes one per run.
    Unlike :func:`to_device`, a tuple or list whose items are all tensors on ``device`` already
    comes back as the same object.
    """
    target, non_blocking = _target(device)
    warned = set() if warned_types is None else warned_types

    if target.type == "cpu":

        def mover(data: Any) -> Any:
            # The usual batch of a CPU run, a tuple or list of CPU tensors, is returned as it is,
            # checked by one ``all`` over the tensors' ``is_cpu`` flags without a Python line per
            # item (``_tensor_is_cpu`` raises TypeError for anything that is not a tensor).
            kind = type(data)
            if kind is tuple or kind is list:
                try:
                    if all(map(_tensor_is_cpu, data)):
                        return data
                except TypeError:
                    pass
            return _move(data, target, non_blocking, warned)

        return mover

    def mover(data: Any) -> Any:
        # A tuple or list of tensors on the device already is returned as it is, without
        # rebuilding it around the same tensors.
        kind = type(data)
        if kind is tuple or kind is list:
            for item in data:
                if type(item) is not torch.Tensor or item.device != target:
                    break
            else:
                return data
        return _move(data, target, non_blocking, warned)

    return mover


def _target(device: Union[torch.device, str, int]) -> Tuple[torch.device, bool]:
    """``device`` as a ``torch.device``, and whether copies to it are non-blocking."""
    target = device if isinstance(device, torch.device) else torch.device(device)
    return target, target.type != "cpu"


def _move(data: Any, device: torch.device, non_blocking: bool, warned_types: Set[Type]) -> Any:
    if isinstance(data, torch.Tensor):
        if data.device == device:  # already there: skip the dispatcher round trip of .to()
            return data
        return data.to(device, non_blocking=non_blocking)
    # The usual batches, by exact type first: the checks below (numbers.Number, Mapping) are
    # abstract-base-class isinstance checks costing about 0.4 µs each, paid on every batch.
    kind = type(data)
    if kind is tuple or kind is list:
        return kind([_move(item, device, non_blocking, warned_types) for item in data])
    if kind is dict:
        return {key: _move(value, device, non_blocking, warned_types) for key, value in data.items()}
    if isinstance(data, np.ndarray):
        if data.dtype.kind not in _NUMPY_KINDS_TORCH_CAN_HOLD:
            _warn_once(data, device, warned_types, detail=f" with dtype {data.dtype}")
            return data
        return _tensor_from_numpy(data).to(device, non_blocking=non_blocking)
    if isinstance(data, (str, bytes, numbers.Number, np.generic)) or data is None:
        return data
    if isinstance(data, Mapping):
        moved = {key: _move(value, device, non_blocking, warned_types) for key, value in data.items()}
        return _rebuild_mapping(data, moved)
    if _is_namedtuple(data):
        return type(data)(*(_move(item, device, non_blocking, warned_types) for item in data))
    if isinstance(data, (list, tuple)):
        moved_items = [_move(item, device, non_blocking, warned_types) for item in data]
        return _rebuild_sequence(data, moved_items)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {
            field.name: _move(getattr(data, field.name), device, non_blocking, warned_types)
            for field in dataclasses.fields(data)
            if field.init
        }
        return dataclasses.replace(data, **changes)
    mover = getattr(data, "to", None)
    if callable(mover):
        return mover(device)
    _warn_once(data, device, warned_types)
    return data


def _tensor_from_numpy(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy``, first making the array native-endian and positively strided if needed."""
    try:
        return torch.from_numpy(array)
    except (TypeError, ValueError):
        native = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
        return torch.from_numpy(native)


def _rebuild_mapping(original: Mapping, moved: Dict[Any, Any]) -> Any:
    """A mapping of ``original``'s type holding ``moved``; a plain dict if the type won't rebuild."""
    if type(original) is dict:
        return moved
    if isinstance(original, collections.defaultdict):
        return collections.defaultdict(original.default_factory, moved)
    try:
        return type(original)(moved)
    except TypeError:
        return moved


def _rebuild_sequence(original: Sequence, moved: List[Any]) -> Any:
    """A list/tuple of ``original``'s type holding ``moved``; the base type if it won't rebuild."""
    if type(original) in (list, tuple):
        return type(original)(moved)
    try:
        return type(original)(moved)
    except TypeError:
        return tuple(moved) if isinstance(original, tuple) else moved


def _warn_once(data: Any, device: torch.device, warned_types: Set[Type], detail: str = "") -> None:
    if type(data) in warned_types:
        return
    warned_types.add(type(data))
    logger.warning(
        "to_device: cannot move a %s%s to %s; it is passed through unchanged",
        type(data).__name__, detail, device,
    )


def data_length(data: Any) -> int:
    """The number of records in a batch: the size of the first dimension of its first array.

    A tensor or numpy array gives ``shape[0]`` (read from metadata: no device sync). A mapping
    gives the length of its first value, a list or tuple (namedtuples included) that of its first
    element, recursively; a list or tuple whose first element is not itself an array or container
    (a collated list of strings, say) is the batch, so its own length counts. Raises
    ``ValueError`` for an empty container and ``TypeError`` naming the type (and where it sits)
    for anything else; override ``get_batch_length`` in the trial for custom batch types.
    """
    return _length_at(data, "batch")


def _empty(where: str, data: Any) -> str:
    return (
        f"data_length: {where} is an empty {type(data).__name__}; it must have at least one "
        "np.ndarray or torch.Tensor"
    )


def _length_at(data: Any, where: str) -> int:
    if isinstance(data, (torch.Tensor, np.ndarray)):
        if data.ndim == 0:
            raise TypeError(
                f"data_length: {where} is a 0-d {type(data).__name__}, which has no batch dimension"
            )
        return int(data.shape[0])
    if isinstance(data, Mapping):
        if not data:
            raise ValueError(_empty(where, data))
        first_key = next(iter(data))
        return _length_at(data[first_key], f"{where}[{first_key!r}]")
    if isinstance(data, (list, tuple)):
        if not data:
            raise ValueError(_empty(where, data))
        first = data[0]
        if isinstance(first, (torch.Tensor, np.ndarray, Mapping, list, tuple)):
            return _length_at(first, f"{where}[0]")
        return len(data)
    raise TypeError(
        f"data_length: data of incorrect type: cannot find the batch length of {where}, a "
        f"{type(data).__name__}; a batch "
        "must be a tensor, numpy array, or a dict/list/tuple of them (override "
        "get_batch_length() in the trial for other types)"
    )
