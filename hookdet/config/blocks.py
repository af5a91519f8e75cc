"""The free-form blocks of an experiment file — ``hyperparameters``, ``data``,
``plugin_config`` — and the two fields with forms of their own, ``entrypoint`` and ``plugins``:
each read into plain, JSON-shaped values, or refused naming the spot."""
from __future__ import annotations

import re
import shlex
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hookdet.config.problems import FieldPath, FieldProblem, as_written, did_you_mean

HYPERPARAMETER_SEARCH_TYPES: Tuple[str, ...] = ("int", "double", "log", "categorical")


def plain_value(value: Any, path: FieldPath) -> Any:
    """A deep copy of ``value`` if it is JSON-shaped (so snapshots and checkpoint metadata can
    hold it); else a problem naming the first offending spot."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, list):
        return [plain_value(item, path + (str(index),)) for index, item in enumerate(value)]
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise FieldProblem(path, f"keys must be strings; quote the key {as_written(key)}")
            result[key] = plain_value(item, path + (key,))
        return result
    raise FieldProblem(
        path, f"a {type(value).__name__} value cannot be stored in a run's config; quote it"
    )


def reduce_hyperparameters(raw: Mapping, path: FieldPath) -> Dict[str, Any]:
    """Determined's hyperparameter block as the values one trial uses.

    A mapping with a ``type`` key is a Determined hyperparameter spec: ``{type: const, val: x}``
    becomes ``x``; a search space (int, double, log, categorical) is refused, since hookdet
    trains one trial with fixed values. A mapping without ``type`` is a nested group.
    """
    result: Dict[str, Any] = {}
    for name, value in raw.items():
        entry_path = path + (str(name),)
        if not isinstance(name, str):
            raise FieldProblem(
                entry_path, f"hyperparameter names must be strings; quote {as_written(name)}"
            )
        if isinstance(value, Mapping) and "type" in value:
            result[name] = _reduce_spec(value, entry_path)
        elif isinstance(value, Mapping):
            result[name] = reduce_hyperparameters(value, entry_path)
        else:
            result[name] = plain_value(value, entry_path)
    return result


def _reduce_spec(spec: Mapping, path: FieldPath) -> Any:
    kind = spec["type"]
    if kind == "const":
        unexpected = [str(key) for key in spec if key not in ("type", "val")]
        if unexpected:
            raise FieldProblem(
                path + (unexpected[0],),
                "a const hyperparameter has only 'type' and 'val'; "
                f"unexpected {as_written(unexpected[0])}",
            )
        if "val" not in spec:
            raise FieldProblem(path, "a const hyperparameter needs 'val' (the value)")
        return plain_value(spec["val"], path + ("val",))
    if kind in HYPERPARAMETER_SEARCH_TYPES:
        return _searched_spec(spec, path)
    choices = ("const",) + HYPERPARAMETER_SEARCH_TYPES
    raise FieldProblem(
        path + ("type",),
        f"unknown hyperparameter type {as_written(kind)}{did_you_mean(str(kind), list(choices))} "
        f"(a mapping with a 'type' key is a Determined hyperparameter spec: type is one of "
        f"{', '.join(choices)}); to pass such a mapping as a value, write "
        "{type: const, val: {...}}",
    )


def _searched_spec(spec: Mapping, path: FieldPath) -> Dict[str, Any]:
    """A search space entry (int, double, log, categorical), checked as Determined's schema
    checks it and kept as written; :mod:`hookdet.search` samples it."""
    from hookdet.search.space import SpaceError, check_spec

    try:
        check_spec(spec, path)
    except SpaceError as problem:
        raise FieldProblem(problem.path, str(problem)) from None
    return plain_value(spec, path)


def check_global_batch_size(hyperparameters: Mapping[str, Any]) -> None:
    if "global_batch_size" not in hyperparameters:
        return
    size = hyperparameters["global_batch_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise FieldProblem(
            ("global_batch_size",),
            f"must be a whole number of at least 1; got {as_written(size)}",
        )


_ENTRYPOINT = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def runs_a_command(raw: Any) -> bool:
    """Whether the experiment file's ``entrypoint`` (as written) is a command, not a trial class."""
    try:
        return not _ENTRYPOINT.match(trial_spec_from_entrypoint(raw))
    except ValueError:
        return False


def trial_spec_from_entrypoint(raw: Any) -> str:
    """``module:Class``, or the command, from Determined's entrypoint forms.

    ``model_def:MNistTrial`` and ``pkg.mod:outer.Trial`` are taken as they are;
    ``python3 -m determined.launch.<launcher> ... --trial model_def:Trial`` gives its ``--trial``
    (hookdet launches distributed runs itself, from ``resources.slots_per_trial``). Any other
    command (``python3 train.py --epochs 1``, a launch-layer wrapper around a script) is kept as
    one string (a list is joined with shell quoting) and run by :mod:`hookdet.cli.script_entrypoint`.
    """
    if isinstance(raw, list) and raw and all(isinstance(part, str) for part in raw):
        tokens = list(raw)
    elif isinstance(raw, str) and raw.strip():
        if _ENTRYPOINT.match(raw.strip()):
            return raw.strip()
        try:
            tokens = shlex.split(raw)
        except ValueError as error:
            raise ValueError(f"cannot split the command {as_written(raw)} into words: {error}") from None
    else:
        raise ValueError(f"expected 'module:Class' or a command; got {as_written(raw)}")
    uses_determined_launcher = any(
        token.startswith("determined.launch") for token in tokens
    ) and "-m" in tokens
    if uses_determined_launcher and "--trial" in tokens:
        position = tokens.index("--trial") + 1
        if position < len(tokens) and _ENTRYPOINT.match(tokens[position]):
            return tokens[position]
    if isinstance(raw, str) and re.fullmatch(r"[A-Za-z_]\w*", raw.strip()):
        raise ValueError(
            f"expected 'module:Class' or a command; got {as_written(raw)} "
            f"(name its module too, e.g. 'model_def:{raw.strip()}')"
        )
    return raw.strip() if isinstance(raw, str) else shlex.join(tokens)


def names_trial_class(entrypoint: Optional[str]) -> bool:
    """Whether ``entrypoint`` names a trial class (``module:Class``) rather than a command."""
    return bool(entrypoint) and bool(_ENTRYPOINT.match(entrypoint))


PLUGIN_NAME = re.compile(r"^(no:|\+)?[A-Za-z_][\w.-]*$")


def read_only_plugins(raw: Mapping) -> Dict[str, List[str]]:
    """``plugins: {only: [...]}``: exactly these plugins, no defaults, no markers."""
    if set(raw) != {"only"}:
        raise ValueError(f"the mapping form of plugins is {{only: [name, ...]}}; got {as_written(dict(raw))}")
    names = raw["only"]
    if not isinstance(names, list):
        raise FieldProblem(("only",), f"expected a list of plugin names; got {as_written(names)}")
    for index, name in enumerate(names):
        if not isinstance(name, str) or not PLUGIN_NAME.match(name) or name.startswith(("no:", "+")):
            raise FieldProblem(("only", str(index)), f"expected a plain plugin name; got {as_written(name)}")
        if name in names[:index]:
            raise FieldProblem(("only", str(index)), f"plugin '{name}' is listed twice")
    return {"only": list(names)}
