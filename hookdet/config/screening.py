"""Screening a file before validation: Determined's cluster-only fields are dropped (and
listed), unknown fields refused with the closest known name; and pydantic's errors reworded for
someone editing YAML."""
from __future__ import annotations

from typing import Annotated, Any, Dict, List, Literal, Mapping, Optional, Tuple, Union, get_args, get_origin

from pydantic import ValidationError

from hookdet.config.problems import ConfigError, FieldPath, FieldProblem, Reporter, as_written, did_you_mean, dotted
from hookdet.config.sections import RETENTION_KEYS, STORAGE_TAGS, Section

CLUSTER_ONLY_FIELDS: Tuple[str, ...] = (
    "bind_mounts",
    "data_layer",
    "debug",
    "environment",
    "integrations",
    "internal",
    "labels",
    "log_policies",
    "max_restarts",
    "pbs",
    "profiling",
    "project",
    "retention_policy",
    "security",
    "slurm",
    "tensorboard_storage",
    "workspace",
    "checkpoint_storage.checkpoint_path",
    "checkpoint_storage.tensorboard_path",
    "resources.agent_label",
    "resources.devices",
    "resources.is_single_node",
    "resources.max_slots",
    "resources.native_parallel",
    "resources.priority",
    "resources.resource_pool",
    "resources.shm_size",
    "resources.slots",
    "resources.weight",
    "searcher.bracket_rungs",
    "searcher.budget",
    "searcher.divisor",
    "searcher.explore_function",
    "searcher.length_per_round",
    "searcher.max_concurrent_trials",
    "searcher.max_rungs",
    "searcher.max_time",
    "searcher.max_trials",
    "searcher.mode",
    "searcher.num_rounds",
    "searcher.num_rungs",
    "searcher.population_size",
    "searcher.promote",  # hookdet's own ASHA field: read by `hookdet search`, not by a trial
    "searcher.pruner",  # hookdet's own optuna searcher's fields: read by the search too
    "searcher.pruner_options",
    "searcher.replace_function",
    "searcher.sampler",
    "searcher.sampler_options",
    "searcher.stop_once",
    "searcher.time_metric",
    "searcher.train_stragglers",
    "searcher.unit",
)
"""Determined fields that only mean something on a Determined cluster (scheduling, containers,
multi-trial searches, the master's bookkeeping). They are accepted, dropped, and listed in
:attr:`ExperimentConfig.ignored_fields`; a whole block such as ``environment`` is one entry."""


def _group_by_parent() -> Dict[FieldPath, frozenset]:
    grouped: Dict[FieldPath, set] = {}
    for field in CLUSTER_ONLY_FIELDS:
        *parent, name = field.split(".")
        grouped.setdefault(tuple(parent), set()).add(name)
    return {parent: frozenset(names) for parent, names in grouped.items()}


CLUSTER_ONLY_BY_PARENT = _group_by_parent()


def _union_members(annotation: Any) -> Tuple[Any, ...]:
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) is Union:
        members: Tuple[Any, ...] = ()
        for member in get_args(annotation):
            members += _union_members(member)
        return members
    return (annotation,)


def _section_model_of(
    model: type, key: str, value: Any, key_path: FieldPath, reporter: Reporter
) -> Optional[type]:
    """The section model a field holds, for screening its keys; None for leaf and free-form
    fields. A tagged union (checkpoint_storage) picks its member by ``type``, which must be
    present and known."""
    candidates = [
        member
        for member in _union_members(model.model_fields[key].annotation)
        if isinstance(member, type) and issubclass(member, Section)
    ]
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    if not isinstance(value, Mapping):
        return None
    by_tag = {
        get_args(member.model_fields["type"].annotation)[0]: member
        for member in candidates
        if get_origin(member.model_fields["type"].annotation) is Literal
    }
    tag = value.get("type")
    # up: a storage type is screened against the types installed, found by the registry
    from hookdet.checkpoints.registry import installed_types

    installed = installed_types()
    choices = ", ".join(installed)
    if tag is None:
        if set(value) <= RETENTION_KEYS:  # only retention counts: the default storage
            return by_tag["default"]
        raise reporter.error(key_path, f"{dotted(key_path)}.type is required: one of {choices}")
    if tag in by_tag:
        return by_tag[tag]
    if tag in installed:
        return None  # another package's type: its fields are its own
    raise reporter.error(
        key_path + ("type",),
        f"{dotted(key_path)}.type {as_written(tag)} is not a storage hookdet has; use one of "
        f"{choices}{did_you_mean(str(tag), installed)}",
    )


