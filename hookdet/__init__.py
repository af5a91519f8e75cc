"""hookdet: Determined's ``PyTorchTrial`` API anywhere, on a small loop that emits pluggy hooks.

``import hookdet as det`` gives ``det.pytorch`` (the Determined-compatible face) and
``det.hookimpl``, the marker plugin authors decorate hook implementations with.
"""
from hookdet.markers import HOOK_NAMESPACE, hookimpl, hookspec

__version__ = "0.1.0"

from hookdet import pytorch  # noqa: E402  (the public face needs the markers above)
from hookdet.errors import InvalidHP  # noqa: E402

__all__ = ["HOOK_NAMESPACE", "InvalidHP", "__version__", "hookimpl", "hookspec", "pytorch"]
