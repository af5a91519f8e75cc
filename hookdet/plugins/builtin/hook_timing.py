"""Where a run's time goes: every hook, every plugin's implementation, the trial and the loop.

Listing ``hook_timing`` in ``plugins`` switches it on; when it is not listed nothing of it is
imported and no hook call pays for it. While on, it listens to the plugin manager's hook monitor
(:mod:`hookdet.plugins.monitor`, which times each hook call and each implementation: ``wrapper=True``
implementations over their code before and after ``yield``, not over what they wrap; plain
implementations including any hooks they call themselves) and times the trial's
``train_batch`` and evaluation method itself.

At the end of the run (``hookdet_unconfigure``) it prints a table to stderr on the chief and
writes ``hook_timing-rank<N>.json`` into the run directory on every rank. The *fit window* runs
from the start of ``on_trial_startup`` to the end of ``on_trial_shutdown``; within it the loop's
own share is the window minus the time inside outermost hook calls and outermost trial-method
calls: data loading, moving batches to the device and the loop's bookkeeping.
"""
from __future__ import annotations

import functools
import json
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from hookdet.plugin import PyTorchTrial, hookimpl

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


class HookTimingPlugin:
    """Times hooks, implementations and the trial; reports when the run ends."""

    def __init__(self) -> None:
        self.hooks: Dict[str, Timing] = {}
        self.implementations: Dict[Tuple[str, str], Timing] = {}
        self.trial_methods: Dict[str, Timing] = {}
        self._monitor: Any = None
        self._hook_depth = 0
        self._restore: List[Callable[[], None]] = []
        self._window_start: Optional[float] = None
        self._window_end: Optional[float] = None
        self._outer_hook_seconds = 0.0
        self._outer_trial_seconds = 0.0

    # ------------------------------------------------------------------ listening

    @hookimpl(tryfirst=True)
    def hookdet_configure(self, run: Any) -> None:
        """Start listening (first, so the other plugins' ``hookdet_configure`` is timed too)."""
        self._monitor = run.plugins.monitor
        self._monitor.listen(self)

    @hookimpl(tryfirst=True)
    def on_trial_startup(self, run: Any) -> None:
        """Time the trial's methods."""
        self._wrap_trial(run.trial)

    def hook_started(self, hook_name: str, outermost: bool) -> None:
        """The monitor: a hook call began."""
        self._hook_depth += 1
        if hook_name == "on_trial_startup" and self._window_start is None:
            self._window_start = time.perf_counter()

    def hook_finished(self, hook_name: str, plugin_names: Sequence[str], seconds: float, outermost: bool) -> None:
        """The monitor: a hook call ended after ``seconds``."""
        self._hook_depth = max(0, self._hook_depth - 1)
        timing = self.hooks.setdefault(hook_name, Timing())
        timing.calls += 1
        timing.seconds += seconds
        if outermost and self._window_start is not None and self._window_end is None:
            self._outer_hook_seconds += seconds
        if hook_name == "on_trial_shutdown" and outermost:
            self._window_end = time.perf_counter()

    def implementation_timed(self, hook_name: str, plugin_name: str, seconds: float, calls: int) -> None:
        """The monitor: an implementation ran."""
        timing = self.implementations.setdefault((hook_name, plugin_name), Timing())
        timing.calls += calls
        timing.seconds += seconds

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
            outermost = self._hook_depth == 0
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

    # ------------------------------------------------------------------ report

    @hookimpl(trylast=True)
    def hookdet_unconfigure(self, run: Any) -> None:
        """Stop listening, unwrap the trial, print the table (chief) and write the JSON."""
        if self._monitor is not None:
            self._monitor.stop_listening(self)
            self._monitor = None
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


def _forget_attribute(target: Any, name: str) -> None:
    target.__dict__.pop(name, None)
