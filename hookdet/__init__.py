"""hookdet: Determined's ``PyTorchTrial`` API anywhere, on a small loop that emits pluggy hooks.

``import hookdet as det`` gives ``det.pytorch`` (the Determined-compatible face) and, for plugin
authors, everything a plugin needs: ``det.hookimpl`` (the marker for hook implementations),
``det.Run`` and ``det.TrainState`` (what hooks receive), ``det.PluginError`` (the error a plugin
raises to refuse a run) and the ``plugin_config`` readers ``check_known_options``,
``option_error`` and ``read_seconds_option``. The hooks themselves are in
:mod:`hookdet.hookspecs`; docs/writing-plugins.md walks through writing one.
"""
from hookdet.markers import HOOK_NAMESPACE, hookimpl, hookspec

__version__ = "0.1.0"

from hookdet import pytorch  # noqa: E402  (the public face needs the markers above)
from hookdet.plugin_manager import (  # noqa: E402
    PluginError,
    check_known_options,
    option_error,
    read_seconds_option,
)
from hookdet.run import Run, TrainState  # noqa: E402

__all__ = [
    "HOOK_NAMESPACE",
    "PluginError",
    "Run",
    "TrainState",
    "__version__",
    "check_known_options",
    "hookimpl",
    "hookspec",
    "option_error",
    "pytorch",
    "read_seconds_option",
]
