"""Where a run's time goes: every hook, every plugin's implementation, the trial and the loop.

Listing ``hook_timing`` in ``plugins`` switches it on; when it is not listed nothing of it is
imported and no hook call pays for it. While on, it times

* each hook call as a whole (pluggy's hook-call monitoring),
* each plugin's implementation of each hook, by wrapping the registered implementation
  (``wrapper=True`` generators are timed over their code before and after ``yield``, not over
  what they wrap; plain implementations include any hooks they call themselves),
* the trial's ``train_batch`` and evaluation method,

and at the end of the run (``hookdet_unconfigure``) prints a table to stderr on the chief and
writes ``hook_timing-rank<N>.json`` into the run directory on every rank. The *fit window* runs
from the start of ``on_trial_startup`` to the end of ``on_trial_shutdown``; within it the loop's
own share is the window minus the time inside outermost hook calls and outermost trial-method
calls: data loading, moving batches to the device and the loop's bookkeeping.

pluggy's public monitoring (``add_hookcall_monitoring``) sees a hook call as a whole; to see each
implementation this plugin swaps the ``function`` attribute of pluggy's ``HookImpl`` records (a
public attribute, and the only way pluggy offers) for a timed wrapper, marks the wrapper so it is
never wrapped twice, and puts every original back when the run ends.
"""
from __future__ import annotations

import functools
import json
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import pluggy

from hookdet.markers import hookimpl
from hookdet.trial import PyTorchTrial

_TIMED_MARK = "_hookdet_timed"


class Timing:
    """Calls and total seconds of one timed thing."""

    __slots__ = ("calls", "seconds")

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    def as_dict(self) -> Dict[str, Any]:
        """``{"calls": n, "total_s": seconds}``."""
        return {"calls": self.calls, "total_s": self.seconds}


class _TimedTeardown:
    """A wrapper implementation's generator whose every resumption is timed.

    pluggy drives it with ``next``, ``send``, ``throw`` and ``close`` (and reads ``gi_code`` when
    the wrapper misbehaves); all are passed through.
    """

    __slots__ = ("_generator", "_timing")

    def __init__(self, generator: Any, timing: Timing) -> None:
        self._generator = generator
        self._timing = timing

    def _resume(self, method: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args)
        finally:
            self._timing.seconds += time.perf_counter() - start

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


def _timed(function: Callable[..., Any], timing: Timing, is_wrapper: bool) -> Callable[..., Any]:
    """``function`` with its calls counted and timed into ``timing``."""
    if is_wrapper:

        @functools.wraps(function)
        def timed_wrapper(*args: Any, **kwargs: Any) -> Any:
            timing.calls += 1
            return _TimedTeardown(function(*args, **kwargs), timing)

        setattr(timed_wrapper, _TIMED_MARK, True)
        return timed_wrapper

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            timing.calls += 1
            timing.seconds += time.perf_counter() - start

    setattr(timed, _TIMED_MARK, True)
    return timed


