"""The face for plugin authors, as :mod:`hookdet.pytorch` is for trials: ``import hookdet.plugin``.

Everything a plugin may use lives here; the rest of the package is hookdet's own and may change.
The hooks themselves are specified in :mod:`hookdet.plugins.hookspecs` (and described in docs/hooks.md);
docs/writing-plugins.md walks through writing a plugin.

* ``hookimpl`` marks hook implementations (``hookspec`` and ``HOOK_NAMESPACE`` are for plugins
  that add hooks of their own).
* ``Run`` is what hooks receive (every lifecycle hook and every ``hookdet_*`` hook that concerns
  the run gets it as ``run``), ``TrainState`` its counters, ``run_of(context)`` the run behind a
  trial context. ``run.stash`` keeps a plugin's per-run state under a ``StashKey`` of its own;
  the host shares ``TRIAL_CALLBACKS``, ``WORKLOAD_METRICS`` and ``TENSORBOARD_METRICS`` there.
* ``PluginError`` refuses a run with one line naming your plugin. A plugin class declares its
  options as ``Options``, a pydantic model or dataclass (:mod:`hookdet.plugins.options`): the
  experiment file's ``plugin_config.<name>`` is then checked with the file, with file and line,
  and ``__init__`` gets an ``Options`` instance; ``options_for(cls, options, name)`` turns a dict
  given by hand (a test's) into one, and ``option_fields`` lists them. Plugins that check a dict
  themselves have ``check_known_options``, ``option_error`` and ``read_seconds_option``.
* ``CheckpointStorage`` is what a storage type implements, with its errors
  (``StorageError`` and the kinds below it), ``check_storage_id`` and ``METADATA_FILE``;
  ``DistributedContext`` is what ``hookdet_make_distributed`` answers with;
  ``PyTorchTrialContext`` what the trial-API hooks receive.
* ``patch_forward`` and ``autocast_forward`` run a model's forward inside something (autocast)
  on that instance only: what a mixed-precision provider needs.
"""
from hookdet.checkpoints.storage import (
    METADATA_FILE,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CheckpointStorage,
    IncompleteCheckpointError,
    MalformedMetadataError,
    StorageError,
    check_storage_id,
)
from hookdet.trial_api.context import PyTorchTrialContext, run_of
from hookdet.distributed.context import DistributedContext
from hookdet.markers import HOOK_NAMESPACE, hookimpl, hookspec
from hookdet.trial_api.mixed_precision import autocast_forward, patch_forward
from hookdet.plugins.manager import PluginError, check_known_options, option_error, read_seconds_option
from hookdet.plugins.options import option_fields, options_for
from hookdet.loop.run import TENSORBOARD_METRICS, TRIAL_CALLBACKS, WORKLOAD_METRICS, Run, TrainState
from hookdet.loop.stash import Stash, StashKey

__all__ = [
    "HOOK_NAMESPACE",
    "METADATA_FILE",
    "TENSORBOARD_METRICS",
    "TRIAL_CALLBACKS",
    "WORKLOAD_METRICS",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "CheckpointStorage",
    "DistributedContext",
    "IncompleteCheckpointError",
    "MalformedMetadataError",
    "PluginError",
    "PyTorchTrialContext",
    "Run",
    "Stash",
    "StashKey",
    "StorageError",
    "TrainState",
    "autocast_forward",
    "check_known_options",
    "check_storage_id",
    "hookimpl",
    "hookspec",
    "option_error",
    "option_fields",
    "options_for",
    "patch_forward",
    "read_seconds_option",
    "run_of",
]
