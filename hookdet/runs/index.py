"""Runs you can find again: ``hookdet runs``, ``hookdet show`` and ``hookdet compare``.

A run directory holds ``config.json`` (the experiment as run), ``metrics.jsonl`` (every report),
``run.json`` (:mod:`hookdet.runs.record`: state, pid, times) and, by default, ``checkpoints/``.
Everything here reads those files and nothing else, so it works on runs that are still going,
that were killed, and on copies of run directories from other machines.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from hookdet.runs.files import CHECKPOINTS_DIR, CONFIG_FILE, METRICS_FILE, RUN_RECORD_FILE, TENSORBOARD_DIR
from hookdet.checkpoints.storage import METADATA_FILE
from hookdet.runs.metrics import read_reports
from hookdet.runs.record import read_record

#: How deep ``hookdet runs DIR`` looks for run directories (a search nests trials in it).
SEARCH_DEPTH = 4


class RunNotFoundError(Exception):
    """A path given as a run is not a run directory; printed as one line."""


@dataclasses.dataclass
class RunSummary:
    """One run as the listing shows it."""

    path: Path
    state: str
    batches: int
    max_batches: Optional[int]
    metric: Optional[str]
    smaller_is_better: bool
    best: Optional[float]
    started: str
    record: Dict[str, Any]
    config: Dict[str, Any]
    reports: List[Dict[str, Any]]

    @property
    def name(self) -> str:
        """The directory's name."""
        return self.path.name