def screen(
    section: Mapping, model: type, path: FieldPath, ignored: List[str], reporter: Reporter,
    problems: List[ConfigError],
) -> Dict[str, Any]:
    """``section`` without its cluster-only fields (recorded in ``ignored``), its sub-sections
    screened likewise; each unknown field goes into ``problems``, with the closest known name,
    and is left out so the rest can still be checked."""
    cluster_only = CLUSTER_ONLY_BY_PARENT.get(path, frozenset())
    known = list(model.model_fields)
    kept: Dict[str, Any] = {}
    for key, value in section.items():
        key_path = path + (str(key),)
        if not isinstance(key, str):
            problems.append(reporter.error(key_path, f"field names must be strings; got {as_written(key)}"))
            continue
        if key in cluster_only:
            ignored.append(dotted(key_path))
            continue
        if key not in model.model_fields:
            suggestion = did_you_mean(key, known + sorted(cluster_only))
            listing = "" if suggestion else f"; known fields here: {', '.join(known)}"
            problems.append(reporter.error(
                key_path, f"unknown field '{dotted(key_path)}'{suggestion}{listing}"
            ))
            continue
        try:
            sub_model = _section_model_of(model, key, value, key_path, reporter)
        except ConfigError as problem:
            problems.append(problem)
            continue
        if sub_model is not None and isinstance(value, Mapping):
            value = screen(value, sub_model, key_path, ignored, reporter, problems)
        kept[key] = value
    return kept


_FRIENDLY_MESSAGES = {
    "bool_type": "expected true or false",
    "int_type": "expected a whole number",
    "float_type": "expected a number",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
}


def _problem_from_pydantic(error: Mapping[str, Any]) -> Tuple[FieldPath, str]:
    """One pydantic error as (field path, message worded for someone editing YAML)."""
    loc = [str(part) for part in error["loc"]]
    if len(loc) >= 2 and loc[0] == "checkpoint_storage" and loc[1] in STORAGE_TAGS:
        del loc[1]
    path = tuple(loc)
    kind = error["type"]
    context = error.get("ctx") or {}
    if kind == "value_error":
        cause = context.get("error")
        if isinstance(cause, FieldProblem):
            path += tuple(str(part) for part in cause.subpath)
            return path, f"{dotted(path)}: {cause.message}"
        return path, f"{dotted(path)}: {cause}"
    if kind == "missing":
        return path, f"{dotted(path)} is required"
    if kind == "extra_forbidden":
        return path, f"unknown field '{dotted(path)}'"
    return path, f"{dotted(path)}: {worded(error)}"


def worded(error: Mapping[str, Any]) -> str:
    """One pydantic error's complaint, worded for someone editing YAML, without the field:
    ``must be at least 0; got -1``. Plugin options are worded the same way."""
    kind, context = error["type"], error.get("ctx") or {}
    if kind == "literal_error":
        message = f"expected one of {context.get('expected')}"
    elif kind == "greater_than_equal":
        message = f"must be at least {context.get('ge')}"
    elif kind == "greater_than":
        message = f"must be more than {context.get('gt')}"
    elif kind == "less_than_equal":
        message = f"must be at most {context.get('le')}"
    elif kind == "less_than":
        message = f"must be less than {context.get('lt')}"
    else:
        message = _FRIENDLY_MESSAGES.get(kind, error["msg"])
    return f"{message}; got {as_written(error.get('input'))}"


def config_errors_from(exc: ValidationError, reporter: Reporter) -> List[ConfigError]:
    """Every problem pydantic found, each a ConfigError naming its field and line."""
    return [reporter.error(*_problem_from_pydantic(error)) for error in exc.errors(include_url=False)]
