"""hookdet: Determined's ``PyTorchTrial`` API anywhere, on a small loop that emits pluggy hooks.

``import hookdet as det`` gives ``det.pytorch`` (the Determined-compatible face), the names a
Trainer-API script touches on ``determined`` (``det.LOG_FORMAT``, ``det.get_cluster_info()``,
``det.core.DistributedContext``, ``det.InvalidHP``) and ``det.hookimpl``, the marker plugin
authors decorate hook implementations with. For plugin
authors it also gives everything a plugin needs: ``det.Run`` and ``det.TrainState`` (what hooks
receive), ``det.PluginError`` (the error a plugin raises to refuse a run) and the
``plugin_config`` readers ``check_known_options``, ``option_error`` and ``read_seconds_option``.
The hooks themselves are in :mod:`hookdet.hookspecs`; docs/writing-plugins.md walks through
writing one.
"""
from hookdet.markers import HOOK_NAMESPACE, hookimpl, hookspec

__version__ = "0.1.0"

#: Determined's log line format, for ``logging.basicConfig(format=det.LOG_FORMAT)``.
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

from hookdet import core, pytorch  # noqa: E402  (the public face needs the markers above)
from hookdet.cluster_info import ClusterInfo, TrialInfo, get_cluster_info  # noqa: E402
from hookdet.errors import InvalidHP  # noqa: E402
from hookdet.plugin_manager import (  # noqa: E402
    PluginError,
    check_known_options,
    option_error,
    read_seconds_option,
)
from hookdet.run import Run, TrainState  # noqa: E402

__all__ = [
    "HOOK_NAMESPACE",
    "LOG_FORMAT",
    "ClusterInfo",
    "InvalidHP",
    "PluginError",
    "Run",
    "TrainState",
    "TrialInfo",
    "__version__",
    "check_known_options",
    "core",
    "get_cluster_info",
    "hookimpl",
    "hookspec",
    "option_error",
    "pytorch",
    "read_seconds_option",
]
