"""Reading an experiment: the YAML file (as YAML 1.2, bounded), overrides merged over it, the
result screened and validated into an :class:`~hookdet.config.experiment.ExperimentConfig`."""
from __future__ import annotations

import copy
import os
import re
import stat
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import yaml
from pydantic import ValidationError

from hookdet.config.experiment import ExperimentConfig
from hookdet.config.problems import ConfigError, FieldPath, LineIndex, Reporter, all_at_once, as_written, dotted
from hookdet.config.screening import config_errors_from, screen
from hookdet.config.sections import SEARCHERS
from hookdet.config.yaml_limits import MAX_BYTES, BoundedNesting, check_expanded_size, check_text, too_large

_LENGTH_FIELDS = frozenset(
    {("searcher", "max_length"), ("min_validation_period",), ("min_checkpoint_period",)}
)


def _nested_overrides(overrides: Mapping[str, Any], source: str) -> Dict[str, Any]:
    """Dotted keys (``"searcher.max_length"``) as nested mappings."""
    nested: Dict[str, Any] = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or "" in key.split("."):
            raise ConfigError(
                f"override keys must be dotted field names; got {as_written(key)}", source=source
            )
        _merge_into(nested, _nest(key.split("."), value), (), set())
    return nested


def _nest(parts: List[str], value: Any) -> Dict[str, Any]:
    for part in reversed(parts):
        value = {part: value}
    return value


def _replaces_whole(path: FieldPath, current: Mapping, override: Mapping) -> bool:
    """Whether an override mapping replaces the current one instead of merging into it: a
    length (``{batches: 5}`` over ``{epochs: 1}`` is not two units), or a checkpoint storage of
    another type (an s3 block keeps nothing of a shared_fs one)."""
    if path in _LENGTH_FIELDS:
        return True
    if path == ("checkpoint_storage",):
        return "type" in override and override["type"] != current.get("type")
    return False


def _merge_into(
    base: Dict[str, Any], overrides: Mapping[str, Any], path: FieldPath, replaced: set
) -> None:
    """Deep-merge ``overrides`` into ``base``: mappings merge (but see :func:`_replaces_whole`),
    anything else replaces. Every replaced path goes into ``replaced``."""
    for key, value in overrides.items():
        key_path = path + (key,)
        current = base.get(key)
        if (
            isinstance(value, Mapping)
            and isinstance(current, Mapping)
            and not _replaces_whole(key_path, current, value)
        ):
            base[key] = dict(current)
            _merge_into(base[key], value, key_path, replaced)
        else:
            base[key] = copy.deepcopy(value)
            replaced.add(key_path)


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def parse_experiment_config(
    data: Mapping[str, Any],
    source: str = "<dict>",
    *,
    overrides: Optional[Mapping[str, Any]] = None,
) -> ExperimentConfig:
    """An experiment config from a dict (the Python API's ``exp_conf``), validated and
    defaulted exactly as a file would be; ``source`` names it in error messages.

    ``overrides`` (dotted keys allowed: ``{"searcher.max_length": {"batches": 10}}``) is
    deep-merged over ``data`` first. Raises :class:`ConfigError`.
    """
    return _build(data, Reporter(source, LineIndex()), overrides)


def load_experiment_config(
    path: Union[str, Path], overrides: Optional[Mapping[str, Any]] = None
) -> ExperimentConfig:
    """Read, default and validate the experiment file at ``path``.

    ``overrides`` is deep-merged over the file's content before validation (see
    :func:`parse_experiment_config`). Raises :class:`ConfigError` with the file, the line and
    the field of the first problem: unreadable file, malformed YAML (line:column), a top level
    that is not a mapping, a duplicated key, an unknown field (with the closest known name),
    a value of the wrong type or range.
    """
    source = str(path)
    text = read_experiment_text(path)
    data, root = read_yaml(text, source)
    if data is None:
        raise ConfigError(
            "the experiment file is empty; expected fields such as 'entrypoint' and 'searcher'",
            source=source,
        )
    if not isinstance(data, dict):
        raise ConfigError(
            f"the top level must be a mapping of fields (like 'searcher: ...'); got a "
            f"{yaml_kind(data)}",
            source=source,
            line=root.start_mark.line + 1,
        )
    lines: Dict[FieldPath, int] = {}
    index_lines(root, (), lines, source)
    return _build(data, Reporter(source, LineIndex(lines)), overrides, experiment_file=True)


