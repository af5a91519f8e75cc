"""One search directory as the web view shows it, refreshed in place.

A :class:`SearchRecords` reads ``search.json`` and, when it changed, ``search-state.json`` (the
driver replaces it whole at each decision), and each trial through a
:class:`~hookdet.ui.records.RunRecords` of its own, which follows only the trial's validations.
A trial's state and batches come from its own records as they are now (the state file is
written at decisions only), and a trial whose records are damaged marks itself, not its search.
"""
from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from hookdet.search import report
from hookdet.ui.records import DamagedRecord, RunRecords, is_number, redacted, seconds_between


class SearchRecords:
    """A search directory: its meta, its state (read again when the file changes), its trials."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.trials: Dict[str, RunRecords] = {}
        self._state_stamp: Optional[Tuple[int, int]] = None
        self.meta: Dict[str, Any] = {}
        self.state: Dict[str, Any] = {"order": [], "trials": {}}

    def refresh(self) -> None:
        """Read the search's files again where they changed (not its trials': :meth:`refresh_trials`)."""
        try:
            status = os.stat(self.path / report.STATE_FILE)
            stamp: Optional[Tuple[int, int]] = (status.st_mtime_ns, status.st_size)
        except OSError:
            stamp = None
        if stamp != self._state_stamp or not self.meta:
            meta, self.state = report.read_search(self.path)
            self.meta = redacted(meta)
            self._state_stamp = stamp
        for request_id in self.state["order"]:
            if request_id not in self.trials:
                self.trials[request_id] = RunRecords(Path(self.state["trials"][request_id]["dir"]),
                                                     search_metric=self.metric[0])

    def refresh_trials(self) -> None:
        """Read each trial's new validation reports (its curve on the search page)."""
        self.refresh()
        for records in self.trials.values():
            records.refresh()

    @property
    def metric(self) -> Tuple[str, bool]:
        return report.metric_of(self.meta)

    def trial_summary(self, request_id: str, state_words: Dict[str, str]) -> Dict[str, Any]:
        """A trial's row in the list, from the search's state and the trial's ``run.json`` alone
        (no ``metrics.jsonl`` read: the list of a large search stays quick)."""
        trial, records = self.state["trials"][request_id], self.trials[request_id]
        record = records.record()
        metric, smaller = self.metric
        values = [value for _, value in trial.get("validations") or [] if is_number(value)]
        state, batches = self.trial_progress(request_id, state_words)
        # The segment's target: a bar of it only while the trial has not passed it (a rung's
        # validation can fall past the rung).
        target = trial.get("target")
        return {
            "name": f"{self.path.name}/{records.path.name}", "kind": "run",
            "state": state,
            "batches": batches, "max_batches": target if isinstance(target, int) and target >= batches else None,
            "metric": metric,
            "best": (min if smaller else max)(values) if values else None,
            "started": record.get("created") or record.get("started") or "",
            "seconds": records.training_seconds(record),
        }

    def trial_progress(self, request_id: str, state_words: Dict[str, str]) -> Tuple[str, int]:
        """A trial's state and batches as they are now: ``running`` while its process trains
        (the search's state file, rewritten at decisions only, says queued then), its batches
        from its own records as they come (the summary of its reports, not their file)."""
        trial, records = self.state["trials"][request_id], self.trials[request_id]
        record = _readable_record(records)
        state = "running" if record.get("state") == "running" else state_words.get(trial["state"], trial["state"])
        batches = max(int(trial.get("batches") or 0), int(record.get("batches_trained") or 0),
                      records.reports_summary().last_batch if state == "running" else 0)
        return state, batches

    def summary(self) -> Dict[str, Any]:
        """The list's row for the search: its trials' counts, the best metric, times (from the
        search's files and the trials' ``run.json``)."""
        self.refresh()
        metric, smaller = self.metric
        bests = [value for trial in self.state["trials"].values()
                 for _, value in trial.get("validations") or [] if is_number(value)]
        states = collections.Counter(self.trial_progress(request_id, {})[0] for request_id in self.state["order"]
                                     if request_id in self.trials)
        records = [_readable_record(trial) for trial in self.trials.values()]
        starts = sorted(r.get("created") or r.get("started") for r in records if r.get("created") or r.get("started"))
        ends = sorted(str(r.get("ended")) for r in records if r.get("ended"))
        running = any(r.get("state") == "running" for r in records) or not records
        return {
            "name": self.path.name, "kind": "search",
            "state": _search_state(states),
            "batches": sum(int(trial.get("batches") or 0) for trial in self.state["trials"].values()),
            "max_batches": None, "metric": metric,
            "best": ((min if smaller else max)(bests) if bests else None),
            "started": starts[0] if starts else "",
            "seconds": seconds_between(starts[0], None if running else ends[-1]) if starts and (running or ends) else None,
            "counts": dict(states),
        }


def _readable_record(trial: RunRecords) -> Dict[str, Any]:
    """A trial's ``run.json``, or nothing when it is damaged (its own row says so; the search's
    stays up)."""
    try:
        return trial.record()
    except DamagedRecord:
        return {}


def _search_state(counts: "collections.Counter[str]") -> str:
    """One word for a search: running while any trial is, else how its trials ended."""
    if not counts:
        return "starting"
    for word in ("running", "queued", "paused"):
        if counts.get(word):
            return "running"
    return "completed" if set(counts) <= {"completed", "stopped"} else ", ".join(sorted(counts))
