"""Metric values between the device and the report: a workload's values moved to the host in one
transfer per metric (never once per batch), the metric names checked across batches and ranks, and
everything turned into plain, JSON-writable Python at the reporting boundary, naming the metric and
where it came from when something cannot be.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from hookdet.errors import HookdetError

class MetricError(HookdetError, ValueError):
    """A metric value, a reducer's result or a reducer registration breaks a rule.

    The message names the culprit (metric, batch, reducer, rank) and the rule it broke.
    """


class ReducerResultError(MetricError, AssertionError):
    """A reducer's result does not fit how it was wrapped (a dict from a named reducer, or no
    dict from an unnamed one). Also an ``AssertionError``, the class Determined raises there."""


# ---------------------------------------------------------------------------------------------
# Moving a workload's metric values to the host: one transfer per metric
# ---------------------------------------------------------------------------------------------


def describe_value(value: Any) -> str:
    """Short description of a metric value for error messages."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"a {type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} (a {type(value).__name__})"


def workload_metric_to_host(
    values: Sequence[Any],
    metric: str,
    origin: str,
    first_batch_idx: int,
    allow_none: bool,
) -> tuple[np.ndarray, list[int]]:
    """Convert one metric's per-batch values to a float64 array of shape ``(n, *value_shape)``.

    Returns the array and the batch positions it holds (positions whose value is ``None`` are
    left out when ``allow_none``). Tensors on a device are stacked there and copied to the host
    in one transfer. Values holding one element count as scalars whatever their shape; larger
    values (training's and validation's alike, as in Determined) must have the same shape in
    every batch.
    """
    fast = _scalar_tensors_to_host(values)
    if fast is not None:
        return fast, list(range(len(values)))

    def fail(position: int, value: Any, rule: str) -> MetricError:
        return MetricError(
            f"{origin} returned metric {metric!r} = {describe_value(value)} at batch "
            f"{first_batch_idx + position}: {rule}"
        )

    value_shape: tuple[int, ...] | None = None
    host_rows: dict = {}
    tensor_positions_by_device: dict = {}
    for position, value in enumerate(values):
        if value is None and allow_none:
            continue
        shape, array = _checked_shape(value, lambda rule: fail(position, value, rule))
        if value_shape is None:
            value_shape = shape
        elif shape != value_shape:
            raise fail(position, value, f"its shape {shape} differs from the shape {value_shape} of earlier batches")
        if isinstance(value, torch.Tensor):
            tensor_positions_by_device.setdefault(value.device, []).append(position)
        else:
            host_rows[position] = array.astype(np.float64).reshape(shape)
    for device_positions in tensor_positions_by_device.values():
        host_rows.update(_device_rows_to_host(values, device_positions, value_shape))
    positions = sorted(host_rows)
    if not positions:
        return np.empty((0,) + (value_shape or ()), dtype=np.float64), positions
    return np.stack([host_rows[position] for position in positions]), positions


def _checked_shape(value: Any, fail: Any) -> tuple[tuple[int, ...], Any]:
    """``value``'s shape (``()`` for one element) and, for a non-tensor, its numpy array;
    ``fail(rule)`` builds the error for a value that is not a real, non-empty number array."""
    array = None
    if isinstance(value, torch.Tensor):
        if value.is_complex() or value.is_quantized:
            raise fail("metric tensors must hold real numbers")
        shape, numel = tuple(value.shape), value.numel()
    else:
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):
            array = np.asarray(None, dtype=object)
        if array.dtype.kind == "O" and all(_whole_number(item) for item in array.flat):
            array = array.astype(np.float64)  # a Python int past int64 (10**30): a float, as JSON reads it
        if array.dtype.kind not in "biuf":
            raise fail("metric values must be numbers or arrays of numbers")
        shape, numel = array.shape, array.size
    if numel == 0:
        raise fail("metric values must not be empty")
    return (() if numel == 1 else shape), array


def _whole_number(item: Any) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)


def _device_rows_to_host(values: Sequence[Any], positions: list, value_shape: Any) -> dict:
    """The tensors at ``positions`` (all on one device) stacked there and copied to the host in
    one transfer, as float64 rows by position."""
    tensors = [values[position] for position in positions]
    common_dtype = functools.reduce(torch.promote_types, {t.dtype for t in tensors})
    # Reshape or cast only the tensors that need it: each such call allocates a tensor
    # (about 2.5 µs), most of this path's cost for a validation's per-batch scalars.
    with torch.no_grad():
        stacked = torch.stack([
            t if t.dtype == common_dtype and t.shape == value_shape
            else t.reshape(value_shape).to(common_dtype)
            for t in tensors
        ])
    on_host = stacked.cpu().to(torch.float64).numpy()
    return {position: on_host[row] for row, position in enumerate(positions)}


def _scalar_tensors_to_host(values: Sequence[Any]) -> np.ndarray | None:
    """The common case without a Python loop: every value a one-element real tensor.

    Returns the float64 array :func:`workload_metric_to_host` would build, or None whenever
    anything is unusual (another type, ``None``, several elements, a complex value; off the CPU
    also mixed shapes or devices), leaving that case, and its precise error message, to the
    general path. A training workload's values are usually this case.

    When the first value is on the CPU, the values are read in one pass of ``Tensor.item`` (no
    device involved), about a third of the cost of ``torch.stack`` over a hundred 0-dim
    tensors. On a device one ``stack`` and one copy to the host replace a transfer per value.
    """
    if not values or not isinstance(values[0], torch.Tensor):
        return None
    if values[0].is_cpu:
        try:
            return np.fromiter(map(torch.Tensor.item, values), dtype=np.float64, count=len(values))
        except (RuntimeError, TypeError):  # several elements, a complex value, not a tensor
            return None
    try:
        with torch.no_grad():
            stacked = torch.stack(values)  # type: ignore[arg-type]
    except (RuntimeError, TypeError):  # not all tensors, or shapes or devices differ
        return None
    # Stacking promotes mixed dtypes as the general path does; it also stacks values of several
    # elements, which only the general path may judge, so the element count must match.
    if stacked.numel() != len(values) or stacked.is_complex() or stacked.is_quantized:
        return None
    return stacked.reshape(len(values)).cpu().to(torch.float64).numpy()


