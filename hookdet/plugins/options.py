"""Declared plugin options: a plugin class says what ``plugin_config.<name>`` may hold, and hookdet
checks it with the rest of the experiment file.

A plugin class declares ``Options``, a pydantic model or a dataclass whose fields are its options
with their defaults (a pydantic ``Field`` adds constraints and a description; a dataclass field
its description in ``metadata={"description": ...}``)::

    class Options(pydantic.BaseModel):
        log_every_s: float = pydantic.Field(30.0, ge=0, description="seconds between lines")

Then

* the experiment file's ``plugin_config.<name>`` is checked when the file is read, every problem
  at once, each with file, line and a did-you-mean for a misspelt option
  (:func:`hookdet.config.reading` calls :func:`option_problems`);
* the plugin is built with ``options=`` an ``Options`` instance, defaults filled in;
* ``hookdet plugins`` lists every declared option with its default (:func:`option_fields`).

Values are checked strictly, as YAML gives them: ``true`` is not a number, ``"1"`` is not one
either. A plugin without ``Options`` gets its block as a dict and checks it itself.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, List, Mapping, Optional, Tuple

#: The class attribute a plugin declares its options with.
OPTIONS_ATTRIBUTE = "Options"

#: A problem below ``plugin_config.<name>``: the path under it, and the message.
OptionProblem = Tuple[Tuple[str, ...], str]


@dataclasses.dataclass(frozen=True)
class OptionField:
    """One declared option, as ``hookdet plugins`` and the plugin guide show it."""

    name: str
    type: str
    default: str
    description: str


def declared_options(plugin: Any) -> Optional[type]:
    """The ``Options`` type a plugin class (or instance) declares, or None."""
    cls = plugin if inspect.isclass(plugin) else type(plugin)
    declared = getattr(cls, OPTIONS_ATTRIBUTE, None)
    if inspect.isclass(declared) and (dataclasses.is_dataclass(declared) or _is_pydantic_model(declared)):
        return declared
    return None


def option_fields(options_type: type) -> List[OptionField]:
    """The options ``options_type`` declares, in declaration order."""
    if _is_pydantic_model(options_type):
        return [
            OptionField(
                name=field.alias or name,
                type=_type_name(field.annotation),
                default="required" if field.is_required() else repr(field.get_default(call_default_factory=True)),
                description=field.description or "",
            )
            for name, field in options_type.model_fields.items()
        ]
    fields = []
    for field in dataclasses.fields(options_type):
        if field.default is not dataclasses.MISSING:
            default = repr(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = repr(field.default_factory())
        else:
            default = "required"
        fields.append(OptionField(field.name, _type_name(field.type), default, field.metadata.get("description", "")))
    return fields


def build_options(options_type: type, raw: Mapping[str, Any]) -> Tuple[Any, List[OptionProblem]]:
    """``raw`` as an ``options_type`` instance, and no problems; or None and every problem."""
    import typing

    import pydantic

    known = [field.name for field in option_fields(options_type)]
    problems: List[OptionProblem] = [
        ((str(key),), f"unknown option '{key}'{_suggestion(str(key), known)}")
        for key in raw if key not in known
    ]
    if problems:
        return None, problems
    if _is_pydantic_model(options_type):
        try:
            return options_type.model_validate(dict(raw), strict=True), []
        except pydantic.ValidationError as error:
            return None, [_problem(detail, ()) for detail in error.errors(include_url=False)]
    hints = typing.get_type_hints(options_type)
    values = {}
    for name, value in raw.items():  # a dataclass: each field on its own, strictly
        try:
            values[name] = pydantic.TypeAdapter(hints[name]).validate_python(value, strict=True)
        except pydantic.ValidationError as error:
            problems += [_problem(detail, (str(name),)) for detail in error.errors(include_url=False)]
    return (None, problems) if problems else (options_type(**values), [])


def option_problems(plugin_config: Mapping[str, Mapping[str, Any]], find_class: Callable[[str], Any]) -> List[OptionProblem]:
    """Every problem of the ``plugin_config`` blocks whose plugins declare options, with paths
    below ``plugin_config``; ``find_class(name)`` is the plugin class (None when unknown)."""
    problems: List[OptionProblem] = []
    for name, raw in plugin_config.items():
        plugin_class = find_class(name)
        options_type = declared_options(plugin_class) if plugin_class is not None else None
        if options_type is not None:
            problems += [((name, *path), message) for path, message in build_options(options_type, raw or {})[1]]
    return problems


def options_for(plugin_class: type, raw: Any, name: str) -> Any:
    """What ``plugin_class(options=...)`` gets for block ``raw`` (a mapping, None, or already an
    ``Options``): an ``Options`` instance when it declares options (a ``ValueError`` listing every
    problem otherwise), else a dict."""
    options_type = declared_options(plugin_class)
    if options_type is None:
        return dict(raw or {})
    if isinstance(raw, options_type):
        return raw
    raw = raw or {}
    options, problems = build_options(options_type, raw)
    if problems:
        raise ValueError("; ".join(f"plugin_config.{name}.{'.'.join(path)}: {message}" for path, message in problems))
    return options


def _problem(detail: Mapping[str, Any], prefix: Tuple[str, ...]) -> OptionProblem:
    """One pydantic error as (path below the block, message), worded as the experiment file's
    own fields are (:func:`hookdet.config.screening.worded`)."""
    from hookdet.config.screening import worded

    path = (*prefix, *(str(part) for part in detail["loc"]))
    if detail["type"] == "value_error":
        return path, str((detail.get("ctx") or {}).get("error"))
    return path, worded(detail)


def _is_pydantic_model(cls: type) -> bool:
    return any(base.__module__.startswith("pydantic") and base.__name__ == "BaseModel" for base in inspect.getmro(cls))


def _type_name(annotation: Any) -> str:
    import typing

    if typing.get_origin(annotation) is None and hasattr(annotation, "__name__"):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _suggestion(word: str, candidates: List[str]) -> str:
    """``; did you mean 'x'?`` for a near miss, else the options there are."""
    import difflib

    matches = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    if matches:
        return f"; did you mean '{matches[0]}'?"
    return f"; known options: {', '.join(candidates)}" if candidates else "; the plugin takes no options"


def installed_plugin_class(name: str) -> Any:
    """The object the installed plugin ``name``'s entry point names, imported (not built); None
    when no plugin has that name or it fails to import (the plugin manager says why later)."""
    from importlib.metadata import entry_points

    from hookdet.plugins.selection import ENTRY_POINT_GROUP

    for entry_point in entry_points(group=ENTRY_POINT_GROUP, name=name):
        try:
            return entry_point.load()
        except Exception:  # noqa: BLE001 - reported with its cause when the run loads plugins
            return None
    return None
