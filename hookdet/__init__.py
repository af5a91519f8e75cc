"""hookdet: Determined's ``PyTorchTrial`` API anywhere, on a small loop that emits pluggy hooks.

``import hookdet as det`` gives ``det.pytorch`` (the Determined-compatible face), the names a
Trainer-API script touches on ``determined`` (``det.LOG_FORMAT``, ``det.get_cluster_info()``,
``det.core.DistributedContext``, ``det.InvalidHP``) and ``det.hookimpl``, the marker plugin
authors decorate hook implementations with. Plugin authors import :mod:`hookdet.plugin`, their
face; ``det.Run``, ``det.TrainState``, ``det.PluginError`` and the ``plugin_config`` readers
``check_known_options``, ``option_error`` and ``read_seconds_option`` stay here too.
The hooks themselves are in :mod:`hookdet.plugins.hookspecs`; docs/writing-plugins.md walks through
writing one, and docs/package-map.md maps the package layer by layer.
"""
from hookdet.markers import HOOK_NAMESPACE, hookimpl, hookspec

__version__ = "0.1.0"

#: Determined's log line format, for ``logging.basicConfig(format=det.LOG_FORMAT)``.
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

#: Where each public name lives. Nothing heavy (torch, pydantic) is imported until a name is
#: used, so ``hookdet --help`` and plugin modules start fast; ``det.pytorch`` imports torch.
_LAZY_NAMES = {
    "core": "hookdet.core",
    "pytorch": "hookdet.pytorch",
    "ClusterInfo": "hookdet.trial_api.cluster_info",
    "TrialInfo": "hookdet.trial_api.cluster_info",
    "get_cluster_info": "hookdet.trial_api.cluster_info",
    "InvalidHP": "hookdet.errors",
    "PluginError": "hookdet.plugins.manager",
    "check_known_options": "hookdet.plugins.manager",
    "option_error": "hookdet.plugins.manager",
    "read_seconds_option": "hookdet.plugins.manager",
    "Run": "hookdet.loop.run",
    "TrainState": "hookdet.loop.run",
}


def __getattr__(name: str):
    """Import a public name on first use (PEP 562) and keep it."""
    import importlib

    home = _LAZY_NAMES.get(name)
    if home is None:
        raise AttributeError(f"module 'hookdet' has no attribute {name!r}")
    module = importlib.import_module(home)
    value = module if home == f"hookdet.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_NAMES))


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
