"""The plugin manager's one watch over hook calls: whose error it was, and, when asked, how long.

* **Always**: an exception raised in a hook implementation is re-raised as a
  :class:`~hookdet.plugins.manager.PluginError` naming the plugin and the hook, unless user code the
  implementation called raised it (a ``PyTorchCallback`` the callbacks plugin called: the error
  is the user's, reported as one in ``train_batch`` is) or the hook answers a call of the trial's
  own (:data:`hookdet.plugins.hookspecs.TRIAL_API_HOOKS`).
* **On demand**: listeners hear of every hook call and every implementation's time:
  ``HOOKDET_TRACE=1`` adds one that logs each call, the ``hook_timing`` plugin adds one that
  tabulates. While anyone listens, each registered implementation (and each one registered
  later) runs inside a timer; when the last listener leaves, the originals are put back. Nobody
  listening, nothing is wrapped or timed.

pluggy's hook-call monitoring sees a call as a whole; to see each implementation the monitor
swaps the ``function`` attribute of pluggy's ``HookImpl`` records (public, and the only way pluggy
offers) for a timed one, marked so it is never wrapped twice. This module is the only place in
hookdet that does either.
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import sysconfig
import time
from typing import Any, Callable, List, Optional, Protocol, Sequence, Tuple

import pluggy

import hookdet
from hookdet.errors import HookdetError
from hookdet.plugins import hookspecs

logger = logging.getLogger("hookdet")

#: Marks a timed implementation, so that it is never wrapped twice.
TIMED_MARK = "_hookdet_timed"


class HookListener(Protocol):
    """What a listener is told. ``outermost``: no other hook call is in progress."""

    def hook_started(self, hook_name: str, outermost: bool) -> None: ...

    def hook_finished(self, hook_name: str, plugin_names: Sequence[str], seconds: float, outermost: bool) -> None: ...

    def implementation_timed(self, hook_name: str, plugin_name: str, seconds: float, calls: int) -> None:
        """``plugin_name``'s implementation of ``hook_name`` ran ``seconds`` (``calls`` is 1 when
        this is a new call; a ``wrapper=True`` implementation reports its code before and after
        ``yield`` as further timings of the same call, with ``calls=0``)."""


class TraceLog:
    """``HOOKDET_TRACE=1``: one log line per hook call, with the plugins that answered."""

    def hook_started(self, hook_name: str, outermost: bool) -> None:
        pass

    def hook_finished(self, hook_name: str, plugin_names: Sequence[str], seconds: float, outermost: bool) -> None:
        logger.info("hook %s [%s] %.3f ms", hook_name, ",".join(plugin_names) or "-", seconds * 1e3)

    def implementation_timed(self, hook_name: str, plugin_name: str, seconds: float, calls: int) -> None:
        pass


class HookMonitor:
    """Watches every hook call of one pluggy manager (see the module docstring)."""

    def __init__(self, pm: pluggy.PluginManager, defaults_name: str, error_class: type) -> None:
        """``error_class`` is what a plugin's failure is re-raised as (and passed through as is);
        ``defaults_name`` the plugin whose errors are hookdet's own."""
        self._pm = pm
        self._defaults_name = defaults_name
        self._error_class = error_class
        self._listeners: List[HookListener] = []
        self._starts: List[Optional[float]] = []
        self._restore: List[Tuple[Any, Callable[..., Any]]] = []
        pm.add_hookcall_monitoring(self._before, self._after)

    # ------------------------------------------------------------------ listeners

    def listen(self, listener: HookListener) -> None:
        """Tell ``listener`` of every hook call from now on, timing each implementation."""
        self._listeners.append(listener)
        self.wrap_implementations()

    def stop_listening(self, listener: HookListener) -> None:
        """Stop telling ``listener``; the last one to leave takes the timers away."""
        self._listeners.remove(listener)
        if not self._listeners:
            for implementation, function in reversed(self._restore):
                implementation.function = function
            self._restore.clear()

    def wrap_implementations(self) -> None:
        """Time every implementation not yet timed (the manager calls this after registering a
        plugin); nothing while nobody listens."""
        if not self._listeners:
            return
        for caller in vars(self._pm.hook).values():
            if not isinstance(caller, pluggy.HookCaller):
                continue
            for implementation in caller.get_hookimpls():
                if getattr(implementation.function, TIMED_MARK, False):
                    continue
                original = implementation.function
                implementation.function = self._timed(caller.name, implementation, original)
                self._restore.append((implementation, original))

    def _timed(self, hook_name: str, implementation: Any, function: Callable[..., Any]) -> Callable[..., Any]:
        plugin_name = implementation.plugin_name
        report = functools.partial(self._tell_implementation, hook_name, plugin_name)
        if implementation.wrapper or implementation.hookwrapper:

            @functools.wraps(function)
            def timed_wrapper(*args: Any, **kwargs: Any) -> Any:
                report(0.0, 1)
                return _TimedTeardown(function(*args, **kwargs), report)

            setattr(timed_wrapper, TIMED_MARK, True)
            return timed_wrapper

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                report(time.perf_counter() - start, 1)

        setattr(timed, TIMED_MARK, True)
        return timed

    def _tell_implementation(self, hook_name: str, plugin_name: str, seconds: float, calls: int) -> None:
        for listener in self._listeners:
            listener.implementation_timed(hook_name, plugin_name, seconds, calls)

    # ------------------------------------------------------------------ pluggy's monitoring

    def _before(self, hook_name: str, hook_impls: Sequence[Any], kwargs: Any) -> None:
        if not self._listeners:
            self._starts.append(None)
            return
        outermost = not any(start is not None for start in self._starts)
        self._starts.append(time.perf_counter())
        for listener in self._listeners:
            listener.hook_started(hook_name, outermost)

    def _after(self, outcome: Any, hook_name: str, hook_impls: Sequence[Any], kwargs: Any) -> None:
        start = self._starts.pop() if self._starts else None
        if start is not None and self._listeners:
            seconds = time.perf_counter() - start
            outermost = not any(earlier is not None for earlier in self._starts)
            plugin_names = [implementation.plugin_name for implementation in hook_impls]
            for listener in list(self._listeners):
                listener.hook_finished(hook_name, plugin_names, seconds, outermost)
        self._blame(outcome, hook_name, hook_impls)

    def _blame(self, outcome: Any, hook_name: str, hook_impls: Sequence[Any]) -> None:
        error = outcome.exception
        # A HookdetError is a plugin's deliberate one-line message: it reaches the user as it is.
        if error is None or isinstance(error, (self._error_class, HookdetError, KeyboardInterrupt, SystemExit)):
            return
        if hook_name in hookspecs.TRIAL_API_HOOKS:
            return
        culprit, user_code_raised = implementation_that_raised(error, hook_impls)
        if culprit is not None and culprit.plugin_name != self._defaults_name and not user_code_raised:
            wrapped = self._error_class(f"plugin {culprit.plugin_name!r} failed in hook {hook_name}: {error!r}")
            wrapped.__cause__ = error
            outcome.force_exception(wrapped)


