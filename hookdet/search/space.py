"""Determined's hyperparameter spaces: validation, sampling, grids, and the master's draw stream.

A hyperparameter is ``{type: const|int|double|log|categorical, ...}``, a mapping without
``type`` (a nested group, to any depth), or anything else (a scalar or list: a constant).
Sampling follows Determined 0.38's master (``master/pkg/searcher/hyperparameters.go``):

* ``int``: ``minval + Intn(maxval - minval + 1)``; ``double``: ``Uniform(minval, maxval)``;
  ``log``: ``Pow(base, Uniform(minval, maxval))`` with Go's ``Pow`` (:mod:`hookdet.search.go_math`); ``categorical``: ``vals[Intn(len(vals))]``.
* Top-level names are visited in sorted order. Determined visits *nested* groups in Go's map
  order, which is randomised per process, so a Determined search over nested groups is not
  reproducible; hookdet visits nested names in sorted order too (reproducible, and equal to
  Determined's draw whenever a group has one searched entry).

The generator is the master's ``nprand`` - numpy's legacy ``RandomState`` (MT19937 seeded
with ``init_genrand(experiment_seed)``): ``Intn(n)`` is ``randint(0, n)`` (masked rejection on
32-bit words), ``Uniform`` is ``uniform`` (two words per double). Each trial the master creates
draws, in this order: its hyperparameters, a request id (four 32-bit words, a UUIDv4), then its
seed (one word's low 31 bits).
"""
from __future__ import annotations

import copy
import itertools
import math
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Tuple

from hookdet.search import go_math

SEARCH_TYPES = ("int", "double", "log", "categorical")
ALL_TYPES = ("const",) + SEARCH_TYPES
_FIELDS = {
    "const": ({"val"}, set()),
    "int": ({"minval", "maxval"}, {"count"}),
    "double": ({"minval", "maxval"}, {"count"}),
    "log": ({"minval", "maxval", "base"}, {"count"}),
    "categorical": ({"vals"}, set()),
}


