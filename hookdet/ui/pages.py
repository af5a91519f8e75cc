"""What each page of ``hookdet ui`` shows, as plain values for its template and its JSON.

Every ``*_page`` function gives a template what it renders once; every ``*_updates`` function
gives the page's script what is new since what it says it has (``have``: for each series, the
epoch and the number of points it holds; for logs, the number of lines). Values go out as they
are in the run's files: the templates escape them, and the script sets them as text or escapes
them for Plotly's labels (which take a little HTML).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from hookdet.runs.index import flatten
from hookdet.search.report import SearchReadError
from hookdet.ui.catalog import Catalog
from hookdet.ui.importance import importance_of
from hookdet.ui.records import RunRecords
from hookdet.ui.series import BoundedSeries

#: A search trial's state as the list says it.
STATE_WORDS = {"stopped": "stopped by the searcher"}


def series_update(series: BoundedSeries, have: Optional[List[Any]], resets: int = 0) -> Dict[str, Any]:
    """The points of ``series`` the page lacks: all of them after a thinning, or after the run's
    ``metrics.jsonl`` was replaced (``resets``: a resume rewrote its reports; the page's points
    of the old file are stale even where the new one is longer)."""
    epoch = f"{resets}.{series.epoch}"
    since = have[1] if isinstance(have, list) and len(have) == 2 and have[0] == epoch else 0
    since = since if isinstance(since, int) and 0 <= since <= series.kept else 0
    xs, ys = series.xs[since:], series.ys[since:]
    return {"epoch": epoch, "from": since, "x": xs, "y": ys, "tail": series.tail}


# ------------------------------------------------------------------------------ the list


#: What a page's reading of a damaged record file raises (a file torn, not JSON, of the wrong
#: type, unreadable): that run or search is shown as damaged, with the reason, and no other.
DAMAGED = (ValueError, TypeError, KeyError, AttributeError, OSError, SearchReadError)


def list_rows(catalog: Catalog) -> List[Dict[str, Any]]:
    """Every run and search under the roots, newest first; a search with its trials. One whose
    files are damaged is a row saying so (:func:`damaged_row`); the others are listed as ever."""
    searches, runs = catalog.scan()
    rows = []
    for path in runs:
        try:
            rows.append(dict(catalog.run(path).summary(), url=catalog.url_of(path)))
        except DAMAGED as error:
            rows.append(damaged_row(catalog, path, "run", error))
    for path in searches:
        try:
            rows.append(search_row(catalog, path))
        except DAMAGED as error:
            rows.append(damaged_row(catalog, path, "search", error))
    rows.sort(key=lambda row: str(row.get("started") or ""), reverse=True)
    return rows


def search_row(catalog: Catalog, path: Path) -> Dict[str, Any]:
    """A search's row in the list, with a row for each trial."""
    search = catalog.search(path)
    row = dict(search.summary(), url=catalog.url_of(path))
    row["trials"] = [dict(trial_row(search, request_id), url=catalog.url_of(trial.path))
                     for request_id, trial in search.trials.items() if trial.path.resolve().is_relative_to(path)]
    return row


def trial_row(search: Any, request_id: str) -> Dict[str, Any]:
    """A trial's row under its search's; a trial whose records are damaged says so (the search
    and its other trials are listed as ever)."""
    try:
        return search.trial_summary(request_id, STATE_WORDS)
    except DAMAGED as error:
        name = f"{search.path.name}/{search.trials[request_id].path.name}"
        return {"name": name, "kind": "run", "state": "damaged", "damaged": damage_of(error), "batches": 0,
                "max_batches": None, "metric": None, "best": None, "started": "", "seconds": None}


def damaged_row(catalog: Catalog, path: Path, kind: str, error: BaseException) -> Dict[str, Any]:
    """The list's row of a run or search whose files could not be read: its name, ``damaged``
    and why."""
    return {"name": path.name, "kind": kind, "state": "damaged", "damaged": damage_of(error),
            "batches": 0, "max_batches": None, "metric": None, "best": None, "started": "", "seconds": None,
            "url": catalog.url_of(path)}


def damage_of(error: BaseException) -> str:
    """What was wrong with a record file, in one line."""
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


# ------------------------------------------------------------------------------ a run


