"""The experiment file: Determined's experiment configuration, read, defaulted and checked locally.

A Determined experiment YAML (``const.yaml``, ``distributed.yaml``...) runs under hookdet
unchanged. :func:`load_experiment_config` reads one from disk, :func:`parse_experiment_config`
takes the same content as a dict (the Python API's ``init(exp_conf=...)``). Both return an
:class:`ExperimentConfig` with Determined's defaults filled in, or raise one :class:`ConfigError`
whose message names the file, the line and the dotted field, e.g.::

    const.yaml:7: unknown field 'searcher.max_lenght'; did you mean 'max_length'?

Three kinds of field exist:

* fields hookdet acts on (``searcher``, ``hyperparameters``, ``min_validation_period``,
  ``checkpoint_storage``, ``optimizations``, ``resources.slots_per_trial``...), validated here;
* Determined's cluster-only fields (``environment``, ``bind_mounts``, ``resources.resource_pool``,
  ``searcher.max_trials``...; see :data:`CLUSTER_ONLY_FIELDS`), accepted so a cluster's file runs
  unchanged, dropped, and listed in :attr:`ExperimentConfig.ignored_fields`;
* hookdet's own ``plugins`` and ``plugin_config``.

Anything else is an error that suggests the closest known name.

The YAML is read as YAML 1.2 (the core schema), as Determined's ruamel-based CLI reads it, not
as PyYAML's default YAML 1.1: ``lr: 1e-3`` is the float 0.001 (YAML 1.1 makes it a string),
``yes``/``on`` stay strings, ``010`` is ten and ``2024-01-01`` stays a string.
"""
from __future__ import annotations

import copy
import difflib
import os
import random
import re
import shlex
from pathlib import Path
from types import MappingProxyType
from typing import (
    Annotated,
    Any,
    Dict,
    List,
    Literal,
    Mapping,
    Optional,
    Tuple,
    Union,
    get_args,
    get_origin,
)

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from hookdet.yaml_limits import BoundedComposer, check_expanded_size, check_text
from hookdet.search.space import searched_names

__all__ = [
    "CLUSTER_ONLY_FIELDS",
    "STORAGE_PLUGIN_FOR_TYPE",
    "CheckpointStorageConfig",
    "ConfigError",
    "DirectoryStorageConfig",
    "ExperimentConfig",
    "Length",
    "OptimizationsConfig",
    "ReproducibilityConfig",
    "ResourcesConfig",
    "S3StorageConfig",
    "SearcherConfig",
    "SharedFSStorageConfig",
    "length_in_batches",
    "load_experiment_config",
    "parse_experiment_config",
]

FieldPath = Tuple[str, ...]

STORAGE_PLUGIN_FOR_TYPE: Mapping[str, str] = MappingProxyType(
    {"shared_fs": "local_storage", "directory": "local_storage", "s3": "s3_storage"}
)
"""``checkpoint_storage.type`` -> the name of the storage plugin that serves it."""

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
    "searcher.replace_function",
    "searcher.source_checkpoint_uuid",
    "searcher.source_trial_id",
    "searcher.stop_once",
    "searcher.time_metric",
    "searcher.train_stragglers",
    "searcher.unit",
)
"""Determined fields that only mean something on a Determined cluster (scheduling, containers,
multi-trial searches, the master's bookkeeping). They are accepted, dropped, and listed in
:attr:`ExperimentConfig.ignored_fields`; a whole block such as ``environment`` is one entry."""

LENGTH_UNITS: Tuple[str, ...] = ("batches", "epochs", "records")
HYPERPARAMETER_SEARCH_TYPES: Tuple[str, ...] = ("int", "double", "log", "categorical")
MAX_EXPERIMENT_SEED = 2**31 - 1


def _cluster_only_by_parent() -> Dict[FieldPath, frozenset]:
    grouped: Dict[FieldPath, set] = {}
    for dotted in CLUSTER_ONLY_FIELDS:
        *parent, name = dotted.split(".")
        grouped.setdefault(tuple(parent), set()).add(name)
    return {parent: frozenset(names) for parent, names in grouped.items()}


_CLUSTER_ONLY_BY_PARENT = _cluster_only_by_parent()


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class ConfigError(Exception):
    """A bad experiment file or dict; the message says where (file:line) and what.

    ``source`` is the file (or ``"<dict>"``), ``line`` and ``column`` are 1-based when known,
    ``field`` is the dotted field path when the problem belongs to one.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str,
        line: Optional[int] = None,
        column: Optional[int] = None,
        field: Optional[str] = None,
    ) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.column = column
        self.field = field
        location = source
        if line is not None:
            location += f":{line}" + (f":{column}" if column is not None else "")
        super().__init__(f"{location}: {message}")


class _FieldProblem(ValueError):
    """Raised by validators for a problem below the field they validate, so the error can
    name (and find the line of) e.g. ``hyperparameters.optimizer.lr`` rather than just
    ``hyperparameters``."""

    def __init__(self, subpath: FieldPath, message: str) -> None:
        super().__init__(message)
        self.subpath = subpath
        self.message = message


def _dotted(path: FieldPath) -> str:
    return ".".join(str(part) for part in path)


def _show(value: Any) -> str:
    """A value as the user wrote it in YAML, shortened for an error message."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    text = f"'{value}'" if isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _did_you_mean(word: str, candidates: List[str]) -> str:
    matches = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean '{matches[0]}'?" if matches else ""


