"""The typed sections of an experiment file: training lengths, ``searcher``, ``optimizations``,
``resources``, ``reproducibility`` and ``checkpoint_storage``, as pydantic models with
Determined's defaults (strict YAML types, no unknown keys, ``null`` meaning the default)."""
from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Dict, Literal, Mapping, Optional, Tuple, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_serializer,
    model_validator,
)

from hookdet.config.problems import FieldProblem, as_written, did_you_mean

LENGTH_UNITS: Tuple[str, ...] = ("batches", "epochs", "records")
MAX_EXPERIMENT_SEED = 2**31 - 1


class Length(BaseModel):
    """A training length in one of Determined's units, e.g. ``{batches: 937}`` in the file.

    Stored as ``unit`` and ``value``; serialised back to Determined's one-key mapping so a
    config snapshot reads like the file it came from. Convert to batches with
    :func:`length_in_batches` once the batch size and epoch length are known.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    unit: Literal["batches", "epochs", "records"]
    value: int = Field(ge=0)
    #: Written as a bare number (a command entrypoint's ``searcher.max_length``, which Determined's
    #: Core API reads in the script's own unit): counted as batches, written back bare.
    unitless: bool = False

    @model_serializer
    def _as_determined_mapping(self) -> Any:
        return self.value if self.unitless else {self.unit: self.value}

    def __str__(self) -> str:
        return f"{self.value} {self.unit}"

    @classmethod
    def parse(cls, raw: Any, *, minimum: int = 0) -> "Length":
        """Read Determined's forms: ``{batches: n}``, ``{epochs: n}``, ``{records: n}``.

        Raises ValueError with a message fit for the user on any other shape.
        """
        if isinstance(raw, Length):
            if raw.value < minimum:
                raise ValueError(f"the number of {raw.unit} must be at least {minimum}; got {raw.value}")
            return raw
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
                    f"unknown length unit {as_written(unit)}"
                    f"{did_you_mean(str(unit), list(LENGTH_UNITS))}"
                    " (use batches, epochs or records)"
                )
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"the number of {unit} must be a whole number; got {as_written(value)}")
        else:
            raise ValueError(
                "expected a length like {batches: 100}, {epochs: 2} or {records: 6400}; "
                f"got {as_written(raw)}"
            )
        if value < minimum:
            raise ValueError(f"the number of {unit} must be at least {minimum}; got {value}")
        return cls(unit=unit, value=value)


def bare_length_refusal(value: int) -> str:
    """Why ``searcher.max_length: <value>`` is refused, and what to write instead."""
    return (f"a bare number has no unit: write {{batches: {value}}}, {{epochs: {value}}} or "
            f"{{records: {value}}} (Determined reads a plain {value} as a length without a unit, "
            "and its harness stops with 'unrecognized searcher unit None')")


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


class Section(BaseModel):
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


#: The searchers hookdet runs (``optuna`` is its own: Optuna's samplers and pruners,
#: hookdet.search.optuna_search).
SEARCHERS = ("single", "random", "grid", "adaptive_asha", "async_halving", "optuna")
#: Searcher names Determined knows that hookdet does not run, each with the reason given.
NOT_RUN_HERE = {
    **{name: f"the '{name}' searcher has been removed and is not valid for new experiments "
             "(Determined 0.38's words)"
       for name in ("custom", "adaptive", "adaptive_simple", "sync_halving")},
    "pbt": "'pbt' (population-based training) is a searcher of Determined's cluster that hookdet "
           "does not run; adaptive_asha, or optuna with a pruner, search by stopping trials early",
}


class SearcherConfig(Section):
    """``searcher``: hookdet runs one trial, so it uses the metric settings and ``max_length``
    (Determined's trial length; deprecated there in 0.38 in favour of ``Trainer.fit``, still
    the way an experiment file says how long to train). The other searchers' fields are
    cluster-only."""

    name: str = "single"
    metric: str = "validation_loss"
    smaller_is_better: bool = True
    max_length: Optional[Length] = None
    #: Determined's warm start: every trial begins with this checkpoint's weights, optimizer,
    #: scheduler, callback and RNG state, at batch 0 (a storage id, checkpoint or run directory).
    source_checkpoint_uuid: Optional[str] = None
    source_trial_id: Optional[int] = None

    @field_validator("name")
    @classmethod
    def _known_searcher(cls, name: str) -> str:
        if name in SEARCHERS:
            return name
        if name in NOT_RUN_HERE:
            raise ValueError(NOT_RUN_HERE[name])
        raise ValueError(f"expected one of {', '.join(SEARCHERS)}; got {as_written(name)}"
                         f"{did_you_mean(name, list(SEARCHERS))}")

    @field_validator("max_length", mode="before")
    @classmethod
    def _read_max_length(cls, raw: Any) -> Length:
        if isinstance(raw, int) and not isinstance(raw, bool):
            raise ValueError(bare_length_refusal(raw))
        return Length.parse(raw, minimum=1)

    @field_validator("source_trial_id")
    @classmethod
    def _refuse_source_trial_id(cls, raw: Optional[int]) -> Optional[int]:
        if raw is not None:
            raise ValueError(
                "hookdet has no cluster-wide trial ids to warm-start from; name the checkpoint "
                "instead: searcher.source_checkpoint_uuid: <its id, a checkpoint directory or a "
                "run directory> (hookdet show RUN_DIR lists a run's checkpoint ids)"
            )
        return raw


class OptimizationsConfig(Section):
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


class ResourcesConfig(Section):
    """``resources``: only ``slots_per_trial`` (processes to train with; more than 1 means
    distributed training) matters off a cluster."""

    slots_per_trial: int = Field(1, ge=0)


class ReproducibilityConfig(Section):
    """``reproducibility.experiment_seed``, 0 to 2**31-1.

    Determined's master draws a missing seed from the clock when it creates the experiment,
    once, in one process. hookdet reads the file in every rank of a distributed run and again
    on resume, where a clock-drawn seed would differ between readers; so a missing seed is 0,
    every run is repeatable by default, and a different seed is one line in the file.
    """

    experiment_seed: int = Field(0, ge=0, le=MAX_EXPERIMENT_SEED)


#: Determined's checkpoint garbage-collection counts, the keys every storage type shares.
RETENTION_KEYS = frozenset({"save_experiment_best", "save_trial_best", "save_trial_latest"})


class _StorageConfig(Section):
    """Determined's checkpoint garbage-collection counts, common to every storage type."""

    save_experiment_best: int = Field(0, ge=0)
    save_trial_best: int = Field(1, ge=0)
    save_trial_latest: int = Field(1, ge=0)

    def fields(self) -> Dict[str, Any]:
        """The block's own fields, without ``type`` and the retention counts: what a storage
        class is built from."""
        values = {**self.model_dump(), **(self.model_extra or {})}
        return {key: value for key, value in values.items() if key != "type" and key not in RETENTION_KEYS}