def metric_names(batch_metrics: Sequence[Any], origin: str, first_batch_idx: int) -> list[str]:
    """The metric names every batch reported, in the first batch's order.

    Every batch must be a dict with string keys, and all batches must report the same names.
    """
    # The usual workload (dicts with the first batch's string keys) passes in one comparison of
    # key views per batch, run by ``map`` without a Python frame per batch; anything else goes
    # through the loop below, which finds and names the batch that breaks a rule.
    first = batch_metrics[0] if batch_metrics else None
    if type(first) is dict and all(isinstance(key, str) for key in first):
        try:
            if all(map(first.keys().__eq__, map(dict.keys, batch_metrics))):
                return list(first)
        except TypeError:  # a batch's metrics are not a dict
            pass
    names: list[str] | None = None
    for position, metrics in enumerate(batch_metrics):
        batch_idx = first_batch_idx + position
        if not isinstance(metrics, Mapping):
            raise MetricError(
                f"{origin} must return a dict of metric names to values, but at batch "
                f"{batch_idx} it returned {describe_value(metrics)}"
            )
        for key in metrics:
            if not isinstance(key, str):
                raise MetricError(
                    f"{origin} returned a metric named {key!r} (a {type(key).__name__}) at batch "
                    f"{batch_idx}; metric names must be strings"
                )
        if names is None:
            names = list(metrics)
        elif set(metrics) != set(names):
            missing = sorted(set(names) - set(metrics))
            extra = sorted(set(metrics) - set(names))
            raise MetricError(
                f"{origin} must return the same metric names for every batch: batch {batch_idx} "
                f"lacks {missing} and adds {extra} compared with batch {first_batch_idx}"
            )
    return names or []


def check_same_names_across_ranks(
    names_by_rank: Sequence[list[str] | None], origin: str
) -> list[str]:
    """The metric names shared by every rank that ran batches; error if two ranks disagree."""
    reference_rank: int | None = None
    for rank, names in enumerate(names_by_rank):
        if names is None:
            continue
        if reference_rank is None:
            reference_rank = rank
        elif set(names) != set(names_by_rank[reference_rank] or []):
            reference = set(names_by_rank[reference_rank] or [])
            raise MetricError(
                f"{origin} must return the same metric names on every rank: rank {rank} reported "
                f"{sorted(names)} but rank {reference_rank} reported {sorted(reference)}"
            )
    return list(names_by_rank[reference_rank] or []) if reference_rank is not None else []


# ---------------------------------------------------------------------------------------------
# Reporting boundary: plain, JSON-writable Python
# ---------------------------------------------------------------------------------------------


def _to_plain(value: Any, origin: str, metric: str, path: str) -> Any:
    """Convert tensors and numpy values inside ``value`` to plain Python; refuse non-JSON values."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.generic):
        return _to_plain(value.item(), origin, metric, path)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            raise MetricError(
                f"{origin} reported metric {metric!r} as a complex tensor (at {path}); metrics "
                "must be real numbers"
            )
        return _to_plain(value.detach().cpu().tolist(), origin, metric, path)
    if isinstance(value, np.ndarray):
        return _to_plain(value.tolist(), origin, metric, path)
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise MetricError(
                    f"{origin} reported metric {metric!r} with a dict key {key!r} (a "
                    f"{type(key).__name__}) at {path}; keys must be strings to be written as JSON"
                )
            plain[key] = _to_plain(item, origin, metric, f"{path}[{key!r}]")
        return plain
    if isinstance(value, (list, tuple)):
        return [
            _to_plain(item, origin, metric, f"{path}[{index}]") for index, item in enumerate(value)
        ]
    raise MetricError(
        f"{origin} reported metric {metric!r} with {describe_value(value)} at {path}, which "
        "cannot be written as JSON; metric values must be numbers, strings, booleans, None, "
        "tensors or arrays of numbers, or lists and string-keyed dicts of these"
    )


def check_metrics_serialisable(metrics: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """Return ``metrics`` as plain, JSON-writable Python, or raise naming ``origin`` and the key.

    Tensors (on any device) and numpy values become Python numbers and lists; strings, booleans
    and ``None`` pass through (so do NaN and infinity, which Python's ``json`` writes); dicts and
    lists are converted recursively. Anything else (a set,
    bytes, a complex number, an arbitrary object) is a :class:`MetricError` naming ``origin``
    (e.g. ``"evaluate_batch"``), the metric key and where inside the value it sits.
    """
    if not isinstance(metrics, Mapping):
        raise MetricError(
            f"{origin} must produce a dict of metric names to values, "
            f"not {describe_value(metrics)}"
        )
    plain = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise MetricError(
                f"{origin} reported a metric named {key!r} (a {type(key).__name__}); metric names "
                "must be strings"
            )
        plain[key] = _to_plain(value, origin, key, path=repr(key))
    return plain
