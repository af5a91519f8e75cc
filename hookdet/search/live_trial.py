"""A Core API trial in a search: decided at each rung while it trains, never paused there.

A trial class or a Trainer-API script is trained rung by rung: each segment ends at the first
validation at or past its rung (a checkpoint, exit 0), and the searcher continues it from that
checkpoint, bit for bit. A Core API script's resume is only as exact as the script (Determined's
own ``model_def_adaptive.py`` builds a fresh model after loading its checkpoint), so pausing it
at rungs would change its results. Such a trial runs as one segment, to its own end, and is
decided live, as Determined's cluster decides it:

- the trial says what it is (``core.init()`` writes ``core_api: true`` into its ``run.json``);
- its worker (:class:`LiveRelay`) publishes the trial's validations on the segment in the store
  as they are reported (``live``: ``[steps, time, metric]`` each, ``time`` the validation's
  ``time_metric`` value, or its ``steps_completed`` for batches);
- the driver takes the first validation at or past the trial's rung, in its decision order, as
  it takes a finished segment's (:func:`rung_reached`); to continue it gives the trial its next
  rung and a new place in that order (:func:`decision_order`), in its own state; to stop it sets
  the segment's ``stop``;
- the worker, seeing ``stop``, makes the trial's stop file (``$HOOKDET_SEARCH_STOP_FILE``):
  ``should_preempt()`` turns true at the script's next check, and the trial ends *stopped*.

The decisions are the ones a paused trial gets, at the same validations, in the same order, so a
search's outcome does not depend on whether its trials are Core API scripts, nor on timing; only
how far a stopped trial trains past its rung before it next asks does.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hookdet.runs.metrics import metrics_path
from hookdet.runs.record import read_record
from hookdet.runs.tail import JsonLinesTail

logger = logging.getLogger("hookdet")

#: The segment attributes of a live trial: its validations (the worker's), and the driver's stop.
LIVE, STOP = "live", "stop"
#: The stop file's name in the trial's run directory.
STOP_FILE = ".search-stop"


def stop_file(run_dir: Path) -> Path:
    """The file whose existence tells the trial in ``run_dir`` that the search stopped it."""
    return Path(run_dir) / STOP_FILE


def validation_row(report: Dict[str, Any], metric: str, unit: Optional[str]) -> List[Any]:
    """``[steps, time, metric value]`` of one validation report: ``time`` is the validation's
    ``unit`` value (Determined 0.38 reads the ``time_metric`` key of the reported metrics), or its
    ``steps_completed`` when the unit is batches and it reported none; a value it lacks is None
    (the driver fails the trial, naming both)."""
    values = report["metrics"]
    time = values.get(unit) if unit in values else (report["steps_completed"] if unit in (None, "batches") else None)
    return [report["steps_completed"], time, values.get(metric)]


def rung_reached(attrs: Dict[str, Any], trial: Dict[str, Any]) -> Optional[Tuple[int, Any, Any]]:
    """The first validation a running live segment published at or past its trial's rung
    (``target``) and past what was decided on, or None while it has none (or the segment is not
    live, or was stopped)."""
    target = trial.get("target")
    if trial.get("stop") or not attrs.get(LIVE) or target is None:  # no rung: it trains to its own end
        return None
    for steps, time, value in attrs[LIVE]:
        if steps > trial.get("live_taken", -1) and (time is None or value is None or _number(time) >= target):
            return steps, time, value
    return None


def decision_due(driver: Any, segment: Any) -> bool:
    """Whether ``segment`` is a Core API trial still training that reached its rung."""
    from hookdet.search.store import attrs_of

    attrs = attrs_of(segment)
    trial = driver.state["trials"].get(attrs.get("request_id"))
    return segment.state.name == "RUNNING" and trial is not None and rung_reached(attrs, trial) is not None


def decision_order(driver: Any, segment: Any) -> Tuple[int, int]:
    """Where a segment stands in the driver's decision order: a Core API trial decided live by
    its trial's place (each rung it goes on past gives it a new one, as a new segment would get),
    any other by its own (:func:`hookdet.search.store.sequence_number`)."""
    from hookdet.search.store import attrs_of, sequence_number

    trial = driver.state["trials"].get(attrs_of(segment).get("request_id"))
    if trial is not None and "live_taken" in trial and trial.get("seq") is not None:
        return trial["seq"], segment.number
    return sequence_number(segment)


def missing_values(metric: str, unit: Optional[str], reached: Tuple[int, Any, Any]) -> Optional[str]:
    """Why a live validation cannot be decided on, in one line naming both names, or None."""
    steps, time, value = reached
    if time is not None and value is not None and _is_number(time) and _is_number(value):
        return None
    return (f"the validation at batch {steps} must report the searcher metric {metric!r} and the time metric "
            f"{unit!r} (as numbers); it reported {metric}={value!r}, {unit}={time!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: Any) -> float:
    return float(value) if _is_number(value) else float("-inf")


class LiveRelay:
    """The worker's side: publish a Core API trial's validations, pass the driver's stop on.

    Whether the trial is one is read once, at its first report (``core.init()`` marks the run
    before any); its validations are read incrementally (:class:`~hookdet.runs.tail.JsonLinesTail`)."""

    def __init__(self, queue: Any, trial_id: int, run_dir: Path, metric: str, unit: Optional[str]) -> None:
        self.queue, self.trial_id, self.run_dir = queue, trial_id, Path(run_dir)
        self.metric, self.unit = metric, unit
        self.core_api: Optional[bool] = None  # not known before the trial's first report
        self._rows: List[List[Any]] = []
        self._tail = JsonLinesTail(metrics_path(self.run_dir), self._take, self._rows.clear,
                                   only_lines_with=b'"validation"')
        self._stopped = False

    def _take(self, report: Dict[str, Any]) -> None:
        if report.get("group") == "validation" and isinstance(report.get("metrics"), dict):
            self._rows.append(validation_row(report, self.metric, self.unit))

    def _is_core_api(self) -> bool:
        if self.core_api is None and metrics_path(self.run_dir).exists():
            self.core_api = bool((read_record(self.run_dir, check_alive=False) or {}).get("core_api"))
        return bool(self.core_api)

    def poll(self) -> None:
        """Once in a while as the segment trains."""
        if not self._is_core_api():
            return
        self.publish()
        if not self._stopped and self.queue.storage.get_trial(self.trial_id).user_attrs.get(STOP):
            self._stopped = True
            stop_file(self.run_dir).touch()
            logger.info("worker: trial in %s stopped by the search at its rung", self.run_dir)

    def publish(self) -> Optional[List[List[Any]]]:
        """The trial's validations on its segment in the store, when new ones came; all of them
        (None for a trial that is not a Core API one)."""
        if not self._is_core_api():
            return None
        if self._tail.catch_up():
            self.queue.storage.set_trial_user_attr(self.trial_id, LIVE, self._rows)
        return list(self._rows)


# ---------------------------------------------------------------------------------------------
# The driver's side
# ---------------------------------------------------------------------------------------------


def decide_rung(driver: Any, segment: Any) -> None:
    """A running Core API trial reached its rung (:func:`rung_reached`): decide now, in the
    decision order, and either move its segment on to the next rung or stop it."""
    from hookdet.search import methods
    from hookdet.search.store import attrs_of

    attrs = attrs_of(segment)
    trial = driver.state["trials"][attrs["request_id"]]
    reached = rung_reached(attrs, trial)
    assert reached is not None
    problem = missing_values(driver.settings.metric, driver.settings.unit, reached)
    if problem is not None:
        logger.error("trial %d: %s", trial["number"], problem)
        driver.apply(driver.method.trial_exited_early(driver.ctx, trial["request_id"], methods.ERRORED))
        trial["stop"] = trial["errored"] = True
    else:
        driver.take_validation(trial, int(reached[0]), int(reached[1]), float(reached[2]))
    trial["live_taken"] = reached[0]
    if trial["stop"] or driver.trained_fully(trial):
        trial["stop"], trial["state"] = True, "stopping"  # closed when its process has ended
        driver.state.setdefault("live_stopped", []).append(attrs["key"])
        tell_the_worker_to_stop(driver, segment)
    else:  # on to its next rung, in the same process: a new place in the decision order
        driver.advance(trial)
    driver.save()
    driver.flush()
    driver.tell_decision(trial, dict(attrs, exit_code=0, batches=reached[0], metric=reached[2]))


def tell_the_worker_to_stop(driver: Any, segment: Any) -> None:
    """Set the segment's ``stop``, unless it ended meanwhile (its end then closes the trial)."""
    import optuna

    try:
        driver.queue.storage.set_trial_user_attr(driver.queue.trial_id(segment.number), STOP, True)
    except optuna.exceptions.UpdateFinishedTrialError:
        logger.info("the trial's segment ended before its stop was set: its end closes it")


