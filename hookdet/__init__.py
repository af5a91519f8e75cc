"""hookdet: Determined's ``PyTorchTrial`` API anywhere, on a small loop that emits pluggy hooks.

``import hookdet as det`` gives what ``import determined as det`` gives a trial, a Trainer-API
or a Core API script, and nothing else: ``det.pytorch`` (the Determined-compatible face),
``det.core`` (``det.core.init()`` and its contexts), ``det.transformers`` (``DetCallback``, with
the ``transformers`` extra), ``det.get_cluster_info()`` with ``det.ClusterInfo`` and
``det.TrialInfo``, ``det.InvalidHP`` and ``det.LOG_FORMAT``; ``tests/parity`` checks each is a
name of Determined's own package. Plugin authors import :mod:`hookdet.plugin`, their face
(``hookimpl``, ``Run``, ``PluginError`` and the ``plugin_config`` readers live there); the hooks
themselves are in :mod:`hookdet.plugins.hookspecs`. docs/writing-plugins.md walks through writing
one, and docs/package-map.md maps the package layer by layer.
"""
__version__ = "0.1.0"

#: Determined's log line format, for ``logging.basicConfig(format=det.LOG_FORMAT)``.
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

#: Where each public name lives. Nothing heavy (torch, pydantic) is imported until a name is
#: used, so ``hookdet --help`` and plugin modules start fast; ``det.pytorch`` imports torch.
_LAZY_NAMES = {
    "core": "hookdet.core",
    "transformers": "hookdet.transformers",
    "pytorch": "hookdet.pytorch",
    "ClusterInfo": "hookdet.trial_api.cluster_info",
    "TrialInfo": "hookdet.trial_api.cluster_info",
    "get_cluster_info": "hookdet.trial_api.cluster_info",
    "InvalidHP": "hookdet.errors",
}
#: Names this package had before they moved to :mod:`hookdet.plugin`, the plugin author's face:
#: asked for here, they are refused naming where they are now.
_MOVED_TO_THE_PLUGIN_FACE = ("HOOK_NAMESPACE", "hookimpl", "hookspec", "PluginError", "Run", "TrainState",
                             "check_known_options", "option_error", "read_seconds_option")


def __getattr__(name: str):
    """Import a public name on first use (PEP 562) and keep it."""
    import importlib

    home = _LAZY_NAMES.get(name)
    if name in _MOVED_TO_THE_PLUGIN_FACE:
        raise AttributeError(f"module 'hookdet' has no attribute {name!r}: plugin authors' names are in "
                             f"hookdet.plugin (from hookdet.plugin import {name})")
    if home is None:
        raise AttributeError(f"module 'hookdet' has no attribute {name!r}")
    module = importlib.import_module(home)
    value = module if home == f"hookdet.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_NAMES))


__all__ = [
    "LOG_FORMAT",
    "ClusterInfo",
    "InvalidHP",
    "TrialInfo",
    "__version__",
    "core",
    "get_cluster_info",
    "pytorch",
    "transformers",
]
