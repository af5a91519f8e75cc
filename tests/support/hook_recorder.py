"""A plugin that implements every hook in the catalogue and records each call in order."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable, List, Optional, Tuple

from hookdet.plugins import hookspecs
from hookdet.markers import hookimpl

SPEC_NAMES = tuple(
    name
    for name, function in vars(hookspecs).items()
    if inspect.isfunction(function) and hasattr(function, "hookdet_spec")
)

#: Arguments worth recording (the rest are objects whose identity says nothing).
RECORDED_ARGUMENTS = ("first_batch_idx", "epoch_idx", "group", "steps_completed")


class HookRecorder:
    """Records ``(hook name, recorded arguments)`` for every call of the hooks in ``names``.

    Pluggy reads each implementation's argument names through ``__wrapped__``, so every
    recording function takes exactly its spec's arguments.
    """

    def __init__(self, names: Optional[Iterable[str]] = None) -> None:
        self.calls: List[Tuple[str, Tuple[Any, ...]]] = []
        for name in names if names is not None else SPEC_NAMES:
            setattr(self, name, hookimpl(self._recorder(name)))

    def _recorder(self, name: str) -> Callable:
        spec = getattr(hookspecs, name)
        parameters = list(inspect.signature(spec).parameters)

        @functools.wraps(spec)
        def record(*args: Any) -> None:
            arguments = dict(zip(parameters, args))
            self.calls.append((name, tuple(arguments[p] for p in RECORDED_ARGUMENTS if p in arguments)))

        return record

    def names(self) -> List[str]:
        """The hook names called, in order."""
        return [name for name, _ in self.calls]

    def compact(self) -> List[str]:
        """Each call as ``name`` or ``name(arg, ...)``, for literal comparison."""
        return [f"{name}({', '.join(map(str, args))})" if args else name for name, args in self.calls]