class HookTimingPlugin:
    """Times hooks, implementations and the trial; reports when the run ends."""

    def __init__(self) -> None:
        self.hooks: Dict[str, Timing] = {}
        self.implementations: Dict[Tuple[str, str], Timing] = {}
        self.trial_methods: Dict[str, Timing] = {}
        self._run: Any = None
        self._call_starts: List[float] = []
        self._undo_monitoring: Optional[Callable[[], None]] = None
        self._restore: List[Callable[[], None]] = []
        self._window_start: Optional[float] = None
        self._window_end: Optional[float] = None
        self._outer_hook_seconds = 0.0
        self._outer_trial_seconds = 0.0

    # ------------------------------------------------------------------ installing

    @hookimpl(tryfirst=True)
    def hookdet_configure(self, run: Any) -> None:
        """Start timing (first, so the other plugins' ``hookdet_configure`` is timed too)."""
        self._run = run
        self._undo_monitoring = run.plugins.pluggy_manager.add_hookcall_monitoring(
            self._before_hook, self._after_hook
        )
        self._wrap_implementations()

    @hookimpl(tryfirst=True)
    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
        """Time what joined since configure (callbacks, plugins the trial loaded) and the trial."""
        self._wrap_implementations()
        self._wrap_trial(self._run.trial)

    def _wrap_implementations(self) -> None:
        manager = self._run.plugins.pluggy_manager
        for caller in vars(manager.hook).values():
            if not isinstance(caller, pluggy.HookCaller):
                continue
            for implementation in caller.get_hookimpls():
                function = implementation.function
                if implementation.plugin is self or getattr(function, _TIMED_MARK, False):
                    continue
                key = (caller.name, implementation.plugin_name)
                timing = self.implementations.setdefault(key, Timing())
                is_wrapper = bool(implementation.wrapper or implementation.hookwrapper)
                implementation.function = _timed(function, timing, is_wrapper)  # type: ignore[misc]
                self._restore.append(functools.partial(_set_function, implementation, function))

    def _wrap_trial(self, trial: Any) -> None:
        if trial is None:
            return
        for name in ("train_batch", "evaluate_batch", "evaluate_full_dataset"):
            if getattr(type(trial), name, None) is getattr(PyTorchTrial, name, None):
                continue
            method = getattr(trial, name)
            if getattr(method, _TIMED_MARK, False):
                continue
            timing = self.trial_methods.setdefault(name, Timing())
            setattr(trial, name, self._timed_trial_method(method, timing))
            self._restore.append(functools.partial(_forget_attribute, trial, name))

    def _timed_trial_method(self, method: Callable[..., Any], timing: Timing) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            outermost = not self._call_starts
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                timing.calls += 1
                timing.seconds += elapsed
                if outermost:
                    self._outer_trial_seconds += elapsed

        setattr(timed, _TIMED_MARK, True)
        return timed

    # ------------------------------------------------------------------ hook-call monitoring

    def _before_hook(self, hook_name: str, hook_impls: Any, kwargs: Any) -> None:
        now = time.perf_counter()
        if hook_name == "on_trial_startup" and self._window_start is None:
            self._window_start = now
        self._call_starts.append(now)

    def _after_hook(self, outcome: Any, hook_name: str, hook_impls: Any, kwargs: Any) -> None:
        if not self._call_starts:
            return  # the hookdet_configure call during which timing was switched on
        now = time.perf_counter()
        elapsed = now - self._call_starts.pop()
        timing = self.hooks.setdefault(hook_name, Timing())
        timing.calls += 1
        timing.seconds += elapsed
        if not self._call_starts and self._window_start is not None and self._window_end is None:
            self._outer_hook_seconds += elapsed
        if hook_name == "on_trial_shutdown" and not self._call_starts:
            self._window_end = now

    # ------------------------------------------------------------------ report

    @hookimpl(trylast=True)
    def hookdet_unconfigure(self, run: Any) -> None:
        """Stop timing, undo every wrapper, print the table (chief) and write the JSON."""
        if self._undo_monitoring is not None:
            self._undo_monitoring()
            self._undo_monitoring = None
        for restore in reversed(self._restore):
            restore()
        self._restore.clear()
        report = self.report()
        distributed = run.distributed
        rank = distributed.rank if distributed is not None else 0
        run.run_dir.mkdir(parents=True, exist_ok=True)
        path = run.run_dir / f"hook_timing-rank{rank}.json"
        path.write_text(json.dumps(report, indent=2, sort_keys=True))
        if rank == 0:
            print(format_report(report, rank), file=sys.stderr, flush=True)

    def report(self) -> Dict[str, Any]:
        """Everything measured, as plain values (seconds)."""
        hooks: Dict[str, Any] = {}
        for name, timing in self.hooks.items():
            hooks[name] = {**timing.as_dict(), "implementations": {}}
        for (hook_name, plugin_name), timing in self.implementations.items():
            if timing.calls:
                entry = hooks.setdefault(hook_name, {"calls": None, "total_s": None, "implementations": {}})
                entry["implementations"][plugin_name] = timing.as_dict()
        window = None
        if self._window_start is not None and self._window_end is not None:
            window = self._window_end - self._window_start
        loop = None if window is None else window - self._outer_hook_seconds - self._outer_trial_seconds
        return {
            "fit_window_s": window,
            "in_hooks_s": self._outer_hook_seconds,
            "in_trial_s": self._outer_trial_seconds,
            "loop_s": loop,
            "hooks": hooks,
            "trial_methods": {name: timing.as_dict() for name, timing in self.trial_methods.items()},
        }


def format_report(report: Dict[str, Any], rank: int = 0) -> str:
    """The report as a table: hooks by total time, each followed by its implementations."""
    lines = [f"hookdet hook timing (rank {rank})"]
    window = report["fit_window_s"]
    if window:
        shares = [
            ("hooks", report["in_hooks_s"]),
            ("trial", report["in_trial_s"]),
            ("loop", report["loop_s"]),
        ]
        split = " + ".join(f"{label} {seconds:.3f} s ({100 * seconds / window:.1f}%)" for label, seconds in shares)
        lines.append(f"fit window {window:.3f} s = {split}")
    header = f"{'hook / implementation':<44}{'calls':>8}{'total ms':>12}{'mean us':>11}"
    lines += [header, "-" * len(header)]

    def row(label: str, calls: Optional[int], seconds: Optional[float]) -> str:
        if calls is None or seconds is None:
            return f"{label:<44}{'-':>8}{'-':>12}{'-':>11}"
        mean = seconds / calls * 1e6 if calls else 0.0
        return f"{label:<44}{calls:>8}{seconds * 1e3:>12.3f}{mean:>11.1f}"

    def by_time(item: Tuple[str, Dict[str, Any]]) -> float:
        entry = item[1]
        if entry["total_s"] is not None:
            return -entry["total_s"]
        return -sum(impl["total_s"] for impl in entry.get("implementations", {}).values())

    for name, entry in sorted(report["hooks"].items(), key=by_time):
        lines.append(row(name, entry["calls"], entry["total_s"]))
        implementations = sorted(entry["implementations"].items(), key=lambda kv: -kv[1]["total_s"])
        for plugin_name, timing in implementations:
            lines.append(row(f"  {plugin_name}", timing["calls"], timing["total_s"]))
    for name, timing in sorted(report["trial_methods"].items()):
        lines.append(row(f"trial.{name}", timing["calls"], timing["total_s"]))
    return "\n".join(lines)


def _set_function(implementation: Any, function: Callable[..., Any]) -> None:
    implementation.function = function


def _forget_attribute(target: Any, name: str) -> None:
    target.__dict__.pop(name, None)
