"""One Optuna trial per hookdet trial, for optuna-dashboard and any tool that reads an Optuna study.

The search's own study holds *segments* (a trial trains rung by rung, each rung a segment, with
its hyperparameters in a user attribute), which is what the workers need but not what a person
wants to look at. Beside it, in the same store, the driver keeps a second study named
``<the search's study>:trials`` with one Optuna trial per hookdet trial: its searched
hyperparameters as Optuna parameters (with their distributions, so the dashboard's parallel
coordinates, slice, contour and importance plots work), every validation of the searcher metric
as an intermediate value at its batch, and its end as Optuna's state (completed: COMPLETE with its
best value; stopped by the searcher: PRUNED; errored or invalid hyperparameters: FAIL). The
driver marks a trial after each decision and brings the marked ones up to date when it wakes
with nothing to decide (at most :data:`LAG_SECONDS` later): between two segments the store and
the driver's process are the critical path (the next segment is being claimed and started), and
the view is for people. It reads only the new lines of each trial's
``metrics.jsonl``. A failure to write it is said once and never stops the search.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

from hookdet.runs.files import METRICS_FILE
from hookdet.runs.tail import JsonLinesTail
from hookdet.search.space import is_spec, searched_names

logger = logging.getLogger("hookdet")

#: The view study is the search's study name with this after it.
VIEW_SUFFIX = ":trials"
_ENDED = {"completed": "COMPLETE", "stopped": "PRUNED", "errored": "FAIL", "invalid_hp": "FAIL"}
#: How long a marked trial may wait for its update while the driver keeps having decisions to take.
LAG_SECONDS = 2.0


def is_view(study_name: str) -> bool:
    return study_name.endswith(VIEW_SUFFIX)


def spec_at(space: Mapping[str, Any], dotted: str) -> Mapping[str, Any]:
    value: Any = space
    for part in dotted.split("."):
        value = value[part]
    return value


def value_at(hparams: Mapping[str, Any], dotted: str) -> Any:
    value: Any = hparams
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def parameter(optuna: Any, spec: Mapping[str, Any], value: Any) -> Tuple[Any, Any]:
    """(Optuna distribution, Optuna value) of one searched hyperparameter's ``value``: a number
    range as Determined's space gives it (widened to hold the value exactly), a categorical by
    its values where Optuna can hold them, else by their index."""
    distributions = optuna.distributions
    if spec["type"] == "categorical":
        choices = list(spec["vals"])
        if all(choice is None or isinstance(choice, (bool, int, float, str)) for choice in choices):
            return distributions.CategoricalDistribution(choices), value
        return distributions.CategoricalDistribution(list(range(len(choices)))), choices.index(value)
    if spec["type"] == "int":
        return distributions.IntDistribution(min(spec["minval"], value), max(spec["maxval"], value)), value
    low, high = (spec["minval"], spec["maxval"]) if spec["type"] == "double" else \
        (float(spec["base"]) ** spec["minval"], float(spec["base"]) ** spec["maxval"])
    return distributions.FloatDistribution(min(low, value), max(high, value), log=spec["type"] == "log"), value


class TrialView:
    """The ``:trials`` study of one search (see the module docstring)."""

    def __init__(self, queue: Any, space: Mapping[str, Any], metric: str) -> None:
        self.optuna, self.storage, self.space, self.metric = queue.optuna, queue.storage, space, metric
        direction = queue.study.direction.name.lower()
        self.pick = min if direction == "minimize" else max
        self.study = self.optuna.create_study(study_name=queue.study.study_name + VIEW_SUFFIX,
                                              storage=queue.storage.wrapped, load_if_exists=True, direction=direction)
        self.study_id = self.storage.get_study_id_from_name(self.study.study_name)
        self.trial_ids: Dict[int, int] = {}
        self.tails: Dict[int, JsonLinesTail] = {}  # each trial's metrics.jsonl, read as it grows
        self.failed = False
        self.marked: Dict[int, Dict[str, Any]] = {}  # trial number -> the driver's record
        self.marked_since = float("inf")
        for frozen in self.storage.get_all_trials(self.study_id, deepcopy=False):
            number = frozen.user_attrs.get("hookdet_trial")
            if number is not None:
                self.trial_ids[number] = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, frozen.number)

    def mark(self, trial: Dict[str, Any]) -> None:
        """Note that ``trial`` changed; :meth:`update_marked` writes it."""
        self.marked[trial["number"]] = trial
        self.marked_since = min(self.marked_since, time.monotonic())

    def update_marked(self, busy: bool) -> None:
        """Bring the marked trials up to date, unless the driver is ``busy`` (it just decided,
        or a segment waits to be claimed) for less than :data:`LAG_SECONDS`; ``busy=False`` also
        at the search's end."""
        if not self.marked or (busy and time.monotonic() - self.marked_since < LAG_SECONDS):
            return
        marked, self.marked, self.marked_since = self.marked, {}, float("inf")
        for trial in marked.values():
            self.update(trial)

    def update(self, trial: Dict[str, Any]) -> None:
        """Bring hookdet trial ``trial`` (the driver's record of it) up to date in the view."""
        try:
            trial_id = self.trial_ids.get(trial["number"]) or self._create(trial)
            frozen = self.storage.get_trial(trial_id)
            if frozen.state != self.optuna.trial.TrialState.RUNNING:
                return
            for step, value in self._new_validations(trial):
                if step not in frozen.intermediate_values:
                    self.storage.set_trial_intermediate_value(trial_id, step, value)
            ended = _ENDED.get(trial["state"])
            measured = [value for _, value in trial.get("validations", []) if not math.isnan(value)]
            if ended == "COMPLETE" and not measured:
                ended = "FAIL"  # nothing to rank it by
            if ended is not None:
                best = [self.pick(measured)] if ended == "COMPLETE" else None
                self.storage.set_trial_state_values(trial_id, state=getattr(self.optuna.trial.TrialState, ended),
                                                    values=best)
        except Exception as error:  # noqa: BLE001 - the view is for people; the search goes on
            if not self.failed:
                self.failed = True
                logger.warning("hookdet: warning: the search's trial view (%s) is not updated: %s",
                               self.study.study_name, error)

    def _create(self, trial: Dict[str, Any]) -> int:
        params, distributions = {}, {}
        for dotted in searched_names(self.space):
            spec = spec_at(self.space, dotted)
            if is_spec(spec):
                distributions[dotted], params[dotted] = parameter(self.optuna, spec, value_at(trial["hparams"], dotted))
        template = self.optuna.trial.create_trial(
            state=self.optuna.trial.TrialState.RUNNING, params=params, distributions=distributions,
            user_attrs={"hookdet_trial": trial["number"], "run_dir": trial.get("dir")})
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=template)
        self.trial_ids[trial["number"]] = trial_id
        return trial_id

    def _new_validations(self, trial: Dict[str, Any]) -> List[Tuple[int, float]]:
        """(batch, searcher metric) of the validations written since the last look."""
        found: List[Tuple[int, float]] = []

        def take(report: Dict[str, Any]) -> None:
            value = (report.get("metrics") or {}).get(self.metric)
            if report.get("group") == "validation" and isinstance(value, (int, float)):
                found.append((int(report["steps_completed"]), float(value)))

        tail = self.tails.get(trial["number"])
        if tail is None:
            path = Path(trial.get("dir") or "") / METRICS_FILE
            tail = self.tails[trial["number"]] = JsonLinesTail(path, take, lambda: None, only_lines_with=b'"validation"')
        tail.on_record = take  # a rewritten file (a resume) is read again from its start
        tail.catch_up()
        return found
