"""Which hyperparameters mattered in a search: Optuna's importance of each (its default
evaluator, PED-ANOVA), over the trials that reported the metric plotted.

The trials go into an in-memory Optuna study as the search's trial view gives them to Optuna
(:func:`hookdet.search.trial_view.parameter`: Determined's ranges, log and categorical
hyperparameters as such); constants, and values the experiment's space does not name, are left
out (:func:`importances`).

Optuna's evaluators import SciPy, scikit-learn and pandas: about 160 MiB and a second the web
view would keep and spend for one chart. So ``hookdet ui`` has them computed by a process of
their own (``python -m hookdet.ui.importance``, the values in and out as JSON), off the request
path and at the lowest priority, so the page being drawn goes first (:func:`importance_of`): the
search page gets the values computed for what it shows, the last ones with a note while newer
are computed, and asks again on its next poll. A computation starts only when a trial's value or
the space changed, one at a time and at most every :data:`FEWEST_SECONDS_BETWEEN` seconds.
"""
from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from hookdet.search.trial_view import parameter, spec_at

#: Fewer trials than this tell nothing about importance.
FEWEST_TRIALS = 3
#: The least time between the starts of two computations for the web view (a live search's values
#: change every few seconds).
FEWEST_SECONDS_BETWEEN = 10.0


def importances(space: Dict[str, Any], rows: List[Dict[str, Any]], smaller_is_better: bool) -> Dict[str, Any]:
    """``{"values": {name: importance}}`` (summing to 1), or ``{"note": why there are none}``."""
    return _importances(json.dumps(space, sort_keys=True), measured_of(rows), smaller_is_better)


@functools.lru_cache(maxsize=8)
def _importances(space_json: str, measured: Tuple[Tuple[float, str], ...], smaller_is_better: bool) -> Dict[str, Any]:
    import optuna

    space = json.loads(space_json)
    if len(measured) < FEWEST_TRIALS:
        return {"note": f"{len(measured)} trials have reported the metric; importance needs {FEWEST_TRIALS}"}
    trials = []
    try:
        for best, hparams_json in measured:
            hparams = json.loads(hparams_json)
            params, distributions = {}, {}
            for name, value in hparams.items():
                try:
                    spec = spec_at(space, name)
                except (KeyError, TypeError):  # not in the experiment's space: not searched
                    continue
                if not isinstance(spec, dict) or spec.get("type") in (None, "const"):
                    continue
                distributions[name], params[name] = parameter(optuna, spec, value)
            trials.append(optuna.trial.create_trial(params=params, distributions=distributions, value=best))
        if not trials[0].params:
            return {"note": "no hyperparameter is searched"}
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(direction="minimize" if smaller_is_better else "maximize")
        study.add_trials(trials)
        return {"values": dict(optuna.importance.get_param_importances(study))}
    except (KeyError, TypeError, ValueError, RuntimeError) as error:  # a space the trials do not fit
        return {"note": f"Optuna could not rank them: {error}"}


class Computed:
    """The web view's importances, each computed by a process of its own (see the module's
    docstring): what is known for each input, the last values for each metric plotted, and the
    one computation running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: Dict[Tuple[str, Tuple[Tuple[float, str], ...], bool], Dict[str, Any]] = {}
        self._last: Dict[str, Dict[str, Any]] = {}
        self._running = False
        self._started = -math.inf

    def of(self, space: Dict[str, Any], rows: List[Dict[str, Any]], smaller_is_better: bool, plotted: str) -> Dict[str, Any]:
        """What :func:`importances` gives for these inputs once computed; until then the last
        values for what is ``plotted`` (a metric at a point; or none) with a note, and the
        computation started when it can be."""
        key = (json.dumps(space, sort_keys=True), measured_of(rows), smaller_is_better)
        if len(key[1]) < FEWEST_TRIALS:  # told at once, with no process
            return _importances(*key)
        with self._lock:
            if key in self._known:
                self._last[plotted] = self._known[key]
                return self._known[key]
            if not self._running and time.monotonic() - self._started >= FEWEST_SECONDS_BETWEEN:
                self._running, self._started = True, time.monotonic()
                threading.Thread(target=self._compute, args=(key, plotted), name="hookdet-importance", daemon=True).start()
            last = self._last.get(plotted)
        if last is None:
            return {"note": "Optuna's importance is being computed"}
        return dict(last, note=(last.get("note") or "") + " (being computed again for the newest values)")

    def _compute(self, key: Tuple[str, Tuple[Tuple[float, str], ...], bool], plotted: str) -> None:
        space_json, measured, smaller_is_better = key
        try:
            done = subprocess.run([sys.executable, "-m", "hookdet.ui.importance"], capture_output=True, text=True,
                                  input=json.dumps({"space": space_json, "measured": measured,
                                                    "smaller_is_better": smaller_is_better}), timeout=600)
            found = json.loads(done.stdout) if done.returncode == 0 else {
                "note": f"Optuna could not rank them: {(done.stderr.strip().splitlines() or ['its process failed'])[-1]}"}
        except (OSError, subprocess.SubprocessError, ValueError) as error:
            found = {"note": f"Optuna could not rank them: {error}"}
        with self._lock:
            if len(self._known) >= 8:
                self._known.pop(next(iter(self._known)))
            self._known[key] = found
            self._last[plotted] = found
            self._running = False


def measured_of(rows: List[Dict[str, Any]]) -> Tuple[Tuple[float, str], ...]:
    """Each row's finite ``best`` with its hyperparameters (as JSON): the inputs that count."""
    return tuple((float(row["best"]), json.dumps(row["hparams"], sort_keys=True)) for row in rows
                 if isinstance(row.get("best"), (int, float)) and math.isfinite(row["best"]))


#: The web view's: one per ``hookdet ui`` process.
COMPUTED = Computed()


def importance_of(space: Dict[str, Any], rows: List[Dict[str, Any]], smaller_is_better: bool, plotted: str) -> Dict[str, Any]:
    """For the web view: the importances of these trials' values of what is ``plotted``, as
    :meth:`Computed.of` gives them."""
    return COMPUTED.of(space, rows, smaller_is_better, plotted)


if __name__ == "__main__":  # the computing process: its inputs on standard input, the values out
    import os

    os.nice(19)  # the page being drawn (the browser, the server) goes first on a busy machine
    given = json.load(sys.stdin)
    measured = tuple((best, hparams) for best, hparams in given["measured"])
    print(json.dumps(_importances(given["space"], measured, given["smaller_is_better"])))