class SharedFSStorageConfig(_StorageConfig):
    """``type: shared_fs``: checkpoints under ``host_path`` (joined with ``storage_path``).
    ``container_path`` and ``propagation`` describe a cluster container's mount; kept so the
    file round-trips, unused locally."""

    type: Literal["shared_fs"] = "shared_fs"
    host_path: str
    storage_path: Optional[str] = None
    container_path: Optional[str] = None
    propagation: str = "rprivate"

    @model_validator(mode="after")
    def _storage_path_inside_host_path(self) -> "SharedFSStorageConfig":
        """Determined's rule: ``host_path`` is absolute; ``storage_path``, relative to it or
        absolute, lies inside it."""
        if not os.path.isabs(self.host_path):
            raise FieldProblem(
                ("host_path",), f"must be an absolute path; got {as_written(self.host_path)}"
            )
        host = Path(os.path.normpath(self.host_path))
        if host not in self.root().parents and self.root() != host:
            raise FieldProblem(
                ("storage_path",),
                f"must be a subdirectory of host_path {as_written(self.host_path)}; "
                f"got {as_written(self.storage_path)}",
            )
        return self

    def root(self) -> Path:
        """Where the checkpoints go: ``host_path`` joined with ``storage_path``."""
        host = Path(os.path.normpath(self.host_path))
        return host if self.storage_path is None else Path(os.path.normpath(host / self.storage_path))


class DefaultStorageConfig(_StorageConfig):
    """A ``checkpoint_storage`` block with only retention counts (no ``type``): the run's own
    ``checkpoints`` directory, as a Determined file that relies on the cluster's default
    storage gets there."""

    type: Literal["default"] = "default"