def take_remaining_rungs(driver: Any, trial: Dict[str, Any], rows: List[List[Any]]) -> None:
    """The rungs a Core API trial passed after its last live decision (it ended first): each
    taken in order, at its first validation, until the searcher stops it; a trial with no rung
    to reach (a search without a length), its last validation."""
    readable = [row for row in rows if missing_values(driver.settings.metric, driver.settings.unit, row) is None]
    if trial.get("target") is None:
        rows = readable[-1:]
    for steps, time, value in rows:
        if trial["stop"] or driver.trained_fully(trial) or steps <= trial.get("live_taken", -1):
            continue
        if missing_values(driver.settings.metric, driver.settings.unit, (steps, time, value)) is not None:
            continue
        target = trial.get("target")
        if target is None or time >= target:
            driver.take_validation(trial, int(steps), int(time), float(value))
            trial["live_taken"] = steps
            trial["target"] = driver.next_rung(trial)


def ending_state(driver: Any, trial: Dict[str, Any], rows: List[List[Any]]) -> str:
    """How a Core API trial whose process ended closes, once the rungs its last validations
    ``rows`` passed are taken (:func:`take_remaining_rungs`): ``errored`` (a validation the
    searcher could not read), ``stopped`` by the searcher short of its length, else ``completed``."""
    take_remaining_rungs(driver, trial, rows)
    if trial.get("errored"):
        return "errored"
    return "stopped" if trial["stop"] and not driver.trained_fully(trial) else "completed"