def run_page(catalog: Catalog, path: Path) -> Dict[str, Any]:
    """The run page's fixed parts: identity, configuration, history, checkpoints."""
    records = catalog.run(path)
    owner = catalog.owner_search(path)
    config = records.config()
    where, checkpoints = records.checkpoints()
    return {
        "name": path.name,
        "api": catalog.url_of(path).replace("/run/", "/api/run/", 1),
        "summary": records.summary(_state_in_search(catalog, path)),
        "hparams": flatten(config.get("hyperparameters") or {}),
        "config": json.dumps(config, indent=2, sort_keys=True),
        "history": with_kills(records.history() or _history_from_record(records.record()), records.record()),
        "log_url": catalog.url_of(path).replace("/run/", "/logs/", 1),
        "checkpoints": checkpoints, "checkpoint_store": where,
        "search": None if owner is None else {"name": owner.name, "url": catalog.url_of(owner)},
    }


def _state_in_search(catalog: Catalog, path: Path) -> Optional[str]:
    """A search's trial's state as the search calls it where it differs from its own
    (``stopped by the searcher`` for a trial whose process ended ``paused``); else None."""
    owner = catalog.owner_search(path)
    if owner is None:
        return None
    search = catalog.search(owner)
    search.refresh()
    return STATE_WORDS.get(catalog.trial_states(search).get(path.resolve(), ""))


#: The history's events that start a process.
STARTS = ("started", "resumed")
#: The history entry shown where a process ended without recording its end (its time unknown).
KILLED = {"event": "killed", "time": None, "note": "the process ended without recording its end"}


