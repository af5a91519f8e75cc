"""A search directory read back for the run commands: ``hookdet show``, ``plot`` and ``compare``
of a search, and ``hookdet runs`` listing a search's trials under it.

A search directory holds ``search.json`` (what started it: the config, the store, the searcher
and its metric), ``search-state.json`` (the driver's state: every trial, its state in the search
and its run directory) and one run directory per trial. A trial's own ``run.json`` says how its
last process ended (``paused`` when the searcher stopped it at a rung); the search's state says
what the search made of it (``stopped``), and that is what these commands show.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Tuple

#: The file that makes a directory a search directory.
META_FILE = "search.json"
#: The driver's state, replaced whole after every decision.
STATE_FILE = "search-state.json"


class SearchReadError(Exception):
    """A search directory whose files cannot be read; the message names the file."""


def is_search_dir(path: Path) -> bool:
    return (Path(path) / META_FILE).is_file()


def find_searches(root: Path, depth: int = 3) -> List[Path]:
    """Search directories at or below ``root`` (up to ``depth`` levels), by path."""
    root = Path(root)
    if is_search_dir(root):
        return [root]
    found = [Path(meta).parent for level in range(1, depth + 1)
             for meta in root.glob("/".join(["*"] * level) + "/" + META_FILE)]
    return sorted(found)


def read_search(search_dir: Path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(``search.json``, ``search-state.json``) of ``search_dir``; a search killed before its
    first decision has an empty state. Each trial's ``dir`` is its run directory here
    (:func:`trial_dir`)."""
    meta = _read_json(Path(search_dir) / META_FILE)
    state_path = Path(search_dir) / STATE_FILE
    state = _read_json(state_path) if state_path.exists() else {"order": [], "trials": {}}
    for trial in (state.get("trials") or {}).values():
        if isinstance(trial, dict) and isinstance(trial.get("dir"), str):
            trial["dir"] = str(trial_dir(search_dir, trial["dir"]))
    return meta, state


def trial_dir(search_dir: Path, recorded: str) -> Path:
    """A trial's run directory from what the search's state records: a path relative to the
    search directory (what a search writes, so a copied or moved search is whole), or an
    absolute one (a search written before), taken as the directory of that name in this search
    directory when it is gone and that one is there (a search copied from another machine)."""
    directory = Path(recorded)
    if not directory.is_absolute():
        return Path(search_dir) / directory
    here = Path(search_dir) / directory.name
    return here if not directory.exists() and here.is_dir() else directory


def recorded_dir(search_dir: Path, directory: str) -> str:
    """How a search records a trial's run directory: relative to the search directory when it
    is inside it, else as it is (:func:`trial_dir` reads it back)."""
    path, base = Path(directory), Path(search_dir)
    inside = path.is_absolute() == base.is_absolute() and path.is_relative_to(base) and path != base
    return str(path.relative_to(base)) if inside else directory


def _read_json(path: Path) -> Dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SearchReadError(f"{path}: unreadable ({type(error).__name__}: {error})") from None
    if not isinstance(value, dict):
        raise SearchReadError(f"{path}: not a search file hookdet wrote")
    return value


def metric_of(meta: Dict[str, Any]) -> Tuple[str, bool]:
    """(searcher metric, smaller is better) as the search recorded them."""
    return meta.get("metric") or "validation_loss", bool(meta.get("smaller_is_better", True))


def trial_dirs(search_dir: Path) -> List[Path]:
    """The search's trials' run directories, in creation order."""
    _, state = read_search(search_dir)
    return [Path(state["trials"][rid]["dir"]) for rid in state["order"]]


def trial_states(run_dirs: List[Path]) -> Dict[Path, str]:
    """For each of ``run_dirs`` that is a trial of a search (a run directory in a search
    directory): its state in the search (``stopped``, ...), by resolved path."""
    found: Dict[Path, str] = {}
    for search_dir in {Path(run_dir).resolve().parent for run_dir in run_dirs}:
        if not is_search_dir(search_dir):
            continue
        try:
            _, state = read_search(search_dir)
        except SearchReadError:
            continue
        found.update({Path(trial["dir"]).resolve(): trial["state"] for trial in state["trials"].values()})
    return {Path(run_dir).resolve(): found[Path(run_dir).resolve()]
            for run_dir in run_dirs if Path(run_dir).resolve() in found}


def _heading(search_dir: Path, meta: Dict[str, Any], state: Dict[str, Any], table: List[Dict[str, Any]]) -> str:
    """One line: the search, its searcher and metric, its trials by state, its best trial
    (``table``: the search's :func:`hookdet.search.summary.rows`)."""
    from hookdet.search import summary

    metric, smaller = metric_of(meta)
    counts = Counter(trial["state"] for trial in state["trials"].values())
    tally = ", ".join(f"{state_name} {count}" for state_name, count in sorted(counts.items())) or "no trials yet"
    best = summary.best_line(table, state, metric, smaller)
    searcher = meta.get("searcher", "search")
    return f"{Path(search_dir).name}: {searcher} search on {metric}, {len(state['order'])} trials ({tally}); {best}"


def runs_group(search_dir: Path) -> Tuple[str, Dict[Path, str]]:
    """For ``hookdet runs``: the heading above the search's trials, and each trial's run
    directory with its state in the search (``stopped``, ``completed``, ...), by trial number."""
    from hookdet.search import summary

    meta, state = read_search(search_dir)
    metric, smaller = metric_of(meta)
    trials = [state["trials"][rid] for rid in state["order"]]  # by number
    states = {Path(trial["dir"]).resolve(): trial["state"] for trial in trials}
    return f"search {_heading(search_dir, meta, state, summary.rows(state, smaller, metric))}", states


def show_search(search_dir: Path) -> str:
    """``hookdet show SEARCH_DIR``: the heading, the trials' table and where the files are."""
    from hookdet.search import summary

    meta, state = read_search(search_dir)
    metric, smaller = metric_of(meta)
    table = summary.rows(state, smaller, metric)
    lines = [_heading(search_dir, meta, state, table), "", summary.format_table(table, metric), ""]
    lines.append(f"config: {meta.get('config', '-')}")
    lines.append(f"store: {meta.get('storage', '-')} (study {meta.get('study', '-')})")
    for name in ("summary.csv", "searcher-metric.png"):
        if (Path(search_dir) / name).exists():
            lines.append(f"{name}: {Path(search_dir) / name}")
    return "\n".join(lines)


def best_trial(search_dir: Path) -> Tuple[Path, str]:
    """The run directory of the search's best trial, and a line saying which it is; a
    :class:`SearchReadError` when no trial reported the searcher metric."""
    from hookdet.search import summary

    meta, state = read_search(search_dir)
    metric, smaller = metric_of(meta)
    measured = [row for row in summary.rows(state, smaller, metric) if row["best"] is not None]
    if not measured:
        raise SearchReadError(f"search {search_dir}: no trial reported {metric}, so it has no best trial "
                              "to export; export one trial's run directory instead")
    row = summary.best_entry(measured, smaller, lambda candidate: candidate["best"])
    run_dir = Path(state["trials"][row["request_id"]]["dir"])
    return run_dir, (f"search {Path(search_dir).name}: its best trial is trial {row['trial']} ({row['state']}, "
                     f"{metric} {row['best']:.6g}); exporting {run_dir}")
