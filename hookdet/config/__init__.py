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

The package's rooms: :mod:`~hookdet.config.problems` (errors and their wording),
:mod:`~hookdet.config.sections` (typed sections and lengths), :mod:`~hookdet.config.blocks`
(hyperparameters, data, plugin_config, entrypoint, plugins), :mod:`~hookdet.config.experiment`
(the whole file), :mod:`~hookdet.config.screening` (cluster-only and unknown fields) and
:mod:`~hookdet.config.reading` (YAML, overrides, the entry points below).
"""
from hookdet.config.blocks import names_trial_class
from hookdet.config.experiment import (
    SEGMENT_END_ENV,
    TRIAL_ID_ENV,
    TRIAL_SEED_ENV,
    ExperimentConfig,
    current_trial_id,
)
from hookdet.config.problems import ConfigError
from hookdet.config.reading import (
    load_experiment_config,
    parse_experiment_config,
    read_experiment_file,
    read_experiment_text,
    read_yaml_value,
    with_overrides,
)
from hookdet.config.screening import CLUSTER_ONLY_FIELDS
from hookdet.config.sections import (
    CheckpointStorageConfig,
    DirectoryStorageConfig,
    Length,
    OptimizationsConfig,
    ReproducibilityConfig,
    ResourcesConfig,
    S3StorageConfig,
    SearcherConfig,
    SharedFSStorageConfig,
    length_in_batches,
)

__all__ = [
    "CLUSTER_ONLY_FIELDS",
    "SEGMENT_END_ENV",
    "TRIAL_ID_ENV",
    "TRIAL_SEED_ENV",
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
    "current_trial_id",
    "load_experiment_config",
    "names_trial_class",
    "parse_experiment_config",
    "read_experiment_file",
    "read_experiment_text",
    "read_yaml_value",
    "with_overrides",
]
