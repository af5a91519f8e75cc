"""hookdet: Determined's ``PyTorchTrial`` API anywhere, on a small loop that emits pluggy hooks.

``import hookdet as det`` gives ``det.pytorch`` (the Determined-compatible face), the names a
Trainer-API script touches on ``determined`` (``det.LOG_FORMAT``, ``det.get_cluster_info()``,
``det.core.DistributedContext``, ``det.InvalidHP``) and ``det.hookimpl``, the marker plugin
authors decorate hook implementations with.
"""
from hookdet.markers import HOOK_NAMESPACE, hookimpl, hookspec

__version__ = "0.1.0"

#: Determined's log line format, for ``logging.basicConfig(format=det.LOG_FORMAT)``.
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

from hookdet import core, pytorch  # noqa: E402  (the public face needs the markers above)
from hookdet.cluster_info import ClusterInfo, TrialInfo, get_cluster_info  # noqa: E402
from hookdet.errors import InvalidHP  # noqa: E402

__all__ = [
    "HOOK_NAMESPACE",
    "LOG_FORMAT",
    "ClusterInfo",
    "InvalidHP",
    "TrialInfo",
    "__version__",
    "core",
    "get_cluster_info",
    "hookimpl",
    "hookspec",
    "pytorch",
]
