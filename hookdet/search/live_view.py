"""A search's live view in a terminal: the trials at work, the counts, the best so far.

::

    search: running 2 · queued 1 · completed 3 · stopped 1 | best: trial 2, validation_loss 0.4127 (lr=0.1)
      trial 4  batch 24 of 32  validation_loss 1.231 @ 16
      trial 7  batch 3 of 8    -

Drawn with rich a few times a second below the driver's decision lines, which print above it as
ordinary lines; off a terminal there is no view, only those lines. What it shows comes from the
driver's state (its trials, as the main thread last left them: a snapshot it hands over after
each poll) and, for a trial at work, the end of its ``metrics.jsonl`` (its latest batch): nothing
of the store is read from the drawing thread.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any, Dict, List, Optional

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from hookdet.search import methods
from hookdet.search.space import searched_names
from hookdet.search.summary import best_entry
from hookdet.search.trial_view import value_at
from hookdet.search.worker import latest_batch

#: Redraws per second.
REFRESHES_PER_SECOND = 2
#: Trial states the live line counts by name (as the summary and ``hookdet runs`` call them);
#: the others (queued, running) are "open".
TALLIED = ("paused", "stopped", "completed", "invalid_hp", "errored")

_ORDER = ("running", "queued", "paused", "stopping", "completed", "stopped", "errored", "invalid_hp")


class SearchView:
    """The live view; :meth:`say` prints a line above it."""

    def __init__(self, stream: IO[str], metric: str) -> None:
        self.metric, self.headline = metric, ""
        self.trials: List[Dict[str, Any]] = []
        self.running: set = set()
        self.console = Console(file=stream, highlight=False)
        self.live = Live(_Frame(self), console=self.console, refresh_per_second=REFRESHES_PER_SECOND)

    def open(self) -> None:
        self.live.start()

    def close(self) -> None:
        self.live.stop()

    def say(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def show(self, trials: List[Dict[str, Any]], running: set, headline: str) -> None:
        """The trials (copies of the driver's records), the request ids of those at work, and
        what follows the counts (the best so far)."""
        self.trials, self.running, self.headline = trials, running, headline

    def lines(self) -> List[Text]:
        counts: Dict[str, int] = {}
        for trial in self.trials:
            state = "running" if trial["request_id"] in self.running else trial["state"]
            counts[state] = counts.get(state, 0) + 1
        tally = " · ".join(f"{state} {counts[state]}" for state in _ORDER if counts.get(state))
        rows = [Text(f"search: {tally or 'starting'}{self.headline}", no_wrap=True, overflow="ellipsis")]
        for trial in sorted(self.trials, key=lambda each: each["number"]):
            if trial["request_id"] in self.running:
                rows.append(Text(self.trial_row(trial), no_wrap=True, overflow="ellipsis"))
        return rows

    def trial_row(self, trial: Dict[str, Any]) -> str:
        batch = latest_batch(Path(trial["dir"])) if trial.get("dir") else None
        target = f" of {trial['target']}" if trial.get("target") else ""
        where = f"batch {batch if batch is not None else 0}{target}"
        latest = trial.get("validations") or []
        shown = f"{self.metric} {latest[-1][1]:.4g} @ {latest[-1][0]}" if latest else "-"
        return f"  trial {trial['number']:<3} {where:<18} {shown}"


class _Frame:
    def __init__(self, view: SearchView) -> None:
        self.view = view
        self.last: Optional[Group] = None

    def __rich__(self) -> Group:
        try:
            self.last = Group(*self.view.lines())
        except (OSError, ValueError, KeyError):  # a trial's file mid-write: the last frame again
            pass
        return self.last or Group()


# ---------------------------------------------------------------------------------------------
# The lines a search prints (above the view, or alone off a terminal)
# ---------------------------------------------------------------------------------------------


def decision_line(driver: Any, trial: Dict[str, Any], attrs: Dict[str, Any]) -> str:
    """One line after each decision: what the segment gave, what became of its trial, the
    search's counts and the best trial so far."""
    metric = driver.settings.metric
    value = attrs.get("metric")  # the metric's name until a worker records the value
    reached = (f"reached batch {attrs.get('batches')} ({metric} {value:.4g})"
               if attrs.get("exit_code") == 0 and isinstance(value, (int, float))
               else f"ended (exit status {attrs.get('exit_code')})")
    outcome = {"queued": "goes on"}.get(trial["state"], trial["state"])
    counts: Dict[str, int] = {}
    for each in driver.state["trials"].values():  # the summary's words, errored apart from InvalidHP
        state = each["state"] if each["state"] in TALLIED else "open"
        counts[state] = counts.get(state, 0) + 1
    tally = ", ".join(f"{state} {counts[state]}" for state in ("open",) + TALLIED if counts.get(state))
    line = f"search: trial {trial['number']} {reached}: {outcome} | {tally}{best_words(driver)}"
    eta = eta_seconds(driver)
    return line + (f" | ETA at most {duration(eta)}" if eta is not None else "")


def best_words(driver: Any) -> str:
    """`` | best: trial 2, validation_loss 0.4127 (lr=0.1)``, or nothing before a validation."""
    best = best_trial(driver)
    if best is None:
        return ""
    return (f" | best: trial {best['number']}, {driver.settings.metric} {best['best']:.4g} "
            f"({searched_values(driver.space, best['hparams'])})")


def best_trial(driver: Any) -> Optional[Dict[str, Any]]:
    """The trial with the best searcher metric so far (with it as ``best``), or None."""
    smaller = driver.settings.smaller_is_better
    measured = [dict(t, best=best_entry([v for _, v in t["validations"]], smaller))
                for t in driver.state["trials"].values() if t["validations"]]
    return best_entry(measured, smaller, lambda t: t["best"]) if measured else None


def eta_seconds(driver: Any) -> Optional[float]:
    """An upper bound of the time left: the batches every open and future trial could still
    train (to the search's length; ASHA stops most of them sooner) at the pace the driver has
    seen. None without a length, or before a batch was trained by this driver."""
    length = driver.settings.max_length
    if length is None or driver.settings.unit != "batches":
        return None
    trials = driver.state["trials"].values()
    elapsed = time.monotonic() - driver.started_at
    done_here = driver.batches_trained() - driver.batches_at_start
    if done_here <= 0 or elapsed <= 0:
        return None
    open_trials = [trial for trial in trials if trial["state"] in ("queued", "paused")]
    to_come = max(methods.most_trials(driver.method, len(driver.state["order"])) - len(driver.state["order"]), 0)
    left = sum(length - int(trial.get("batches") or 0) for trial in open_trials) + to_come * length
    return left * elapsed / done_here


def searched_values(space: Dict[str, Any], hparams: Dict[str, Any]) -> str:
    """``learning_rate=0.1239, momentum=0.5825``: the hyperparameters the search varies (the
    constants left out), numbers to 4 significant digits, so a decision line fits a row; the
    summary and ``hookdet show`` give them in full."""
    shown = []
    for dotted in searched_names(space):
        value = value_at(hparams, dotted)
        text = f"{value:.4g}" if isinstance(value, float) else json.dumps(value, separators=(",", ":"))
        shown.append(f"{dotted}={text}")
    return ", ".join(shown)


def duration(seconds: float) -> str:
    """``45s``, ``12m``, ``3h05m``."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
