"""Adapts the trial's ``PyTorchCallback``s into hook implementations, one method to one hook.

A built-in plugin, not part of the host: ``no:callbacks`` runs a trial without its callbacks
(a warning names them). A callback is the user's code all the same: what it
raises goes out unchanged, reported as an error in ``train_batch`` is (the user's frames, one
closing line, exit 1), never as this plugin's failure; Determined lets it through the same way.

Only the lifecycle methods that at least one callback overrides become hook implementations, so
a callback that does not override ``on_before_optimizer_step`` costs the optimizer step nothing.
Callbacks run in the order ``build_callbacks`` returned them, as in Determined.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Dict

from hookdet.plugin import PyTorchCallback, hookimpl

LIFECYCLE_METHODS = (
    "on_trial_startup",
    "on_training_start",
    "on_training_epoch_start",
    "on_training_epoch_end",
    "on_training_workload_end",
    "on_validation_start",
    "on_validation_epoch_start",
    "on_validation_epoch_end",
    "on_validation_end",
    "on_checkpoint_load_start",
    "on_checkpoint_save_start",
    "on_checkpoint_write_end",
    "on_checkpoint_upload_end",
    "on_checkpoint_end",
    "on_before_optimizer_step",
    "on_trial_shutdown",
)

ADAPTER_NAME = "callbacks:adapter"

#: The methods Determined calls with keyword arguments; it passes the others' positionally, so a
#: callback may name their parameters as it likes (or take ``*args``), and so may it here.
KEYWORD_CALLS = ("on_training_workload_end", "on_checkpoint_upload_end")


class CallbacksPlugin:
    """Holds the trial's callbacks by name; their state is checkpointed under those names."""

    def __init__(self) -> None:
        self.callbacks: Dict[str, PyTorchCallback] = {}

    @hookimpl
    def hookdet_add_callbacks(self, run: Any, callbacks: Dict[str, PyTorchCallback]) -> bool:
        """Register ``callbacks`` (from ``build_callbacks``) as hook implementations."""
        for name, callback in callbacks.items():
            if not isinstance(callback, PyTorchCallback):
                raise TypeError(
                    f"build_callbacks: callback {name!r} is a {type(callback).__name__}, "
                    "not a PyTorchCallback"
                )
        self.callbacks.update(callbacks)
        run.plugins.unregister(ADAPTER_NAME)
        run.plugins.register(ADAPTER_NAME, _build_adapter(self.callbacks))
        return True


def _overrides(callback: PyTorchCallback, method: str) -> bool:
    return getattr(type(callback), method) is not getattr(PyTorchCallback, method)


def _build_adapter(callbacks: Dict[str, PyTorchCallback]) -> Any:
    """An object with one hook implementation per lifecycle method some callback overrides."""
    attributes: Dict[str, Any] = {"callbacks": callbacks}
    for method in LIFECYCLE_METHODS:
        if any(_overrides(callback, method) for callback in callbacks.values()):
            attributes[_HOOK_FOR.get(method, method)] = hookimpl(_FORWARDERS[_HOOK_FOR.get(method, method)])
    return type("CallbackHooks", (), attributes)()


def _call_callbacks(adapter: Any, method: str, only: Any = None, **kwargs: Any) -> None:
    """Call ``method`` on every callback overriding it (or on callback ``only``), in
    ``build_callbacks`` order."""
    for name, callback in adapter.callbacks.items():
        if not _overrides(callback, method) or (only is not None and name != only):
            continue
        if method == "on_training_epoch_start" and not inspect.signature(callback.on_training_epoch_start).parameters:
            warnings.warn(
                f"callback {name!r}: on_training_epoch_start() without epoch_idx is "
                "deprecated; accept an epoch_idx argument",
                DeprecationWarning,
                stacklevel=2,
            )
            callback.on_training_epoch_start()
        elif method in KEYWORD_CALLS:
            getattr(callback, method)(**kwargs)
        else:
            getattr(callback, method)(*kwargs.values())


# pluggy passes a hook's arguments by the names in each implementation's code object, so each
# lifecycle method gets a forwarder with exactly the hook's parameter names.
def _on_trial_startup(self: Any, first_batch_idx: int, checkpoint_uuid: Any) -> None:
    _call_callbacks(self, "on_trial_startup", first_batch_idx=first_batch_idx, checkpoint_uuid=checkpoint_uuid)


def _on_training_start(self: Any) -> None:
    _call_callbacks(self, "on_training_start")


def _on_training_epoch_start(self: Any, epoch_idx: int) -> None:
    _call_callbacks(self, "on_training_epoch_start", epoch_idx=epoch_idx)


def _on_training_epoch_end(self: Any, epoch_idx: int) -> None:
    _call_callbacks(self, "on_training_epoch_end", epoch_idx=epoch_idx)


def _on_training_workload_end(self: Any, avg_metrics: Any, batch_metrics: Any) -> None:
    _call_callbacks(self, "on_training_workload_end", avg_metrics=avg_metrics, batch_metrics=batch_metrics)


def _on_validation_start(self: Any) -> None:
    _call_callbacks(self, "on_validation_start")


def _on_validation_epoch_start(self: Any) -> None:
    _call_callbacks(self, "on_validation_epoch_start")


def _on_validation_epoch_end(self: Any, outputs: Any) -> None:
    _call_callbacks(self, "on_validation_epoch_end", outputs=outputs)


def _on_validation_end(self: Any, metrics: Any) -> None:
    _call_callbacks(self, "on_validation_end", metrics=metrics)


def _on_checkpoint_load_start(self: Any, checkpoint: Any) -> None:
    _call_callbacks(self, "on_checkpoint_load_start", checkpoint=checkpoint)


def _on_checkpoint_save_start(self: Any, checkpoint: Any) -> None:
    _call_callbacks(self, "on_checkpoint_save_start", checkpoint=checkpoint)


def _on_checkpoint_write_end(self: Any, checkpoint_dir: str) -> None:
    # As Determined: once the files are written, each callback in turn gets the deprecated
    # on_checkpoint_end and then on_checkpoint_write_end, both before on_checkpoint_upload_end.
    for name, callback in self.callbacks.items():
        _call_callbacks(self, "on_checkpoint_end", only=name, checkpoint_dir=checkpoint_dir)
        _call_callbacks(self, "on_checkpoint_write_end", only=name, checkpoint_dir=checkpoint_dir)


def _on_checkpoint_upload_end(self: Any, uuid: str) -> None:
    _call_callbacks(self, "on_checkpoint_upload_end", uuid=uuid)


def _on_before_optimizer_step(self: Any, parameters: Any) -> None:
    _call_callbacks(self, "on_before_optimizer_step", parameters=parameters)


def _on_trial_shutdown(self: Any) -> None:
    # Determined unwinds on_trial_shutdown as a stack: the last callback started shuts down first.
    for name in reversed(list(self.callbacks)):
        _call_callbacks(self, "on_trial_shutdown", only=name)


#: Callback methods called from another hook than their namesake.
_HOOK_FOR = {"on_checkpoint_end": "on_checkpoint_write_end"}

_FORWARDERS: Dict[str, Callable] = {
    method: globals()["_" + method] for method in LIFECYCLE_METHODS if method not in _HOOK_FOR
}
