"""hookdet's error base, and the exceptions a Determined script raises on purpose under the names
``determined`` gives them."""
from __future__ import annotations

from hookdet.exit_codes import INVALID_HP_EXIT_CODE

__all__ = ["ArgumentTypeError", "HookdetError", "INVALID_HP_EXIT_CODE", "InvalidHP", "PluginError", "TrialError", "UsageError"]


class HookdetError(Exception):
    """A problem hookdet reports as one line naming the culprit, without a traceback: bad input
    (a config field, a plugin, a checkpoint, a run directory) or a fault outside user code. Every
    such error derives from it, and the command line catches this one class."""


class UsageError(HookdetError):
    """A command-line or entrypoint problem; printed as one line."""


class TrialError(HookdetError):
    """A trial broke the ``PyTorchTrial`` contract; the message names the method."""


class PluginError(HookdetError):
    """A plugin failed, could not be found, or cannot run beside another; names the plugin.
    (Here, with hookdet's other errors, so that what raises it — the checkpoint format, the
    mixed-precision helpers — need not import the plugin manager.)"""


class ArgumentTypeError(TypeError, AssertionError):
    """A public method got an argument of the wrong type. A ``TypeError``, and an
    ``AssertionError`` too: Determined asserts on the same calls (``set_stop_requested``,
    ``set_enable_tensorboard_logging``, ``wrap_reducer``), so code catching either still does."""


class InvalidHP(Exception):
    """Raised by a trial (or script) whose hyperparameters cannot train, e.g. a model too large
    for them. Determined's searchers treat the trial as invalid and carry on with the search
    instead of failing the experiment; ``det.InvalidHP`` under ``import hookdet as det``.

    ``hookdet run`` exits with :data:`INVALID_HP_EXIT_CODE`; a random or ASHA search discards the
    trial and samples a replacement, a grid search does not (its point is simply skipped), as
    Determined does.
    """

    def __init__(self, msg: str = "...") -> None:
        if not isinstance(msg, str):
            raise TypeError(
                "InvalidHP exceptions can be initialized with a custom message, but it must be a "
                f"string, not {type(msg).__name__}"
            )
        super().__init__(msg)
        self.msg = msg