class _LineIndex:
    """Where each field stands in the YAML file, and which fields came from overrides instead."""

    def __init__(self, lines: Optional[Dict[FieldPath, int]] = None) -> None:
        self.lines: Dict[FieldPath, int] = lines or {}
        self.overridden: set = set()

    def line_of(self, path: FieldPath) -> Optional[int]:
        """The line of ``path``, else of its closest ancestor in the file; None for fields set
        by overrides (their file line would point at a value that is not the one in use)."""
        for end in range(len(path), 0, -1):
            prefix = path[:end]
            if prefix in self.overridden:
                return None
            if prefix in self.lines:
                return self.lines[prefix]
        return None

    def came_from_overrides(self, path: FieldPath) -> bool:
        return any(path[:end] in self.overridden for end in range(len(path), 0, -1))


class _Reporter:
    """Builds the one :class:`ConfigError` for a problem at a field path."""

    def __init__(self, source: str, index: _LineIndex) -> None:
        self.source = source
        self.index = index

    def error(self, path: FieldPath, message: str) -> ConfigError:
        if path and self.index.came_from_overrides(path):
            message += " (set by overrides)"
        return ConfigError(
            message,
            source=self.source,
            line=self.index.line_of(path),
            field=_dotted(path) if path else None,
        )


# ---------------------------------------------------------------------------------------------
# Training lengths
# ---------------------------------------------------------------------------------------------