def read_experiment_text(path: Union[str, Path]) -> str:
    """The experiment file's text, or a :class:`ConfigError` naming the file.

    Only a regular file of at most :data:`~hookdet.config.yaml_limits.MAX_BYTES` is read, and never
    more than that: a FIFO (whose open would wait for a writer forever), a device such as
    ``/dev/zero`` (which never ends) or a directory is refused from its ``fstat``, before a
    byte is read.
    """
    source = str(path)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ConfigError("no such experiment file", source=source) from None
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise ConfigError(f"cannot read the experiment file: {reason}", source=source) from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"not a regular file (a {_file_kind(info.st_mode)}); an experiment file is a YAML file", source=source
            )
        if info.st_size > MAX_BYTES:
            raise ConfigError(too_large(info.st_size), source=source)
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            content = handle.read(MAX_BYTES + 1)  # the cap holds for a file that grew since
    except OSError as error:
        raise ConfigError(f"cannot read the experiment file: {error.strerror}", source=source) from None
    finally:
        os.close(descriptor)
    if len(content) > MAX_BYTES:
        raise ConfigError(too_large(len(content)), source=source)
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"not UTF-8 text ({error.reason})", source=source) from None
    return text


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


def with_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any], source: str) -> Dict[str, Any]:
    """``data`` (an experiment file's content) with ``overrides`` (dotted keys allowed) merged
    over it as the loader merges them, unvalidated: for tools that read fields the loader drops,
    such as a search's ``searcher`` block."""
    merged = copy.deepcopy(dict(data))
    _merge_into(merged, _nested_overrides(overrides, source), (), set())
    return merged


def _build(
    data: Any, reporter: Reporter, overrides: Optional[Mapping[str, Any]],
    experiment_file: bool = False,
) -> ExperimentConfig:
    """Validate and default ``data`` (with ``overrides``). An ``experiment_file`` is held to
    what Determined's master requires of one (a searcher block names its searcher); a Python
    ``exp_conf`` is not, as Determined's local ``pytorch.init`` does not check it."""
    if not isinstance(data, Mapping):
        raise reporter.error(
            (), f"expected a mapping of experiment fields; got a {yaml_kind(data)}"
        )
    merged = copy.deepcopy(dict(data))
    if overrides:
        if not isinstance(overrides, Mapping):
            raise ConfigError(
                f"overrides must be a mapping; got {as_written(overrides)}", source=reporter.source
            )
        nested = _nested_overrides(overrides, reporter.source)
        _merge_into(merged, nested, (), reporter.index.overridden)
    ignored: List[str] = []
    problems: List[ConfigError] = []
    if experiment_file:
        problems += _unnamed_searcher(merged, reporter)
    screened = screen(merged, ExperimentConfig, (), ignored, reporter, problems)
    try:
        config = ExperimentConfig.model_validate(screened)
    except ValidationError as error:
        problems += config_errors_from(error, reporter)
    else:
        problems += _plugin_option_problems(config, reporter)
    if problems:  # every problem this reading found, in file order
        raise all_at_once(problems) from None
    if config.searcher.name != "single":
        ignored.append("searcher.name")
    lines = {name: reporter.index.line_of(("plugin_config", name)) for name in config.plugin_config}
    config.note_origin(reporter.source, ignored, {name: line for name, line in lines.items() if line is not None})
    return config


def _unnamed_searcher(data: Mapping[str, Any], reporter: Reporter) -> List[ConfigError]:
    """A ``searcher`` block without a ``name`` (or with ``name: null``): Determined refuses the
    experiment; hookdet used to train it as ``single``."""
    searcher = data.get("searcher")
    if not isinstance(searcher, Mapping) or searcher.get("name") is not None:
        return []
    names = f"{', '.join(SEARCHERS[:-1])} or {SEARCHERS[-1]}"
    return [reporter.error(("searcher",), f"searcher.name is required (as Determined requires it): {names}")]