class DirectoryStorageConfig(_StorageConfig):
    """``type: directory``: checkpoints in ``container_path``, a local directory."""

    type: Literal["directory"] = "directory"
    container_path: str


def _url_problem(field: str, url: Optional[str]) -> None:
    """Refuse ``url`` unless it is an ``http(s)://host...`` URL (the storage libraries would fail
    on it later, with a traceback)."""
    if url is None:
        return
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (parsing the port is what refuses 'http://host:x')
    except ValueError as error:
        raise FieldProblem((field,), f"{field} is not a URL ({error}); got {as_written(url)}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FieldProblem((field,), f"{field} must be an http:// or https:// URL with a host; got {as_written(url)}")


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
            raise FieldProblem(
                (missing,),
                f"{given} is set but {missing} is not; give both, or neither to use boto3's "
                "usual credentials (environment, ~/.aws)",
            )
        if self.prefix is not None and ".." in self.prefix.split("/"):
            raise FieldProblem(
                ("prefix",), f"prefix must not contain '..'; got {as_written(self.prefix)}"
            )
        _url_problem("endpoint_url", self.endpoint_url)
        return self


class GCSStorageConfig(_StorageConfig):
    """``type: gcs``: a Google Cloud Storage ``bucket`` (objects under ``prefix``)."""

    type: Literal["gcs"] = "gcs"
    bucket: str
    prefix: Optional[str] = None

    @model_validator(mode="after")
    def _prefix_stays_inside(self) -> "GCSStorageConfig":
        if self.prefix is not None and ".." in self.prefix.split("/"):
            raise FieldProblem(("prefix",), f"prefix must not contain '..'; got {as_written(self.prefix)}")
        return self


class AzureStorageConfig(_StorageConfig):
    """``type: azure``: an Azure Blob Storage ``container``, reached with ``connection_string``
    or ``account_url`` (and ``credential``), as Determined requires one of the two."""

    type: Literal["azure"] = "azure"
    container: str
    connection_string: Optional[str] = None
    account_url: Optional[str] = None
    credential: Optional[str] = None

    @model_validator(mode="after")
    def _reachable(self) -> "AzureStorageConfig":
        if not (self.connection_string or self.account_url):
            raise FieldProblem(
                ("connection_string",),
                "give connection_string or account_url (at least one, as Determined requires)",
            )
        _url_problem("account_url", self.account_url)
        return self


class InstalledStorageConfig(_StorageConfig):
    """``type: <name>`` of a storage type another package installed (an entry point in
    ``hookdet.checkpoint_storage``): its fields are its own, passed to its class as given."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: str

    @model_validator(mode="after")
    def _type_is_installed(self) -> "InstalledStorageConfig":
        # up: checkpoint_storage.type may name the storage types installed, found by the registry
        from hookdet.checkpoints.registry import installed_types

        installed = installed_types()
        if self.type not in installed:
            raise FieldProblem(
                ("type",),
                f"{as_written(self.type)} is not a storage type hookdet has; use one of "
                f"{', '.join(installed)}{did_you_mean(self.type, installed)}",
            )
        return self


#: The ``type`` values with a schema of hookdet's (``default`` is what a block without one
#: becomes); any other installed type is an :class:`InstalledStorageConfig`.
STORAGE_TYPES = ("shared_fs", "directory", "s3", "gcs", "azure")
#: The union's tags (pydantic names a member's errors by its tag, which the messages drop).
STORAGE_TAGS = (*STORAGE_TYPES, "default", "installed")


def _storage_tag(block: Any) -> str:
    tag = block.get("type") if isinstance(block, Mapping) else getattr(block, "type", None)
    return tag if tag in STORAGE_TAGS[:-1] else "installed"


CheckpointStorageConfig = Annotated[
    Union[
        Annotated[SharedFSStorageConfig, Tag("shared_fs")],
        Annotated[DirectoryStorageConfig, Tag("directory")],
        Annotated[S3StorageConfig, Tag("s3")],
        Annotated[GCSStorageConfig, Tag("gcs")],
        Annotated[AzureStorageConfig, Tag("azure")],
        Annotated[DefaultStorageConfig, Tag("default")],
        Annotated[InstalledStorageConfig, Tag("installed")],
    ],
    Discriminator(_storage_tag),
]
"""``checkpoint_storage``, chosen by ``type``: one of hookdet's own (none: retention counts for
the default storage), or a type another package installed."""