class _TimedTeardown:
    """A ``wrapper=True`` implementation's generator whose every resumption is timed.

    pluggy drives it with ``next``, ``send``, ``throw`` and ``close`` (and reads ``gi_code`` when
    the wrapper misbehaves); all are passed through.
    """

    __slots__ = ("_generator", "_report")

    def __init__(self, generator: Any, report: Callable[[float, int], None]) -> None:
        self._generator = generator
        self._report = report

    def _resume(self, method: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args)
        finally:
            self._report(time.perf_counter() - start, 0)

    def __iter__(self) -> "_TimedTeardown":
        return self

    def __next__(self) -> Any:
        return self._resume(self._generator.__next__)

    def send(self, value: Any) -> Any:
        return self._resume(self._generator.send, value)

    def throw(self, *exception: Any) -> Any:
        return self._resume(self._generator.throw, *exception)

    def close(self) -> None:
        self._generator.close()

    @property
    def gi_code(self) -> Any:
        return self._generator.gi_code


def implementation_that_raised(error: BaseException, hook_impls: Sequence[Any]) -> Tuple[Any, bool]:
    """The hook implementation whose frame is innermost in ``error``'s traceback (or None), and
    whether user code it called raised: a frame of the user's below it (a ``PyTorchCallback``
    the callbacks adapter called, say). That error is the user's, reported with the user's frames
    as one raised in ``train_batch`` is, not as the plugin's failure."""
    codes = {}
    for impl in hook_impls:
        function = inspect.unwrap(impl.function)
        code = getattr(function, "__code__", None)
        if code is not None:
            codes[code] = impl
    found, user_code_below = None, False
    traceback = error.__traceback__
    while traceback is not None:
        code = traceback.tb_frame.f_code
        impl = codes.get(code)
        if impl is not None:
            found, user_code_below = impl, False
        elif found is not None and is_user_frame(code.co_filename):
            user_code_below = True
        traceback = traceback.tb_next
    return found, user_code_below


#: Where frames that are not the user's live: hookdet, pluggy, Python's standard library, and the
#: Python installation or virtual environment (its ``bin/hookdet`` console script included).
_INTERNAL_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (hookdet.__file__, pluggy.__file__, os.__file__)
) + tuple(os.path.abspath(path) + os.sep for path in (
    sysconfig.get_paths()["stdlib"], sys.prefix, sys.base_prefix, sys.exec_prefix))
_SITE_PACKAGES = ("site-packages", "dist-packages")


def is_user_frame(filename: str) -> bool:
    """Whether ``filename`` is the user's code: not hookdet, pluggy, the standard library or an
    installed package."""
    path = os.path.abspath(filename)
    if path.startswith(_INTERNAL_DIRS) or filename.startswith("<"):
        return False
    return not any(part in path.split(os.sep) for part in _SITE_PACKAGES)
