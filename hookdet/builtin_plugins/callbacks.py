"""Adapts the trial's ``PyTorchCallback``s into hook implementations, one method to one hook.

Only the lifecycle methods that at least one callback overrides become hook implementations, so
a callback that does not override ``on_before_optimizer_step`` costs the optimizer step nothing.
Callbacks run in the order ``build_callbacks`` returned them, as in Determined.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Dict, List

from hookdet.markers import hookimpl
from hookdet.trial import PyTorchCallback

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


class CallbackError(Exception):
    """A callback raised; the message names the callback and the method."""


class CallbacksPlugin:
    """Holds the trial's callbacks by name; their state is checkpointed under those names."""

    def __init__(self) -> None:
        self.callbacks: Dict[str, PyTorchCallback] = {}
        self._run: Any = None

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Remember the run, to register the adapter when callbacks arrive."""
        self._run = run

    def add_callbacks(self, callbacks: Dict[str, PyTorchCallback]) -> None:
        """Register ``callbacks`` (from ``build_callbacks``) as hook implementations."""
        for name, callback in callbacks.items():
            if not isinstance(callback, PyTorchCallback):
                raise TypeError(
                    f"build_callbacks: callback {name!r} is a {type(callback).__name__}, "
                    "not a PyTorchCallback"
                )
        self.callbacks.update(callbacks)
        plugins = self._run.plugins
        if plugins.get(ADAPTER_NAME) is not None:
            plugins.pluggy_manager.unregister(name=ADAPTER_NAME)
        plugins.register(ADAPTER_NAME, _build_adapter(self.callbacks))


def _overrides(callback: PyTorchCallback, method: str) -> bool:
    return getattr(type(callback), method) is not getattr(PyTorchCallback, method)


def _build_adapter(callbacks: Dict[str, PyTorchCallback]) -> Any:
    """An object with one hook implementation per lifecycle method some callback overrides."""
    attributes: Dict[str, Callable] = {}
    for method in LIFECYCLE_METHODS:
        targets = [(name, cb) for name, cb in callbacks.items() if _overrides(cb, method)]
        if targets:
            attributes[method] = hookimpl(_dispatcher(method, targets))
    return type("CallbackHooks", (), attributes)()


def _dispatcher(method: str, targets: List[Any]) -> Callable:
    signature = inspect.signature(getattr(PyTorchCallback, method))
    parameters = [p for p in signature.parameters if p != "self"]
    legacy = {
        name
        for name, cb in targets
        if method == "on_training_epoch_start"
        and not inspect.signature(getattr(cb, method)).parameters
    }

    def call_each(self: Any, **kwargs: Any) -> None:
        for name, callback in targets:
            try:
                if name in legacy:
                    warnings.warn(
                        f"callback {name!r}: on_training_epoch_start() without epoch_idx is "
                        "deprecated; accept an epoch_idx argument",
                        DeprecationWarning,
                        stacklevel=2,
                    )
                    getattr(callback, method)()
                else:
                    getattr(callback, method)(**kwargs)
            except Exception as error:
                raise CallbackError(f"callback {name!r} failed in {method}: {error!r}") from error

    # pluggy reads hook arguments from the implementation's signature.
    call_each.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in parameters]
    )
    call_each.__name__ = method
    return call_each
