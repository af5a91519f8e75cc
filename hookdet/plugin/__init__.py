"""The face for plugin authors, as :mod:`hookdet.pytorch` is for trials: ``import hookdet.plugin``.

Everything a plugin may use lives here; the rest of the package is hookdet's own and may change.
The hooks themselves are specified in :mod:`hookdet.plugins.hookspecs` (and described in docs/hooks.md);
docs/writing-plugins.md walks through writing a plugin.

* ``hookimpl`` marks hook implementations (``hookspec`` and ``HOOK_NAMESPACE`` are for plugins
  that add hooks of their own).
* ``Run`` is what hooks receive (every lifecycle hook and every ``hookdet_*`` hook that concerns
  the run gets it as ``run``), ``TrainState`` its counters, ``run_of(context)`` the run behind a
  trial context. ``run.stash`` keeps a plugin's per-run state under a ``StashKey`` of its own;
  the host shares ``TRIAL_CALLBACKS``, ``WORKLOAD_METRICS``, ``TENSORBOARD_METRICS`` and
  ``REPORTED_PROGRESS`` (a Core API script's own progress and status) there.
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
* ``Precision`` is what ``hookdet_make_precision`` answers with: the run's one precision (how a
  forward runs, how backward and the optimizer step go, its state), float32 as it stands;
  ``PrecisionPlugin`` is a plugin that provides one (write its ``make(run)``);
  ``patch_forward`` and ``autocast_forward`` run a model's forward inside something (autocast)
  on that instance only: what a mixed-precision provider needs.

Hookdet's own plugins are written against this face too (a test holds them to it as it holds a
stranger's): what they need beyond the above is here, resolved on first use so that importing
the face stays light — the trial API's ``PyTorchTrial``, ``PyTorchCallback``, ``TrialError`` and
``get_cluster_info``; the run's end (``ExitReason``, ``PREEMPTED_EXIT_CODE``) and its RNG state
(``rng``); mixed precision's dtype helpers; the distributed contexts of torch and Horovod and
``rank_device`` (the device a rank trains on); the
progress view; lengths of the experiment file; Determined's ``TorchWriter``; and the run
directory's ``LOGS_DIR`` and a rank's log file (``RankLogFile``). A checkpoint plugin needs more: :mod:`hookdet.plugin.checkpoint`.
"""
from typing import Any

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
from hookdet.trial_api.precision import Precision, PrecisionPlugin
from hookdet.plugins.manager import PluginError, check_known_options, option_error, read_seconds_option
from hookdet.plugins.options import option_fields, options_for
from hookdet.loop.run import REPORTED_PROGRESS, TENSORBOARD_METRICS, TRIAL_CALLBACKS, WORKLOAD_METRICS, Run, TrainState
from hookdet.loop.stash import Stash, StashKey

__all__ = [
    "HOOK_NAMESPACE",
    "METADATA_FILE",
    "REPORTED_PROGRESS",
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
    "Precision",
    "PrecisionPlugin",
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

#: Names of the face resolved on first use: name -> (module, attribute). Importing them all at
#: once would load the progress view (rich), TensorBoard's writer and more into every plugin.
LAZY_NAMES = {
    "PyTorchTrial": ("hookdet.trial_api.trial", "PyTorchTrial"),
    "PyTorchCallback": ("hookdet.trial_api.trial", "PyTorchCallback"),
    "TrialError": ("hookdet.trial_api.trial", "TrialError"),
    "get_cluster_info": ("hookdet.trial_api.cluster_info", "get_cluster_info"),
    "rng": ("hookdet.trial_api.rng", None),
    "ExitReason": ("hookdet.exit_codes", "ExitReason"),
    "PREEMPTED_EXIT_CODE": ("hookdet.exit_codes", "PREEMPTED_EXIT_CODE"),
    "DTYPE_NAMES": ("hookdet.trial_api.mixed_precision", "DTYPE_NAMES"),
    "cast_tensors": ("hookdet.trial_api.mixed_precision", "cast_tensors"),
    "dtype_name": ("hookdet.trial_api.mixed_precision", "dtype_name"),
    "known_dtype_name": ("hookdet.trial_api.mixed_precision", "known_dtype_name"),
    "resolve_half_dtype": ("hookdet.trial_api.mixed_precision", "resolve_half_dtype"),
    "TorchDistributedContext": ("hookdet.distributed.context", "TorchDistributedContext"),
    "RankAloneContext": ("hookdet.distributed.context", "RankAloneContext"),
    "HorovodDistributedContext": ("hookdet.distributed.context", "HorovodDistributedContext"),
    "rank_device": ("hookdet.distributed.context", "rank_device"),
    "LiveView": ("hookdet.metrics.live_view", "LiveView"),
    "LAUNCHER_DRAWS_ENV": ("hookdet.metrics.live_view", "LAUNCHER_DRAWS_ENV"),
    "format_duration": ("hookdet.metrics.live_view", "format_duration"),
    "ordered_metrics": ("hookdet.metrics.live_view", "ordered_metrics"),
    "Length": ("hookdet.config", "Length"),
    "length_in_batches": ("hookdet.config", "length_in_batches"),
    "SEGMENT_END_ENV": ("hookdet.config", "SEGMENT_END_ENV"),
    "TorchWriter": ("hookdet.tensorboard.metric_writers.pytorch", "TorchWriter"),
    "LOGS_DIR": ("hookdet.runs.files", "LOGS_DIR"),
    "RankLogFile": ("hookdet.runs.logs", "RankLogFile"),
}
__all__ += sorted(LAZY_NAMES)


def __getattr__(name: str) -> Any:
    """A name of :data:`LAZY_NAMES`, imported now (PEP 562)."""
    if name not in LAZY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attribute = LAZY_NAMES[name]
    found = importlib.import_module(module)
    return found if attribute is None else getattr(found, attribute)