def _plugin_option_problems(config: ExperimentConfig, reporter: Reporter) -> List[ConfigError]:
    """The ``plugin_config`` blocks checked against the options their plugins declare
    (:mod:`hookdet.plugins.options`); only the plugins with a block are imported."""
    if not config.plugin_config:
        return []
    # up: plugin_config is checked against each installed plugin's own options model
    from hookdet.plugins.options import installed_plugin_class, option_problems

    return [
        reporter.error(("plugin_config", *path), f"{dotted(('plugin_config', *path))}: {message}")
        for path, message in option_problems(config.plugin_config, installed_plugin_class)
    ]


class _Yaml12Loader(BoundedNesting, yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema scalars, as Determined's ruamel loader
    reads them: floats like ``1e-3``, only true/false as booleans, no sexagesimal or
    leading-zero octal ints, no implicit timestamps."""


_BOOL_TAG = "tag:yaml.org,2002:bool"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"

_Yaml12Loader.yaml_implicit_resolvers = {
    first: [
        (tag, pattern)
        for tag, pattern in resolvers
        if tag not in (_BOOL_TAG, _INT_TAG, _FLOAT_TAG, _TIMESTAMP_TAG)
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Yaml12Loader.add_implicit_resolver(
    _INT_TAG, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_Yaml12Loader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)


def _construct_core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


_Yaml12Loader.add_constructor(_INT_TAG, _construct_core_int)


def read_experiment_file(path: Union[str, Path]) -> Any:
    """An experiment file's content as plain data, read as :func:`load_experiment_config` reads
    it (YAML 1.2); for tools that need fields the loader drops (a search's ``searcher`` block)."""
    data, _ = read_yaml(read_experiment_text(path), str(path))
    return data


def line_of_field(path: Union[str, Path], field: FieldPath) -> Optional[int]:
    """The line of ``field`` in the experiment file at ``path`` (else of its closest ancestor),
    for errors found by tools that read the file's plain content."""
    _, root = read_yaml(read_experiment_text(path), str(path))
    lines: Dict[FieldPath, int] = {}
    if root is not None:
        index_lines(root, (), lines, str(path))
    return LineIndex(lines).line_of(field)


def read_yaml(text: str, source: str) -> Tuple[Any, Optional[yaml.Node]]:
    """(content, node tree) of one YAML document; malformed YAML is a ConfigError at
    line:column."""
    loader = None
    try:
        check_text(text)
        loader = _Yaml12Loader(text)
        root = loader.get_single_node()
        if root is not None:
            check_expanded_size(root)
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        problem = error.problem or error.context or "cannot be parsed"
        if error.problem and error.context and error.context_mark is not None and mark is not None:
            if error.context_mark.line != mark.line:
                problem += f" ({error.context} started on line {error.context_mark.line + 1})"
        raise ConfigError(
            f"malformed YAML: {problem}",
            source=source,
            line=mark.line + 1 if mark is not None else None,
            column=mark.column + 1 if mark is not None else None,
        ) from None
    except yaml.reader.ReaderError as error:  # a character YAML does not allow, at a position
        line = text.count("\n", 0, error.position) + 1
        column = error.position - (text.rfind("\n", 0, error.position) + 1) + 1
        character = error.character if isinstance(error.character, int) else ord(error.character)
        raise ConfigError(
            f"malformed YAML: character U+{character:04X} is not allowed in YAML ({error.reason})",
            source=source, line=line, column=column,
        ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"malformed YAML: {error}", source=source) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, root


def read_yaml_value(text: str, source: str) -> Any:
    """``text`` read as the experiment file is read (YAML 1.2); malformed YAML is a ConfigError."""
    return read_yaml(text, source)[0]


def index_lines(
    node: yaml.Node, path: FieldPath, lines: Dict[FieldPath, int], source: str
) -> None:
    """Record the 1-based line of every key (and sequence item) under ``node``; a key given
    twice in one mapping is an error (YAML requires unique keys; PyYAML would keep the last)."""
    if isinstance(node, yaml.MappingNode):
        seen: Dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                continue
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"duplicate key '{dotted(path + (key,))}' (first given on line {seen[key]})",
                    source=source,
                    line=line,
                    field=dotted(path + (key,)),
                )
            seen[key] = line
            lines[path + (key,)] = line
            index_lines(value_node, path + (key,), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[path + (str(index),)] = item.start_mark.line + 1
            index_lines(item, path + (str(index),), lines, source)


def yaml_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return f"string ({as_written(value)})"
    return f"{type(value).__name__} ({as_written(value)})"