class SpaceError(ValueError):
    """A malformed hyperparameter; ``path`` names it (``("optimizer", "lr")``)."""

    def __init__(self, path: Tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.path = path


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_spec(spec: Mapping, path: Tuple[str, ...]) -> None:
    """Validate one ``{type: ...}`` mapping as Determined's schema does; raise SpaceError."""
    kind = spec["type"]
    if kind not in _FIELDS:
        raise SpaceError(path + ("type",), f"unknown hyperparameter type {kind!r}; type is one of "
                         f"{', '.join(ALL_TYPES)}")
    required, optional = _FIELDS[kind]
    for key in spec:
        if key != "type" and key not in required | optional:
            allowed = ", ".join(sorted(required | optional))
            raise SpaceError(path + (str(key),),
                             f"a '{kind}' hyperparameter has no field {key!r} (it has {allowed})")
    for key in sorted(required):
        if key not in spec:
            raise SpaceError(path, f"a '{kind}' hyperparameter needs '{key}'")
    if kind in ("int", "double", "log"):
        check = _is_int if kind == "int" else _is_number
        for key in ("minval", "maxval"):
            if not check(spec[key]):
                want = "a whole number" if kind == "int" else "a number"
                raise SpaceError(path + (key,), f"must be {want}; got {spec[key]!r}")
        if not spec["minval"] < spec["maxval"]:
            raise SpaceError(path, f"minval must be less than maxval; got minval {spec['minval']!r}"
                             f", maxval {spec['maxval']!r}")
        count = spec.get("count")
        if count is not None and (not _is_int(count) or count < 1):
            raise SpaceError(path + ("count",), f"must be a whole number of at least 1; got {count!r}")
    if kind == "log" and (not _is_number(spec["base"]) or spec["base"] <= 0):
        raise SpaceError(path + ("base",), f"must be a number above 0; got {spec['base']!r}")
    if kind == "categorical" and (not isinstance(spec["vals"], list) or not spec["vals"]):
        raise SpaceError(path + ("vals",), f"must be a non-empty list; got {spec['vals']!r}")


def is_spec(value: Any) -> bool:
    """A mapping with a ``type`` key is a hyperparameter spec (else a group or a constant)."""
    return isinstance(value, Mapping) and "type" in value


def searched_names(space: Mapping[str, Any], prefix: Tuple[str, ...] = ()) -> List[str]:
    """Dotted names of the hyperparameters a search varies (int, double, log, categorical)."""
    names: List[str] = []
    for name in sorted(space):
        value = space[name]
        if is_spec(value) and value["type"] in SEARCH_TYPES:
            names.append(".".join(prefix + (name,)))
        elif isinstance(value, Mapping) and not is_spec(value):
            names.extend(searched_names(value, prefix + (name,)))
    return names


# ---------------------------------------------------------------------------------------------
# The master's random stream
# ---------------------------------------------------------------------------------------------


class MasterRandom:
    """Determined's ``nprand.State`` as numpy's ``RandomState``, with the master's draws."""

    def __init__(self, seed: int) -> None:
        import numpy as np

        self._np = np
        self.state = np.random.RandomState(seed & 0xFFFFFFFF)

    def intn(self, n: int) -> int:
        return int(self.state.randint(0, n))

    def uniform(self, low: float, high: float) -> float:
        return float(self.state.uniform(low, high))

    def request_id(self) -> str:
        """Sixteen bytes from four words (little-endian each), stamped as a UUIDv4."""
        words = self.state.randint(0, 2**32, size=4, dtype=self._np.uint32)
        raw = bytearray(b"".join(int(word).to_bytes(4, "little") for word in words))
        raw[6] = (raw[6] & 0x0F) | 0x40
        raw[8] = (raw[8] & 0x3F) | 0x80
        return str(uuid.UUID(bytes=bytes(raw)))

    def trial_seed(self) -> int:
        return int(self.state.randint(0, 2**31))

    def get_state(self) -> list:
        """JSON-shaped state, so a search's generator survives a restart."""
        name, key, pos, has_gauss, gauss = self.state.get_state()
        return [name, [int(word) for word in key], int(pos), int(has_gauss), float(gauss)]

    def set_state(self, saved: list) -> None:
        name, key, pos, has_gauss, gauss = saved
        self.state.set_state((name, self._np.array(key, dtype=self._np.uint32), pos, has_gauss, gauss))


def sample(space: Mapping[str, Any], rand: MasterRandom) -> Dict[str, Any]:
    """One draw of every hyperparameter (names in sorted order at every depth)."""
    return {name: _sample_one(space[name], rand) for name in sorted(space)}


def _sample_one(value: Any, rand: MasterRandom) -> Any:
    if not isinstance(value, Mapping):
        return copy.deepcopy(value)
    if not is_spec(value):
        return sample(value, rand)
    kind = value["type"]
    if kind == "const":
        return copy.deepcopy(value["val"])
    if kind == "int":
        return value["minval"] + rand.intn(value["maxval"] - value["minval"] + 1)
    if kind == "double":
        return rand.uniform(value["minval"], value["maxval"])
    if kind == "log":
        return go_math.pow(value["base"], rand.uniform(value["minval"], value["maxval"]))
    return copy.deepcopy(value["vals"][rand.intn(len(value["vals"]))])


@dataclass
class TrialDraw:
    """What the master draws to create one trial."""

    hparams: Dict[str, Any]
    request_id: str
    seed: int


def draw_trial(space: Mapping[str, Any], rand: MasterRandom) -> TrialDraw:
    """Hyperparameters, then request id, then seed - the order of Determined's ``NewCreate``."""
    hparams = sample(space, rand)
    return TrialDraw(hparams, rand.request_id(), rand.trial_seed())


def draw_with_fixed(hparams: Dict[str, Any], rand: MasterRandom) -> TrialDraw:
    """A create whose hyperparameters were chosen beforehand (a grid point): id, then seed."""
    return TrialDraw(hparams, rand.request_id(), rand.trial_seed())


def first_trial(space: Mapping[str, Any], experiment_seed: int) -> TrialDraw:
    """Trial 1 of a search (what ``searcher: single`` trains): sampled, with its seed."""
    return draw_trial(space, MasterRandom(experiment_seed))


# ---------------------------------------------------------------------------------------------
# Grid
# ---------------------------------------------------------------------------------------------


def grid_axis(spec: Mapping[str, Any]) -> List[Any]:
    """The values one hyperparameter takes in a grid (Determined's ``getGridAxes``)."""
    kind = spec["type"]
    if kind == "const":
        return [copy.deepcopy(spec["val"])]
    if kind == "categorical":
        return [copy.deepcopy(val) for val in spec["vals"]]
    count = spec.get("count")
    lo, hi = spec["minval"], spec["maxval"]
    if kind == "int":
        count = min(count, hi - lo + 1)
        if count == 1:
            return [int(_round_half_away(float(lo + hi) / 2.0))]
        return [int(_round_half_away(float(lo) + float(i * (hi - lo)) / float(count - 1)))
                for i in range(count)]
    if count == 1:
        points = [(lo + hi) / 2.0]
    else:
        points = [lo + float(i) * (hi - lo) / float(count - 1) for i in range(count)]
    if kind == "log":
        return [go_math.pow(spec["base"], point) for point in points]
    return points


def _round_half_away(value: float) -> float:
    """Go's ``math.Round``: halves away from zero (Python's round() rounds halves to even)."""
    return math.copysign(math.floor(abs(value) + 0.5), value)


def missing_counts(space: Mapping[str, Any], prefix: Tuple[str, ...] = ()) -> List[str]:
    """Dotted names of int/double/log hyperparameters without ``count`` (a grid needs one)."""
    missing: List[str] = []
    for name in sorted(space):
        value = space[name]
        if is_spec(value) and value["type"] in ("int", "double", "log") and value.get("count") is None:
            missing.append(".".join(prefix + (name,)))
        elif isinstance(value, Mapping) and not is_spec(value):
            missing.extend(missing_counts(value, prefix + (name,)))
    return missing


def _axes(space: Mapping[str, Any], route: Tuple[str, ...]) -> List[Tuple[Tuple[str, ...], List[Any]]]:
    axes: List[Tuple[Tuple[str, ...], List[Any]]] = []
    for name in sorted(space):
        value, here = space[name], route + (name,)
        if is_spec(value):
            axes.append((here, grid_axis(value)))
        elif isinstance(value, Mapping):
            axes.extend(_axes(value, here) if value else [(here, [{}])])
        else:
            axes.append((here, [copy.deepcopy(value)]))
    return axes


def grid(space: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Every grid point, in Determined's order (the cartesian product, first axis slowest).
    No hyperparameters, no points: Determined's grid of an empty space has no trials."""
    axes = _axes(space, ())
    if not axes:
        return []
    points = []
    for values in itertools.product(*[axis for _, axis in axes]):
        point: Dict[str, Any] = {}
        for (route, _), value in zip(axes, values):
            target = point
            for key in route[:-1]:
                target = target.setdefault(key, {})
            target[route[-1]] = copy.deepcopy(value)
        points.append(point)
    return points
