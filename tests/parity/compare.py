"""Compare two parity records: what differs, in words a reader can act on.

Records are made of :func:`tests.parity.record.plain` values, which keep each value's type, so
Determined's and hookdet's records compare exactly, types included. :func:`metric_value` strips
the containers for comparisons by value alone (a resumed run against an uninterrupted one, where
averages over other batch groupings agree only within float32 rounding, ``AVERAGE_RTOL``).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Tuple

#: Relative tolerance for averages taken over other groupings of the same float32 values.
AVERAGE_RTOL = 1e-6

#: Keys a value wrapper of record.plain uses for its payload.
_WRAPPERS = ("tensor", "ndarray", "numpy")


def metric_value(value: Any) -> Any:
    """A metric's value stripped of its container (tensor, ndarray, numpy scalar, float)."""
    if isinstance(value, dict):
        if any(key in value for key in _WRAPPERS):
            return value.get("values", value.get("value"))
        if "items" in value:
            return {key: metric_value(item) for key, item in value["items"].items()}
    if isinstance(value, dict) and ("list" in value or "tuple" in value):
        return [metric_value(item) for item in value.get("list", value.get("tuple"))]
    return value


def values_differ(left: Any, right: Any, rtol: float = 0.0) -> List[str]:
    """Paths at which ``left`` and ``right`` differ (numbers within ``rtol`` are equal)."""
    return list(_differences(left, right, "", rtol))


def _differences(left: Any, right: Any, path: str, rtol: float) -> Iterator[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        for key in sorted(set(left) | set(right)):
            if key not in left or key not in right:
                yield f"{path}.{key}: only in {'hookdet' if key in right else 'determined'}"
            else:
                yield from _differences(left[key], right[key], f"{path}.{key}", rtol)
        return
    if isinstance(left, list) and isinstance(right, list):
        if len(left) != len(right):
            yield f"{path}: length {len(left)} != {len(right)}"
            return
        for index, (a, b) in enumerate(zip(left, right)):
            yield from _differences(a, b, f"{path}[{index}]", rtol)
        return
    numbers = (int, float)
    if isinstance(left, numbers) and isinstance(right, numbers) and not isinstance(left, bool):
        if left == right or (rtol and math.isclose(left, right, rel_tol=rtol, abs_tol=1e-12)):
            return
    elif left == right:
        return
    yield f"{path}: {left!r} != {right!r}"


def sequence(events: List[Dict[str, Any]]) -> List[Tuple[str, ...]]:
    """The calls in order, without their metric payloads: (event, callback name, method, trained)."""
    result = []
    for event in events:
        if event["event"] == "callback":
            result.append(("callback", event["name"], event["method"], event["trained"]))
        else:
            result.append((event["event"],))
    return result


def first_sequence_difference(left: List[Any], right: List[Any]) -> str:
    """Where two call sequences part, with a few calls of context."""
    for index, (a, b) in enumerate(zip(left, right)):
        if a != b:
            return (f"call {index}: determined {a} != hookdet {b}\n  determined: {left[max(0, index - 3):index + 4]}"
                    f"\n  hookdet:    {right[max(0, index - 3):index + 4]}")
    if len(left) != len(right):
        return f"lengths {len(left)} != {len(right)}; tail determined {left[len(right):][:5]} hookdet {right[len(left):][:5]}"
    return ""