class Length(BaseModel):
    """A training length in one of Determined's units, e.g. ``{batches: 937}`` in the file.

    Stored as ``unit`` and ``value``; serialised back to Determined's one-key mapping so a
    config snapshot reads like the file it came from. Convert to batches with
    :func:`length_in_batches` once the batch size and epoch length are known.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    unit: Literal["batches", "epochs", "records"]
    value: int = Field(ge=0)

    @model_serializer
    def _as_determined_mapping(self) -> Dict[str, int]:
        return {self.unit: self.value}

    def __str__(self) -> str:
        return f"{self.value} {self.unit}"

    @classmethod
    def parse(cls, raw: Any, *, allow_bare_int: bool = False, minimum: int = 0) -> "Length":
        """Read Determined's forms: ``{batches: n}``, ``{epochs: n}``, ``{records: n}``, and
        (where Determined allows it, ``searcher.max_length``) a bare int meaning batches.

        Raises ValueError with a message fit for the user on any other shape.
        """
        if isinstance(raw, Length):
            value, unit = raw.value, raw.unit
        elif allow_bare_int and isinstance(raw, int) and not isinstance(raw, bool):
            value, unit = raw, "batches"
        elif isinstance(raw, Mapping):
            if len(raw) != 1:
                keys = ", ".join(str(key) for key in raw) or "none"
                raise ValueError(
                    "a length has exactly one of batches, epochs or records "
                    f"(like {{batches: 100}}); got keys: {keys}"
                )
            ((unit, value),) = raw.items()
            if unit not in LENGTH_UNITS:
                raise ValueError(
                    f"unknown length unit {_show(unit)}"
                    f"{_did_you_mean(str(unit), list(LENGTH_UNITS))}"
                    " (use batches, epochs or records)"
                )
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"the number of {unit} must be a whole number; got {_show(value)}")
        else:
            also = " or a number of batches" if allow_bare_int else ""
            raise ValueError(
                "expected a length like {batches: 100}, {epochs: 2} or {records: 6400}"
                f"{also}; got {_show(raw)}"
            )
        if value < minimum:
            raise ValueError(f"the number of {unit} must be at least {minimum}; got {value}")
        return cls(unit=unit, value=value)


def length_in_batches(
    length: Length,
    *,
    global_batch_size: Optional[int] = None,
    epoch_length_batches: Optional[int] = None,
) -> int:
    """``length`` as a number of batches, the unit hookdet's loop counts in.

    Batches are themselves. Records become ``max(records // global_batch_size, 1)``, as
    Determined's ``Batch._from_records`` does: a partial batch is dropped, but a nonzero length
    shorter than one batch still trains one batch. Epochs are ``epochs * epoch_length_batches``
    (the training loader's length, which Determined also uses for PyTorchTrial rather than
    ``records_per_epoch``). A length of 0 is 0 in every unit.

    Raises ValueError naming the missing argument when a unit needs one that was not given.
    """
    if length.value == 0 or length.unit == "batches":
        return length.value
    if length.unit == "records":
        if global_batch_size is None or global_batch_size < 1:
            raise ValueError(
                f"converting {length} to batches needs a global_batch_size of at least 1, "
                f"got {global_batch_size!r}"
            )
        return max(length.value // global_batch_size, 1)
    if epoch_length_batches is None or epoch_length_batches < 1:
        raise ValueError(
            f"converting {length} to batches needs epoch_length_batches of at least 1, "
            f"got {epoch_length_batches!r}"
        )
    return length.value * epoch_length_batches


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


class _Section(BaseModel):
    """A block of the file: strict types (YAML's own), no unknown keys, null means default."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """Determined's schema accepts ``null`` for an optional field and applies the default;
        so does hookdet."""
        if isinstance(data, Mapping):
            return {key: value for key, value in data.items() if value is not None}
        return data


class SearcherConfig(_Section):
    """``searcher``: hookdet runs one trial, so it uses the metric settings and ``max_length``
    (Determined's trial length; deprecated there in 0.38 in favour of ``Trainer.fit``, still
    the way an experiment file says how long to train). The other searchers' fields are
    cluster-only."""

    name: Literal[
        "single",
        "random",
        "grid",
        "adaptive_asha",
        "pbt",
        "async_halving",
        "adaptive",
        "adaptive_simple",
        "sync_halving",
        "custom",
    ] = "single"
    metric: str = "validation_loss"
    smaller_is_better: bool = True
    max_length: Optional[Length] = None

    @field_validator("max_length", mode="before")
    @classmethod
    def _read_max_length(cls, raw: Any) -> Length:
        return Length.parse(raw, allow_bare_int=True, minimum=1)


class OptimizationsConfig(_Section):
    """``optimizations``, with Determined's defaults. ``aggregation_frequency`` and
    ``average_aggregated_gradients`` drive gradient aggregation; the rest is read by the
    plugins that care (mixed precision, Horovod's fusion and compression)."""

    aggregation_frequency: int = Field(1, ge=1)
    average_aggregated_gradients: bool = True
    average_training_metrics: bool = True
    gradient_compression: bool = False
    mixed_precision: Literal["O0", "O1", "O2", "O3"] = "O0"
    auto_tune_tensor_fusion: bool = False
    tensor_fusion_threshold: int = Field(64, ge=0)
    tensor_fusion_cycle_time: int = Field(5, ge=0)


class ResourcesConfig(_Section):
    """``resources``: only ``slots_per_trial`` (processes to train with; more than 1 means
    distributed training) matters off a cluster."""

    slots_per_trial: int = Field(1, ge=0)


class ReproducibilityConfig(_Section):
    """``reproducibility.experiment_seed``, 0 to 2**31-1.

    Determined's master draws a missing seed from the clock when it creates the experiment,
    once, in one process. hookdet reads the file in every rank of a distributed run and again
    on resume, where a clock-drawn seed would differ between readers; so a missing seed is 0,
    every run is repeatable by default, and a different seed is one line in the file.
    """

    experiment_seed: int = Field(0, ge=0, le=MAX_EXPERIMENT_SEED)


class _StorageConfig(_Section):
    """Determined's checkpoint garbage-collection counts, common to every storage type."""

    save_experiment_best: int = Field(0, ge=0)
    save_trial_best: int = Field(1, ge=0)
    save_trial_latest: int = Field(1, ge=0)

    @property
    def plugin_name(self) -> str:
        """The storage plugin that serves this type (:data:`STORAGE_PLUGIN_FOR_TYPE`)."""
        return STORAGE_PLUGIN_FOR_TYPE[self.type]  # type: ignore[attr-defined]


class SharedFSStorageConfig(_StorageConfig):
    """``type: shared_fs``: checkpoints under ``host_path`` (joined with ``storage_path``).
    ``container_path`` and ``propagation`` describe a cluster container's mount; kept so the
    file round-trips, unused locally."""

    type: Literal["shared_fs"] = "shared_fs"
    host_path: str
    storage_path: Optional[str] = None
    container_path: Optional[str] = None
    propagation: str = "rprivate"


class DirectoryStorageConfig(_StorageConfig):
    """``type: directory``: checkpoints in ``container_path``, a local directory."""

    type: Literal["directory"] = "directory"
    container_path: str


class S3StorageConfig(_StorageConfig):
    """``type: s3``: Amazon S3 or a compatible store at ``endpoint_url``.

    Determined requires ``access_key``/``secret_key``; hookdet lets both be absent so boto3's
    usual credential chain applies, but not just one. ``region`` is hookdet's addition.
    """

    type: Literal["s3"] = "s3"
    bucket: str
    prefix: Optional[str] = None
    endpoint_url: Optional[str] = None
    access_key: Optional[str] = None
    secret_key: Optional[str] = None
    region: Optional[str] = None

    @model_validator(mode="after")
    def _keys_come_in_pairs(self) -> "S3StorageConfig":
        if (self.access_key is None) != (self.secret_key is None):
            if self.secret_key is None:
                given, missing = "access_key", "secret_key"
            else:
                given, missing = "secret_key", "access_key"
            raise _FieldProblem(
                (missing,),
                f"{given} is set but {missing} is not; give both, or neither to use boto3's "
                "usual credentials (environment, ~/.aws)",
            )
        if self.prefix is not None and ".." in self.prefix.split("/"):
            raise _FieldProblem(
                ("prefix",), f"prefix must not contain '..'; got {_show(self.prefix)}"
            )
        return self


CheckpointStorageConfig = Annotated[
    Union[SharedFSStorageConfig, DirectoryStorageConfig, S3StorageConfig],
    Field(discriminator="type"),
]
"""``checkpoint_storage``, one of the three types hookdet can store to, chosen by ``type``."""


# ---------------------------------------------------------------------------------------------
# Free-form blocks: hyperparameters, data, plugin_config
# ---------------------------------------------------------------------------------------------


def _plain_value(value: Any, path: FieldPath) -> Any:
    """A deep copy of ``value`` if it is JSON-shaped (so snapshots and checkpoint metadata can
    hold it); else a problem naming the first offending spot."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, list):
        return [_plain_value(item, path + (str(index),)) for index, item in enumerate(value)]
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _FieldProblem(path, f"keys must be strings; quote the key {_show(key)}")
            result[key] = _plain_value(item, path + (key,))
        return result
    raise _FieldProblem(
        path, f"a {type(value).__name__} value cannot be stored in a run's config; quote it"
    )


def _reduce_hyperparameters(raw: Mapping, path: FieldPath) -> Dict[str, Any]:
    """Determined's hyperparameter block as the values one trial uses.

    A mapping with a ``type`` key is a Determined hyperparameter spec: ``{type: const, val: x}``
    becomes ``x``; a search space (int, double, log, categorical) is refused, since hookdet
    trains one trial with fixed values. A mapping without ``type`` is a nested group.
    """
    result: Dict[str, Any] = {}
    for name, value in raw.items():
        entry_path = path + (str(name),)
        if not isinstance(name, str):
            raise _FieldProblem(
                entry_path, f"hyperparameter names must be strings; quote {_show(name)}"
            )
        if isinstance(value, Mapping) and "type" in value:
            result[name] = _reduce_spec(value, entry_path)
        elif isinstance(value, Mapping):
            result[name] = _reduce_hyperparameters(value, entry_path)
        else:
            result[name] = _plain_value(value, entry_path)
    return result


def _reduce_spec(spec: Mapping, path: FieldPath) -> Any:
    kind = spec["type"]
    if kind == "const":
        unexpected = [str(key) for key in spec if key not in ("type", "val")]
        if unexpected:
            raise _FieldProblem(
                path + (unexpected[0],),
                "a const hyperparameter has only 'type' and 'val'; "
                f"unexpected {_show(unexpected[0])}",
            )
        if "val" not in spec:
            raise _FieldProblem(path, "a const hyperparameter needs 'val' (the value)")
        return _plain_value(spec["val"], path + ("val",))
    if kind in HYPERPARAMETER_SEARCH_TYPES:
        return _searched_spec(spec, path)
    choices = ("const",) + HYPERPARAMETER_SEARCH_TYPES
    raise _FieldProblem(
        path + ("type",),
        f"unknown hyperparameter type {_show(kind)}{_did_you_mean(str(kind), list(choices))} "
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
        raise _FieldProblem(problem.path, str(problem)) from None
    return _plain_value(spec, path)


def _check_global_batch_size(hyperparameters: Mapping[str, Any]) -> None:
    if "global_batch_size" not in hyperparameters:
        return
    size = hyperparameters["global_batch_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise _FieldProblem(
            ("global_batch_size",),
            f"must be a whole number of at least 1; got {_show(size)}",
        )


_ENTRYPOINT = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _trial_spec_from_entrypoint(raw: Any) -> str:
    """``module:Class``, or the command, from Determined's entrypoint forms.

    ``model_def:MNistTrial`` and ``pkg.mod:outer.Trial`` are taken as they are;
    ``python3 -m determined.launch.<launcher> ... --trial model_def:Trial`` gives its ``--trial``
    (hookdet launches distributed runs itself, from ``resources.slots_per_trial``). Any other
    command (``python3 train.py --epochs 1``, a launch-layer wrapper around a script) is kept as
    one string (a list is joined with shell quoting) and run by :mod:`hookdet.script_entrypoint`.
    """
    if isinstance(raw, list) and raw and all(isinstance(part, str) for part in raw):
        tokens = list(raw)
    elif isinstance(raw, str) and raw.strip():
        if _ENTRYPOINT.match(raw.strip()):
            return raw.strip()
        try:
            tokens = shlex.split(raw)
        except ValueError as error:
            raise ValueError(f"cannot split the command {_show(raw)} into words: {error}") from None
    else:
        raise ValueError(f"expected 'module:Class' or a command; got {_show(raw)}")
    uses_determined_launcher = any(
        token.startswith("determined.launch") for token in tokens
    ) and "-m" in tokens
    if uses_determined_launcher and "--trial" in tokens:
        position = tokens.index("--trial") + 1
        if position < len(tokens) and _ENTRYPOINT.match(tokens[position]):
            return tokens[position]
    if isinstance(raw, str) and re.fullmatch(r"[A-Za-z_]\w*", raw.strip()):
        raise ValueError(
            f"expected 'module:Class' or a command; got {_show(raw)} "
            f"(name its module too, e.g. 'model_def:{raw.strip()}')"
        )
    return raw.strip() if isinstance(raw, str) else shlex.join(tokens)


def names_trial_class(entrypoint: Optional[str]) -> bool:
    """Whether ``entrypoint`` names a trial class (``module:Class``) rather than a command."""
    return bool(entrypoint) and bool(_ENTRYPOINT.match(entrypoint))


_PLUGIN_NAME = re.compile(r"^(no:|\+)?[A-Za-z_][\w.-]*$")


def _read_only_plugins(raw: Mapping) -> Dict[str, List[str]]:
    """``plugins: {only: [...]}``: exactly these plugins, no defaults, no markers."""
    if set(raw) != {"only"}:
        raise ValueError(f"the mapping form of plugins is {{only: [name, ...]}}; got {_show(dict(raw))}")
    names = raw["only"]
    if not isinstance(names, list):
        raise _FieldProblem(("only",), f"expected a list of plugin names; got {_show(names)}")
    for index, name in enumerate(names):
        if not isinstance(name, str) or not _PLUGIN_NAME.match(name) or name.startswith(("no:", "+")):
            raise _FieldProblem(("only", str(index)), f"expected a plain plugin name; got {_show(name)}")
        if name in names[:index]:
            raise _FieldProblem(("only", str(index)), f"plugin '{name}' is listed twice")
    return {"only": list(names)}


# ---------------------------------------------------------------------------------------------
# The whole file
# ---------------------------------------------------------------------------------------------


class ExperimentConfig(_Section):
    """A validated experiment file with Determined's defaults filled in.

    Build it with :func:`load_experiment_config` or :func:`parse_experiment_config` (which also
    accept Determined's cluster-only fields and give file/line errors); constructing it directly
    validates the same fields without those two extras.
    """

    name: Optional[str] = None
    description: Optional[str] = None
    entrypoint: Optional[str] = None
    hyperparameters: Dict[str, Any] = Field(default_factory=dict)
    searcher: SearcherConfig = Field(default_factory=SearcherConfig)
    records_per_epoch: Optional[int] = Field(None, ge=0)
    min_validation_period: Optional[Length] = None
    min_checkpoint_period: Optional[Length] = None
    scheduling_unit: int = Field(100, ge=1)
    perform_initial_validation: bool = False
    optimizations: OptimizationsConfig = Field(default_factory=OptimizationsConfig)
    checkpoint_storage: Optional[CheckpointStorageConfig] = None
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    reproducibility: ReproducibilityConfig = Field(default_factory=ReproducibilityConfig)
    data: Dict[str, Any] = Field(default_factory=dict)
    #: A list (names add to the defaults, ``no:<name>`` removes one) or ``{only: [...]}``;
    #: resolved by :mod:`hookdet.plugin_list`, read through ``run.plugin_names``.
    plugins: Optional[Union[List[str], Dict[str, List[str]]]] = None
    plugin_config: Dict[str, Dict[str, Any]] = Field(default_factory=dict)

    _ignored_fields: List[str] = PrivateAttr(default_factory=list)
    _source: str = PrivateAttr(default="<dict>")
    _hyperparameter_space: Optional[Dict[str, Any]] = PrivateAttr(default=None)

    @field_validator("entrypoint", mode="before")
    @classmethod
    def _read_entrypoint(cls, raw: Any) -> str:
        return _trial_spec_from_entrypoint(raw)

    @field_validator("hyperparameters", mode="before")
    @classmethod
    def _read_hyperparameters(cls, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            return raw
        reduced = _reduce_hyperparameters(raw, ())
        if searched_names(reduced):
            return _plain_value(raw, ())  # the space; sampled in _sample_hyperparameters
        _check_global_batch_size(reduced)
        return reduced

    @model_validator(mode="after")
    def _sample_hyperparameters(self) -> "ExperimentConfig":
        """A file with a search space trains, as one run, trial 1 of its search: the values
        and seed Determined's master draws first from ``experiment_seed`` (what its ``single``
        searcher trains). The space stays in :attr:`hyperparameter_space` for a search."""
        if not searched_names(self.hyperparameters):
            return self
        from hookdet.search.space import first_trial

        draw = first_trial(self.hyperparameters, self.reproducibility.experiment_seed)
        self._hyperparameter_space = self.hyperparameters
        try:
            _check_global_batch_size(draw.hparams)
        except _FieldProblem as problem:
            raise ValueError(f"hyperparameters.{_dotted(problem.subpath)}: {problem}") from None
        self.hyperparameters = draw.hparams
        return self

    @field_validator("min_validation_period", "min_checkpoint_period", mode="before")
    @classmethod
    def _read_period(cls, raw: Any) -> Optional[Length]:
        """A period of 0 (Determined's default, ``{batches: 0}``) means none, as absence does."""
        period = Length.parse(raw)
        return period if period.value > 0 else None

    @field_validator("data", mode="before")
    @classmethod
    def _read_data(cls, raw: Any) -> Any:
        return _plain_value(raw, ()) if isinstance(raw, Mapping) else raw

    @field_validator("plugins", mode="before")
    @classmethod
    def _read_plugins(cls, raw: Any) -> Any:
        if isinstance(raw, Mapping):
            return _read_only_plugins(raw)
        if not isinstance(raw, list):
            raise ValueError(
                f"expected a list of plugin names like [checkpoint, amp]; got {_show(raw)} (names "
                "add to the defaults, 'no:<name>' removes one, {only: [...]} runs exactly those)"
            )
        seen = set()
        for index, name in enumerate(raw):
            if not isinstance(name, str) or not _PLUGIN_NAME.match(name):
                raise _FieldProblem(
                    (str(index),),
                    f"expected a plugin name (or 'no:<name>' to drop a default); got {_show(name)}",
                )
            plain = name[3:] if name.startswith("no:") else name.lstrip("+")
            if plain in seen:
                raise _FieldProblem((str(index),), f"plugin '{plain}' is listed twice")
            seen.add(plain)
        return raw

    @field_validator("plugin_config", mode="before")
    @classmethod
    def _read_plugin_config(cls, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            return raw
        result = {}
        for name, options in raw.items():
            if options is None:
                options = {}
            if not isinstance(options, Mapping):
                raise _FieldProblem(
                    (str(name),),
                    f"the options of plugin '{name}' must be a mapping; got {_show(options)}",
                )
            result[name] = _plain_value(options, (str(name),))
        return result

    @property
    def ignored_fields(self) -> List[str]:
        """Dotted paths of the cluster-only fields the file set, in file order (for one note)."""
        return list(self._ignored_fields)

    @property
    def source(self) -> str:
        """The file this came from (``"<dict>"`` for a dict), for messages that name it."""
        return self._source

    @property
    def hyperparameter_space(self) -> Optional[Dict[str, Any]]:
        """The ``hyperparameters`` block as written when it has a search space (int, double,
        log, categorical entries), else None; ``hyperparameters`` then holds trial 1's draw."""
        return copy.deepcopy(self._hyperparameter_space)

    @property
    def global_batch_size(self) -> Optional[int]:
        """``hyperparameters.global_batch_size``, if set (checked to be an int >= 1)."""
        return self.hyperparameters.get("global_batch_size")

    def entrypoint_parts(self) -> Tuple[str, str]:
        """``entrypoint`` split into (module, attribute path), e.g. ``("model_def", "MNistTrial")``.

        Raises ConfigError naming the file when the config has no entrypoint.
        """
        if self.entrypoint is None:
            raise ConfigError("entrypoint is required to run a trial class", source=self._source)
        module, _, qualname = self.entrypoint.partition(":")
        return module, qualname

    def trial_seed(self, trial_id: int = 1) -> int:
        """The seed of trial ``trial_id`` (1 for a local run), derived as Determined's master
        derives it from ``reproducibility.experiment_seed``.

        The master's searcher owns a Mersenne Twister seeded with the experiment seed (its
        ``nprand``, numpy's ``RandomState`` generator). Each trial it creates draws a request
        id (four 32-bit words) and then the trial seed (the next word's low 31 bits); sampling
        constant hyperparameters draws nothing. So trial ``k``'s seed is word ``5k`` of the
        stream, masked to 0..2**31-1: deterministic, and the seed that trial gets on a cluster.
        """
        if trial_id < 1:
            raise ValueError(f"trial_id counts from 1; got {trial_id}")
        if os.environ.get(TRIAL_SEED_ENV):  # a search's trial: the seed its searcher drew
            return int(os.environ[TRIAL_SEED_ENV])
        if self._hyperparameter_space is not None:
            from hookdet.search.space import MasterRandom, draw_trial

            rand = MasterRandom(self.reproducibility.experiment_seed)
            draws = [draw_trial(self._hyperparameter_space, rand) for _ in range(trial_id)]
            return draws[-1].seed
        words = _mersenne_twister_words(self.reproducibility.experiment_seed, 5 * trial_id)
        return words[-1] & MAX_EXPERIMENT_SEED

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable snapshot (for the run directory and checkpoint metadata) that
        :func:`parse_experiment_config` reads back into a config with the same fields (its
        ``source`` and ``ignored_fields`` are not part of the snapshot). Lengths are in
        Determined's ``{unit: n}`` form; cluster-only fields are not included."""
        return self.model_dump(mode="json")


#: Set by a hyperparameter search for each trial it runs: the seed Determined's master drew.
TRIAL_SEED_ENV = "HOOKDET_TRIAL_SEED"


def _mersenne_twister_words(seed: int, count: int) -> List[int]:
    """The first ``count`` 32-bit outputs of MT19937 seeded with ``init_genrand(seed)``, the
    seeding numpy's RandomState and Determined's nprand use for an integer seed."""
    state = [seed & 0xFFFFFFFF]
    for index in range(1, 624):
        previous = state[-1]
        state.append((1812433253 * (previous ^ (previous >> 30)) + index) & 0xFFFFFFFF)
    generator = random.Random()
    generator.setstate((3, tuple(state) + (624,), None))
    return [generator.getrandbits(32) for _ in range(count)]


# ---------------------------------------------------------------------------------------------
# Screening: cluster-only fields out, unknown fields refused
# ---------------------------------------------------------------------------------------------


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
    model: type, key: str, value: Any, key_path: FieldPath, reporter: _Reporter
) -> Optional[type]:
    """The section model a field holds, for screening its keys; None for leaf and free-form
    fields. A tagged union (checkpoint_storage) picks its member by ``type``, which must be
    present and known."""
    candidates = [
        member
        for member in _union_members(model.model_fields[key].annotation)
        if isinstance(member, type) and issubclass(member, _Section)
    ]
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    if not isinstance(value, Mapping):
        return None
    by_tag = {get_args(member.model_fields["type"].annotation)[0]: member for member in candidates}
    tag = value.get("type")
    choices = ", ".join(by_tag)
    if tag is None:
        raise reporter.error(key_path, f"{_dotted(key_path)}.type is required: one of {choices}")
    if tag not in by_tag:
        raise reporter.error(
            key_path + ("type",),
            f"{_dotted(key_path)}.type {_show(tag)} is not a storage hookdet has; use one of "
            f"{choices}{_did_you_mean(str(tag), list(by_tag))}",
        )
    return by_tag[tag]


def _screen(
    section: Mapping, model: type, path: FieldPath, ignored: List[str], reporter: _Reporter
) -> Dict[str, Any]:
    """``section`` without its cluster-only fields (recorded in ``ignored``), its sub-sections
    screened likewise; the first unknown field raises, with the closest known name."""
    cluster_only = _CLUSTER_ONLY_BY_PARENT.get(path, frozenset())
    known = list(model.model_fields)
    kept: Dict[str, Any] = {}
    for key, value in section.items():
        key_path = path + (str(key),)
        if not isinstance(key, str):
            raise reporter.error(key_path, f"field names must be strings; got {_show(key)}")
        if key in cluster_only:
            ignored.append(_dotted(key_path))
            continue
        if key not in model.model_fields:
            suggestion = _did_you_mean(key, known + sorted(cluster_only))
            listing = "" if suggestion else f"; known fields here: {', '.join(known)}"
            raise reporter.error(
                key_path, f"unknown field '{_dotted(key_path)}'{suggestion}{listing}"
            )
        sub_model = _section_model_of(model, key, value, key_path, reporter)
        if sub_model is not None and isinstance(value, Mapping):
            value = _screen(value, sub_model, key_path, ignored, reporter)
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
    if len(loc) >= 2 and loc[0] == "checkpoint_storage" and loc[1] in STORAGE_PLUGIN_FOR_TYPE:
        del loc[1]
    path = tuple(loc)
    kind = error["type"]
    context = error.get("ctx") or {}
    if kind == "value_error":
        cause = context.get("error")
        if isinstance(cause, _FieldProblem):
            path += tuple(str(part) for part in cause.subpath)
            return path, f"{_dotted(path)}: {cause.message}"
        return path, f"{_dotted(path)}: {cause}"
    if kind == "missing":
        return path, f"{_dotted(path)} is required"
    if kind == "extra_forbidden":
        return path, f"unknown field '{_dotted(path)}'"
    if kind == "literal_error":
        message = f"expected one of {context.get('expected')}"
    elif kind == "greater_than_equal":
        message = f"must be at least {context.get('ge')}"
    elif kind == "less_than_equal":
        message = f"must be at most {context.get('le')}"
    else:
        message = _FRIENDLY_MESSAGES.get(kind, error["msg"])
    return path, f"{_dotted(path)}: {message}; got {_show(error.get('input'))}"


def _config_error_from(exc: ValidationError, reporter: _Reporter) -> ConfigError:
    """The first problem in file order as a ConfigError, with a count of any others."""
    problems = [_problem_from_pydantic(error) for error in exc.errors(include_url=False)]
    position = {id(problem): index for index, problem in enumerate(problems)}
    problems.sort(
        key=lambda problem: (reporter.index.line_of(problem[0]) or 0, position[id(problem)])
    )
    path, message = problems[0]
    if len(problems) > 1:
        others = len(problems) - 1
        message += f" (and {others} more problem{'s' if others > 1 else ''})"
    return reporter.error(path, message)


# ---------------------------------------------------------------------------------------------
# Overrides
# ---------------------------------------------------------------------------------------------


_LENGTH_FIELDS = frozenset(
    {("searcher", "max_length"), ("min_validation_period",), ("min_checkpoint_period",)}
)


def _nested_overrides(overrides: Mapping[str, Any], source: str) -> Dict[str, Any]:
    """Dotted keys (``"searcher.max_length"``) as nested mappings."""
    nested: Dict[str, Any] = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or "" in key.split("."):
            raise ConfigError(
                f"override keys must be dotted field names; got {_show(key)}", source=source
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
    return _build(data, _Reporter(source, _LineIndex()), overrides)


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
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("no such experiment file", source=source) from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"not UTF-8 text ({error.reason})", source=source) from None
    except OSError as error:
        raise ConfigError(
            f"cannot read the experiment file: {error.strerror}", source=source
        ) from None
    data, root = _read_yaml(text, source)
    if data is None:
        raise ConfigError(
            "the experiment file is empty; expected fields such as 'entrypoint' and 'searcher'",
            source=source,
        )
    if not isinstance(data, dict):
        raise ConfigError(
            f"the top level must be a mapping of fields (like 'searcher: ...'); got a "
            f"{_yaml_kind(data)}",
            source=source,
            line=root.start_mark.line + 1,
        )
    lines: Dict[FieldPath, int] = {}
    _index_lines(root, (), lines, source)
    return _build(data, _Reporter(source, _LineIndex(lines)), overrides)


def _build(
    data: Any, reporter: _Reporter, overrides: Optional[Mapping[str, Any]]
) -> ExperimentConfig:
    if not isinstance(data, Mapping):
        raise reporter.error(
            (), f"expected a mapping of experiment fields; got a {_yaml_kind(data)}"
        )
    merged = copy.deepcopy(dict(data))
    if overrides:
        if not isinstance(overrides, Mapping):
            raise ConfigError(
                f"overrides must be a mapping; got {_show(overrides)}", source=reporter.source
            )
        nested = _nested_overrides(overrides, reporter.source)
        _merge_into(merged, nested, (), reporter.index.overridden)
    ignored: List[str] = []
    screened = _screen(merged, ExperimentConfig, (), ignored, reporter)
    try:
        config = ExperimentConfig.model_validate(screened)
    except ValidationError as error:
        raise _config_error_from(error, reporter) from None
    if config.searcher.name != "single":
        ignored.append("searcher.name")
    config._ignored_fields = ignored
    config._source = reporter.source
    return config


# ---------------------------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------------------------


class _Yaml12Loader(BoundedComposer, yaml.SafeLoader):
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
    data, _ = _read_yaml(Path(path).read_text(encoding="utf-8"), str(path))
    return data


def _read_yaml(text: str, source: str) -> Tuple[Any, Optional[yaml.Node]]:
    """(content, node tree) of one YAML document; malformed YAML is a ConfigError at
    line:column."""
    loader = _Yaml12Loader(text)
    try:
        check_text(text)
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
    except yaml.YAMLError as error:
        raise ConfigError(f"malformed YAML: {error}", source=source) from None
    finally:
        loader.dispose()
    return data, root


def read_yaml_value(text: str, source: str) -> Any:
    """``text`` read as the experiment file is read (YAML 1.2); malformed YAML is a ConfigError."""
    return _read_yaml(text, source)[0]


def _index_lines(
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
                    f"duplicate key '{_dotted(path + (key,))}' (first given on line {seen[key]})",
                    source=source,
                    line=line,
                    field=_dotted(path + (key,)),
                )
            seen[key] = line
            lines[path + (key,)] = line
            _index_lines(value_node, path + (key,), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[path + (str(index),)] = item.start_mark.line + 1
            _index_lines(item, path + (str(index),), lines, source)


def _yaml_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return f"string ({_show(value)})"
    return f"{type(value).__name__} ({_show(value)})"