# ------------------------------------------------------------------------------ reading runs


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` looks like a run directory."""
    return path.is_dir() and any((path / name).is_file() for name in (CONFIG_FILE, METRICS_FILE, RUN_RECORD_FILE))


def find_runs(root: Path) -> List[Path]:
    """Run directories at or below ``root`` (up to :data:`SEARCH_DEPTH` levels), by path."""
    if is_run_dir(root):
        return [root]
    found: List[Path] = []
    for directory, subdirectories, _ in os.walk(root):
        depth = len(Path(directory).relative_to(root).parts)
        if depth >= SEARCH_DEPTH:
            subdirectories[:] = []
        for name in sorted(subdirectories):
            candidate = Path(directory) / name
            if is_run_dir(candidate):
                found.append(candidate)
        subdirectories[:] = [name for name in subdirectories if not is_run_dir(Path(directory) / name)
                             and name not in (CHECKPOINTS_DIR, TENSORBOARD_DIR)]
    return sorted(found)


def resolve_run(given: str) -> Path:
    """A run directory from what the user typed: a path, or a name under ``./runs``."""
    for candidate in (Path(given), Path("runs") / given):
        if is_run_dir(candidate):
            return candidate
    raise RunNotFoundError(f"{given}: not a run directory (no {CONFIG_FILE} or {METRICS_FILE} in it)")


def read_config(path: Path) -> Dict[str, Any]:
    """The run's ``config.json`` ({} if it has none)."""
    try:
        config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def summarise(path: Path) -> RunSummary:
    """The listing's view of the run at ``path``."""
    record = read_record(path) or {}
    config = read_config(path)
    reports = read_reports(path)
    searcher = config.get("searcher") or {}
    metric = record.get("searcher_metric") or searcher.get("metric")
    smaller = record.get("smaller_is_better", searcher.get("smaller_is_better", True))
    values = [
        report["metrics"][metric] for report in reports
        if report.get("group") == "validation" and _is_number(report["metrics"].get(metric))
    ]
    best = (min(values) if smaller else max(values)) if values else None
    steps = [int(report.get("steps_completed") or 0) for report in reports]
    return RunSummary(
        path=path,
        state=record.get("state", "unknown"),
        batches=max([int(record.get("batches_trained") or 0), *steps]),
        max_batches=record.get("max_batches"),
        metric=metric,
        smaller_is_better=bool(smaller),
        best=best,
        started=record.get("started") or record.get("created") or "",
        record=record,
        config=config,
        reports=reports,
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def table(rows: Sequence[Sequence[str]]) -> str:
    """Plain aligned columns (the first row is the header)."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    )


# ------------------------------------------------------------------------------ hookdet runs


#: Runs listed apart: a folder, the heading above its runs, and the state the group gives each
#: run, in the group's order (a search's trials by number, with their state in the search; see
#: hookdet.search.report).
Groups = Dict[Path, Tuple[str, Dict[Path, str]]]


def list_runs(root: Path, groups: Optional[Groups] = None) -> str:
    """The ``hookdet runs`` table for the runs under ``root``; the runs of each of ``groups``
    follow, under its heading, with the state it gives them."""
    groups = groups or {}
    summaries = [summarise(path) for path in find_runs(root)]
    if not summaries:
        return f"no runs under {root}"
    summaries.sort(key=lambda summary: (summary.started, str(summary.path)))

    def group_of(path: Path) -> Optional[Path]:
        return next((folder for folder in groups if path.resolve().is_relative_to(folder.resolve())), None)

    loose = [summary for summary in summaries if group_of(summary.path) is None]
    parts = [_runs_table(loose, {})] if loose else []
    for folder, (title, states) in groups.items():
        members = [summary for summary in summaries if group_of(summary.path) == folder]
        order = {path: index for index, path in enumerate(states)}  # the group's own order (trial number)
        members.sort(key=lambda summary: order.get(summary.path.resolve(), len(order)))
        parts.append(title + ("\n" + _indent(_runs_table(members, states)) if members else ""))
    return "\n\n".join(parts)


def _runs_table(summaries: List[RunSummary], states: Dict[Path, str]) -> str:
    rows = [["NAME", "STATE", "BATCHES", "BEST", "STARTED", "DIRECTORY"]]
    for summary in summaries:
        batches = str(summary.batches) + (f"/{summary.max_batches}" if summary.max_batches else "")
        best = "-" if summary.best is None else f"{summary.metric}={_number(summary.best)}"
        state = states.get(summary.path.resolve(), summary.state)
        rows.append([summary.name, state, batches, best, summary.started.replace("T", " ")[:19] or "-",
                     str(summary.path)])
    return table(rows)


# ------------------------------------------------------------------------------ hookdet show


def flatten(value: Any, prefix: str = "") -> Dict[str, Any]:
    """Nested mappings as ``{"a.b.c": leaf}`` (lists are leaves)."""
    if isinstance(value, dict) and value:
        flat: Dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(flatten(inner, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: value} if prefix else {}


def config_differences(before: Dict[str, Any], after: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
    """(field, before, after) for every dotted field whose value differs."""
    old, new = flatten(before), flatten(after)
    missing = object()
    differences = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, missing), new.get(key, missing)
        if a != b:
            differences.append((key, None if a is missing else a, None if b is missing else b))
    return differences


def parent_config(parent: str) -> Optional[Dict[str, Any]]:
    """The experiment config of what a run started from: a run directory's ``config.json``, or
    a checkpoint's ``metadata.json``."""
    path = Path(parent)
    if (path / CONFIG_FILE).is_file():
        return read_config(path)
    try:
        metadata = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    config = metadata.get("experiment_config") if isinstance(metadata, dict) else None
    return config if isinstance(config, dict) else None


def metrics_summary(reports: List[Dict[str, Any]]) -> List[List[str]]:
    """Rows of (group, metric, reports, first, last, min, max), numbers only."""
    series: Dict[Tuple[str, str], List[float]] = {}
    for report in reports:
        for name, value in report["metrics"].items():
            if _is_number(value):
                series.setdefault((str(report.get("group")), name), []).append(value)
    rows = [["GROUP", "METRIC", "REPORTS", "FIRST", "LAST", "MIN", "MAX"]]
    for (group, name), values in sorted(series.items()):
        rows.append([group, name, str(len(values)), *(_number(v) for v in (values[0], values[-1], min(values), max(values)))])
    return rows


def checkpoints_of(summary: RunSummary) -> Tuple[str, List[Tuple[str, Dict[str, Any]]]]:
    """Where the run's checkpoints are, and (location, metadata) of each one this run wrote,
    wherever its storage keeps them (a shared store's checkpoints of other runs are left out)."""
    return checkpoints_in(summary.path)


def checkpoints_in(run_dir: Path) -> Tuple[str, List[Tuple[str, Dict[str, Any]]]]:
    """:func:`checkpoints_of` the run directory ``run_dir``."""
    from hookdet.checkpoints import format as fmt
    from hookdet.checkpoints import lookup
    from hookdet.checkpoints.storage import StorageError
    from hookdet.checkpoints.resolver import checkpoints_of_run, read_identity, storage_of

    identity = read_identity(run_dir)
    if identity is None:  # a run directory of hookdet 0.1: its own checkpoints folder
        root = run_dir / CHECKPOINTS_DIR
        found = [(_relative(path, run_dir), metadata) for path, metadata in lookup.find_checkpoints(root)]
        return _relative(root, run_dir), found
    try:
        storage = storage_of(identity, None)
        checkpoints = checkpoints_of_run(storage, identity)
    except (fmt.CheckpointError, StorageError, OSError) as error:
        return f"not readable: {error}", []
    found, where = [], storage.describe()
    for storage_id, metadata in checkpoints:
        local = storage.local_dir(storage_id)
        if local is not None:
            where = _relative(local.parent, run_dir)
        found.append((_relative(local, run_dir) if local is not None else storage.location(storage_id), metadata))
    return where, found


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return str(path.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return str(path)


def show_run(path: Path, state: Optional[str] = None) -> str:
    """The ``hookdet show`` text for one run; ``state`` overrides its own (a search's trial is
    shown with its state in the search, as ``hookdet runs`` shows it)."""
    summary = summarise(path)
    record = summary.record
    lines = [f"run {summary.name}  ({summary.path})", f"  state: {state or summary.state}"]
    if record.get("pid"):
        lines[-1] += f"  (pid {record['pid']} on {record.get('host', '?')})"
    for label, key in (("started", "started"), ("ended", "ended"), ("error", "error")):
        if record.get(key):
            lines.append(f"  {label}: {record[key]}")
    lines.append(f"  batches: {summary.batches}" + (f"/{summary.max_batches}" if summary.max_batches else ""))
    if summary.best is not None:
        lines.append(f"  best {summary.metric}: {_number(summary.best)}")
    parent = record.get("parent") or record.get("resumed_from")
    if parent and summary.path.resolve() in (Path(parent).resolve(), *Path(parent).resolve().parents):
        lines.append("  resumed in place (one history in this directory)")
    elif parent:
        lines.append(f"  resumed from: {parent}")
        before = parent_config(parent)
        if before is None:
            lines.append("  config differences from its parent: (parent config not readable)")
        else:
            differences = config_differences(before, summary.config)
            lines.append("  config differences from its parent:" + ("" if differences else " none"))
            lines += [f"    {key}: {_shown(old)} -> {_shown(new)}" for key, old, new in differences]
    lines.append("")
    rows = metrics_summary(summary.reports)
    lines += ["metrics:", _indent(table(rows)) if len(rows) > 1 else "  (no reports yet)", ""]
    where, checkpoints = checkpoints_of(summary)
    lines.append(f"checkpoints ({where}):" + ("" if checkpoints else " none"))
    for checkpoint, metadata in checkpoints:
        validation = metadata.get("validation_metric")
        extra = f"  {summary.metric}={_number(validation)}" if validation is not None else ""
        lines.append(f"  {checkpoint}  batch {metadata.get('steps_completed', '?')}{extra}")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


# ------------------------------------------------------------------------------ hookdet compare


def compare_runs(paths: Sequence[Path], states: Optional[Dict[Path, str]] = None) -> str:
    """The ``hookdet compare`` table: state, batches, best and the latest value of every metric
    of each run side by side, then the config fields that differ between them. ``states``
    (by resolved run directory) override the runs' own, as in :func:`list_runs`."""
    summaries = [summarise(path) for path in paths]
    names = _distinct_names(summaries)
    rows = [["", *names]]
    rows.append(["state", *((states or {}).get(summary.path.resolve(), summary.state) for summary in summaries)])
    rows.append(["batches", *(str(summary.batches) for summary in summaries)])
    for metric in sorted({summary.metric for summary in summaries if summary.metric}):
        rows.append([f"best {metric}", *(_number(s.best) if s.metric == metric else "-" for s in summaries)])
    latest = [_latest_metrics(summary.reports) for summary in summaries]
    for key in sorted(set().union(*latest)):
        rows.append([f"{key[0]} {key[1]} (last)", *(_number(values.get(key)) for values in latest)])
    text = table(rows)
    flat = [flatten(summary.config) for summary in summaries]
    differing = sorted(key for key in set().union(*flat) if len({json.dumps(f.get(key)) for f in flat}) > 1)
    if differing:
        config_rows = [["config", *names]] + [[key, *(_shown(f.get(key)) for f in flat)] for key in differing]
        text += "\n\n" + table(config_rows)
    return text


def _latest_metrics(reports: List[Dict[str, Any]]) -> Dict[Tuple[str, str], Any]:
    latest: Dict[Tuple[str, str], Any] = {}
    for report in reports:
        for name, value in report["metrics"].items():
            if _is_number(value):
                latest[(str(report.get("group")), name)] = value
    return latest


def _distinct_names(summaries: Sequence[RunSummary]) -> List[str]:
    names = [summary.name for summary in summaries]
    if len(set(names)) == len(names):
        return names
    return [str(summary.path) for summary in summaries]


def iter_series(reports: List[Dict[str, Any]]) -> Iterator[Tuple[Tuple[str, str], List[int], List[float]]]:
    """((group, metric), steps, values) for every numeric metric of a run, in report order."""
    series: Dict[Tuple[str, str], Tuple[List[int], List[float]]] = {}
    for report in reports:
        for name, value in report["metrics"].items():
            if _is_number(value):
                steps, values = series.setdefault((str(report.get("group")), name), ([], []))
                steps.append(int(report.get("steps_completed") or 0))
                values.append(float(value))
    for key, (steps, values) in series.items():
        yield key, steps, values
