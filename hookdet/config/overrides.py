"""``hookdet run CONFIG --config KEY=VALUE``: change one field of an experiment file from the
command line, as Determined's ``det experiment create --config`` does.

``KEY`` is a dotted field path (``searcher.max_length.batches``, ``hyperparameters.lr``); a list
element is named by its index, ``hyperparameters.layers[1]`` or ``hyperparameters.layers.1``.
``VALUE`` is read as YAML, the way the file is (YAML 1.2: ``1e-3`` is a number, ``[1, 2]`` a list,
``{batches: 5}`` a mapping, ``null`` nothing). The overrides are merged over the file and the
result is validated exactly as the file is, with the same messages, each naming the
``--config`` option that set the field. A hyperparameter name close to an existing one is taken
for a typo and refused with a suggestion (a really new name is added).
"""
from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

from hookdet.config import ConfigError, ExperimentConfig, load_experiment_config, read_experiment_text, read_yaml_value

#: One path segment: a name, optionally followed by list indices (``layers[1][0]``).
_SEGMENT = re.compile(r"^(?P<name>[^\[\]]+)(?P<indices>(\[\d+\])*)$")

PathPart = Union[str, int]


def parse_override(option: str) -> Tuple[List[PathPart], Any]:
    """``"hyperparameters.layers[1]=64"`` as ``(["hyperparameters", "layers", 1], 64)``."""
    key, equals, text = option.partition("=")
    if not equals or not key.strip():
        raise ConfigError("expected KEY=VALUE, e.g. hyperparameters.lr=0.01", source=f"--config {option}")
    path: List[PathPart] = []
    for segment in key.strip().split("."):
        match = _SEGMENT.match(segment)
        if match is None:
            raise ConfigError(
                f"{segment!r} is not a field name (a dotted path like searcher.max_length.batches)",
                source=f"--config {option}",
            )
        name = match.group("name")
        path.append(int(name) if name.isdigit() and path else name)
        path.extend(int(index) for index in re.findall(r"\[(\d+)\]", match.group("indices")))
    return path, read_yaml_value(text, source=f"--config {option}")


def loader_overrides(data: Mapping[str, Any], options: Sequence[str]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The overrides for :func:`hookdet.config.load_experiment_config` that ``options`` ask
    for over ``data`` (the file's content), and the option behind each dotted key.

    A plain path becomes a dotted key, so the loader merges it as it merges any override (a
    length such as ``searcher.max_length.batches`` replaces the file's length, units and all).
    A path through a list index becomes the whole list, edited, since lists replace wholesale.
    """
    working = copy.deepcopy(dict(data))
    overrides: Dict[str, Any] = {}
    origin: Dict[str, str] = {}
    for option in options:
        path, value = parse_override(option)
        _check_hyperparameter_name(working, path, option)
        _set(working, path, value, option)
        indexed = next((depth for depth, part in enumerate(path) if isinstance(part, int)), None)
        key_path = path if indexed is None else path[:indexed]
        key = ".".join(str(part) for part in key_path)
        overrides[key] = value if indexed is None else copy.deepcopy(_get(working, key_path))
        origin[key] = option
    return overrides, origin


def _get(data: Any, path: List[PathPart]) -> Any:
    for part in path:
        data = data[part]
    return data


def _check_hyperparameter_name(data: Mapping[str, Any], path: List[PathPart], option: str) -> None:
    """A new hyperparameter whose name is one edit away from an existing one is a typo."""
    hyperparameters = data.get("hyperparameters")
    if len(path) < 2 or path[0] != "hyperparameters" or not isinstance(hyperparameters, Mapping):
        return
    name = path[1]
    if name in hyperparameters:
        return
    close = difflib.get_close_matches(str(name), [str(key) for key in hyperparameters], n=1, cutoff=0.75)
    if close:
        raise ConfigError(
            f"no hyperparameter {str(name)!r} in the experiment file; did you mean {close[0]!r}?",
            source=f"--config {option}",
            field=f"hyperparameters.{name}",
        )


def _set(data: Dict[str, Any], path: List[PathPart], value: Any, option: str) -> None:
    """Set ``path`` in nested mappings and lists, making mappings on the way; an index must
    name an element that exists."""
    node: Any = data
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        where = ".".join(str(p) for p in path[: depth + 1])
        if isinstance(part, int):
            if not isinstance(node, list):
                raise ConfigError(
                    f"{where}: index {part} given, but {_parent(path, depth)} is not a list",
                    source=f"--config {option}",
                )
            if part >= len(node):
                raise ConfigError(
                    f"{where}: index {part} is out of range; {_parent(path, depth)} has {len(node)} "
                    "element(s)",
                    source=f"--config {option}",
                )
        elif not isinstance(node, dict):
            raise ConfigError(
                f"{where}: {_parent(path, depth)} is not a mapping of fields",
                source=f"--config {option}",
            )
        if last:
            node[part] = value
        else:
            if isinstance(part, str) and not isinstance(node.get(part), (dict, list)):
                node[part] = {}
            node = node[part]


def _parent(path: List[PathPart], depth: int) -> str:
    return ".".join(str(p) for p in path[:depth]) or "the experiment file"


def load_with_overrides(path: Union[str, Path], options: Sequence[str]) -> ExperimentConfig:
    """The experiment file at ``path`` with ``options`` (``KEY=VALUE``) applied and validated.

    A problem in a field an option set is reported as the file's validation reports it, with
    the option named in place of the file's line.
    """
    if not options:
        return load_experiment_config(path)
    source = str(path)
    text = read_experiment_text(path)
    data = read_yaml_value(text, source=source)
    if not isinstance(data, dict):
        return load_experiment_config(path)  # the loader's own message for a file that is no mapping
    overrides, origin = loader_overrides(data, options)
    try:
        return load_experiment_config(path, overrides=overrides)
    except ConfigError as error:
        option = _option_behind(error.field, origin)
        if option is None:
            raise
        message = error.message.replace(" (set by overrides)", "")
        raise ConfigError(message, source=f"{source} (--config {option})", field=error.field) from None




def _option_behind(field: Any, origin: Mapping[str, str]) -> Any:
    """The option that set ``field`` (or a field above or below it), if one did."""
    if not field:
        return None
    for key, option in reversed(list(origin.items())):
        if field == key or field.startswith(key + ".") or key.startswith(field + "."):
            return option
    return None