def with_kills(history: List[Dict[str, Any]], record: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The history with a ``killed`` entry where a process ended without writing its end (a
    start followed by another start, or the last start of a run whose process is gone: SIGKILL,
    a lost machine)."""
    shown: List[Dict[str, Any]] = []
    for entry in history:
        if entry.get("event") in STARTS and shown and shown[-1].get("event") in STARTS:
            shown.append(dict(KILLED))
        shown.append(entry)
    if shown and shown[-1].get("event") in STARTS and record.get("state") == "killed":
        shown.append(dict(KILLED))
    return shown


def _history_from_record(record: Dict[str, Any]) -> List[Dict[str, Any]]:
    """A run from before ``history.jsonl``: its one start and its end, from ``run.json``."""
    entries = []
    if record.get("started"):
        entries.append({"event": "resumed" if record.get("resumed_from") else "started", "time": record["started"],
                        "resumed_from": record.get("resumed_from")})
    if record.get("ended"):
        entries.append({"event": record.get("state"), "time": record["ended"],
                        "batches_trained": record.get("batches_trained"), "error": record.get("error")})
    return entries


def run_updates(catalog: Catalog, path: Path, have: Dict[str, Any], log_count: int,
                validations_had: str = "") -> Dict[str, Any]:
    """What is new on the run page: its summary, its series' new points, its new validations
    (``validations_had``: what the page holds, see :func:`_validation_update`), its new log lines."""
    records = catalog.run(path)
    records.refresh()
    records.new_log_lines()
    return {
        "summary": records.summary(_state_in_search(catalog, path)),
        "series": {name: series_update(series, have.get(name), records.resets)
                   for name, series in sorted(records.series.items())},
        "nonfinite": records.nonfinite,
        "validations": _validation_update(records, validations_had),
        "logs": _log_update(records, log_count),
    }


def _validation_update(records: RunRecords, had: str) -> Dict[str, Any]:
    """The validations the page lacks: it says ``<epoch>.<count>`` of what it holds (the epoch
    counts the times the run's file was read again from its start: a resume rewrote it); all of
    the kept ones when the epoch differs or the count is not one the run has had."""
    epoch, _, count = had.partition(".")
    kept = list(records.validations)
    first_kept = records.validation_count - len(kept)
    same = epoch == str(records.resets) and count.isdigit() and first_kept <= int(count) <= records.validation_count
    rows = kept[int(count) - first_kept:] if same else kept
    return {"epoch": str(records.resets), "count": records.validation_count, "reset": not same,
            "rows": [{"batch": batch, "metrics": metrics} for batch, metrics in rows]}


def _log_update(records: RunRecords, log_count: int) -> Dict[str, Any]:
    kept = list(records.log_lines)
    first_kept = records.log_count - len(kept)
    start = max(log_count, first_kept) - first_kept if 0 <= log_count <= records.log_count else 0
    return {"count": records.log_count, "reset": log_count < first_kept or log_count > records.log_count,
            "lines": kept[start:]}


# ------------------------------------------------------------------------------ a search


def search_page(catalog: Catalog, path: Path) -> Dict[str, Any]:
    """The search page's fixed parts: its experiment, searcher and where its store is."""
    search = catalog.search(path)
    search.refresh()
    metric, smaller = search.metric
    meta = search.meta
    return {
        "name": path.name,
        "api": catalog.url_of(path).replace("/search/", "/api/search/", 1),
        "metric": metric, "smaller": smaller,
        "searcher": meta.get("searcher") or (meta.get("experiment") or {}).get("searcher", {}).get("name", "search"),
        "store": meta.get("storage"),
        "config": json.dumps(meta.get("experiment") or {}, indent=2, sort_keys=True),
        "summary": search.summary(),
    }


def search_updates(catalog: Catalog, path: Path, have: Dict[str, Any], choice: Optional[Dict[str, str]] = None
                   ) -> Dict[str, Any]:
    """The trials' table, each trial's searcher-metric curve (new points), the rungs, and each
    trial's ``value`` for the hyperparameter plots: the metric and point ``choice`` names
    (``{"metric": ..., "at": "best" | "last" | "rung:K" | "batch:N"}``; the searcher metric's best
    by default)."""
    search = catalog.search(path)
    search.refresh_trials()
    metric, smaller = search.metric
    chosen_metric, at = (choice or {}).get("metric") or metric, (choice or {}).get("at") or "best"
    space = (search.meta.get("experiment") or {}).get("hyperparameters") or {}
    rows, curves = [], {}
    for request_id in search.state["order"]:
        trial, records = search.state["trials"][request_id], search.trials[request_id]
        series = records.series.get(f"validation/{metric}")
        label = f"trial {trial['number']}"
        if series is not None:
            curves[label] = series_update(series, have.get(label), records.resets)
        rows.append(dict(_trial_row(catalog, trial, records, series, smaller, metric),
                         value=records.value_at(chosen_metric, _point(search.state, trial, at), smaller),
                         **_progress_of(search, request_id, trial, records)))
    return {"summary": search.summary(), "metric": metric, "smaller": smaller, "trials": rows,
            "curves": curves, "rungs": _rungs(search.state), "hparams": _varied(rows),
            "log_hparams": log_hyperparameters(space),
            "chosen": {"metric": chosen_metric, "at": at, "metrics": sorted({name for records in search.trials.values()
                                                                          for name in records.validation_points}),
                       "rungs": _rung_lengths(search.state)},
            "importance": importance_of(space, [dict(row, best=row["value"]) for row in rows], smaller,
                                        f"{chosen_metric} at {at}")}


def _rung_lengths(state: Dict[str, Any]) -> List[Any]:
    """The length of each rung, in batches, in the first bracket (a rung of another bracket may
    be longer: :func:`_point` takes each trial's own)."""
    brackets = (state.get("method") or {}).get("brackets") or []
    return [rung.get("units") for rung in (brackets[0].get("rungs") or [])] if brackets else []


def _point(state: Dict[str, Any], trial: Dict[str, Any], at: str) -> str:
    """``at`` for this trial: ``rung:K`` as ``batch:<its bracket's rung K length>``."""
    if not at.startswith("rung:"):
        return at
    try:
        rung = int(at.split(":", 1)[1])
        brackets = (state.get("method") or {}).get("brackets") or []
        return f"batch:{brackets[int(trial.get('bracket') or 0)]['rungs'][rung]['units']}"
    except (ValueError, IndexError, KeyError, TypeError):
        return "none"


def log_hyperparameters(space: Dict[str, Any], prefix: str = "") -> List[str]:
    """The (flattened) names of the hyperparameters searched on a log scale (``type: log``)."""
    found = []
    for name, spec in space.items():
        if isinstance(spec, dict) and spec.get("type") == "log":
            found.append(prefix + name)
        elif isinstance(spec, dict) and "type" not in spec:
            found += log_hyperparameters(spec, f"{prefix}{name}.")
    return found


def _trial_row(catalog: Catalog, trial: Dict[str, Any], records: RunRecords, series: Optional[BoundedSeries],
               smaller: bool, search_metric: str) -> Dict[str, Any]:
    values = (series.ys + ([series.tail[1]] if series.tail else [])) if series is not None else []
    return {
        "number": trial["number"],
        "bracket": trial.get("bracket"), "rung": _rung(trial.get("rung")),
        "best": ((min if smaller else max)(values) if values else None), "last": values[-1] if values else None,
        "nonfinite": records.nonfinite.get(f"validation/{search_metric}", 0),
        "hparams": {name: value for name, value in flatten(trial.get("hparams") or {}).items()},
        "url": catalog.url_of(records.path),
    }


def _progress_of(search: Any, request_id: str, trial: Dict[str, Any], records: RunRecords) -> Dict[str, Any]:
    """A trial's state and batches as they are now (:meth:`SearchRecords.trial_progress`), and
    the length its segment trains to while it runs."""
    try:
        state, batches = search.trial_progress(request_id, STATE_WORDS)
    except DAMAGED as error:
        return {"state": "damaged", "damaged": damage_of(error),
                "batches": max(int(trial.get("batches") or 0), records.last_batch)}
    target = trial.get("target")
    return {"state": state, "batches": batches,
            "target": target if state == "running" and isinstance(target, int) else None}


def _rung(rung: Any) -> Optional[int]:
    """The highest rung a trial reached; None before the first (or in a search without rungs)."""
    return rung if isinstance(rung, int) and rung >= 0 else None


def _varied(rows: List[Dict[str, Any]]) -> List[str]:
    """The hyperparameters that differ between trials (what the plots of a search are about)."""
    names = sorted({name for row in rows for name in row["hparams"]})
    return [name for name in names
            if len({json.dumps(row["hparams"].get(name), sort_keys=True) for row in rows}) > 1]


def _rungs(state: Dict[str, Any]) -> List[Dict[str, int]]:
    """For each rung: the trials that reached it, went on past it, and were stopped at it."""
    trials = list(state["trials"].values())
    top = max([int(trial.get("rung") if trial.get("rung") is not None else -1) for trial in trials] or [-1])
    table = []
    for rung in range(top + 1):
        reached = [t for t in trials if (t.get("rung") if t.get("rung") is not None else -1) >= rung]
        table.append({"rung": rung, "reached": len(reached),
                      "continued": sum(1 for t in reached if t["rung"] > rung),
                      "stopped": sum(1 for t in reached if t["rung"] == rung and t["state"] == "stopped")})
    return table


# ------------------------------------------------------------------------------ compare


def compare_page(catalog: Catalog, paths: List[Path]) -> Dict[str, Any]:
    """Runs side by side: their configurations, field by field, with the differing ones marked."""
    configs = [flatten(catalog.run(path).config()) for path in paths]
    fields = sorted({name for config in configs for name in config})
    rows = [{"field": name, "values": [_shown(config.get(name)) for config in configs],
             "differs": len({json.dumps(config.get(name), sort_keys=True, default=str) for config in configs}) > 1}
            for name in fields]
    query = "&".join(f"run={catalog.url_of(path).split('/', 2)[2]}" for path in paths)
    return {"names": [path.name for path in paths], "urls": [catalog.url_of(path) for path in paths],
            "rows": rows, "api": f"/api/compare?{query}"}


def _shown(value: Any) -> str:
    return "-" if value is None else (value if isinstance(value, str) else json.dumps(value))


def compare_updates(catalog: Catalog, paths: List[Path], have: Dict[str, Any]) -> Dict[str, Any]:
    """Every run's series, keyed ``<group>/<metric>@<run>``, new points only."""
    found: Dict[str, Any] = {}
    for path in paths:
        records = catalog.run(path)
        records.refresh()
        for name, series in sorted(records.series.items()):
            key = f"{name}@{path.name}"
            group, _, metric = name.partition("/")
            found[key] = dict(series_update(series, have.get(key), records.resets), metric=metric, group=group, run=path.name)
    return {"series": found}
