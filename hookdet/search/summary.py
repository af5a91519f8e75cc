"""What a search leaves besides its run directories: ``summary.csv``, a printed table, and
``searcher-metric.png`` (the searcher metric against batches, one line per trial)."""
from __future__ import annotations

import csv
import io
import json
import math
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, TypeVar

T = TypeVar("T")

COLUMNS = ["trial", "request_id", "seed", "bracket", "rung", "state", "best", "last", "batches",
           "restarts"]


def flatten(hparams: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"optimizer": {"lr": 0.1}}`` as ``{"optimizer.lr": 0.1}``."""
    flat: Dict[str, Any] = {}
    for name in sorted(hparams):
        value = hparams[name]
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def best_entry(entries: Sequence[T], smaller_is_better: bool, value_of: Callable[[T], float] = lambda x: x) -> T:
    """The entry whose value is best; a NaN ranks below every number (``min``/``max`` would
    return a NaN that came first: a diverged trial named the best). ``entries`` is not empty."""
    def rank(entry: T) -> tuple:
        value = value_of(entry)
        return (math.isnan(value), value if smaller_is_better else -value)

    return min(entries, key=rank)


def rows(state: Dict[str, Any], smaller_is_better: bool = True,
         metric: Optional[str] = None) -> List[Dict[str, Any]]:
    """One row per trial, in creation order (best/last over every validation in its log)."""
    table = []
    for rid in state["order"]:
        trial = state["trials"][rid]
        from hookdet.search.worker import validations

        logged = validations(Path(trial["dir"]), metric) if metric else []
        values = [value for _, value in (logged or trial["validations"])]
        row = {
            "trial": trial["number"], "request_id": rid, "seed": trial["seed"],
            # No rung reached (a search without rungs, or a trial that ended before the first): none.
            "bracket": trial["bracket"], "rung": trial["rung"] if trial["rung"] >= 0 else None,
            "state": trial["state"],
            "best": best_entry(values, smaller_is_better) if values else None, "last": values[-1] if values else None,
            "batches": trial.get("batches") or 0, "restarts": trial["restarts"],
        }
        row.update({f"hp.{k}": v for k, v in flatten(trial["hparams"]).items()})
        table.append(row)
    return table


def write_csv(table: List[Dict[str, Any]], path: Path) -> None:
    names = COLUMNS + sorted({key for row in table for key in row if key.startswith("hp.")})
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=names)
    writer.writeheader()
    for row in table:
        writer.writerow(row)
    Path(path).write_text(buffer.getvalue())


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(table: List[Dict[str, Any]], metric: str) -> str:
    """A readable table of the trials (best first is left to the reader: creation order)."""
    hp_names = sorted({key for row in table for key in row if key.startswith("hp.")})
    header = ["trial", "state", "bracket", "rung", f"best {metric}", "last", "batches",
              "restarts", "seed"] + [name[3:] for name in hp_names]
    keys = ["trial", "state", "bracket", "rung", "best", "last", "batches", "restarts",
            "seed"] + hp_names
    cells = [header] + [[_show(row.get(key)) for key in keys] for row in table]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
             for line in cells]
    return "\n".join(lines)


def best_line(table: List[Dict[str, Any]], state: Dict[str, Any], metric: str,
              smaller_is_better: bool) -> str:
    """One line naming the search's best trial: its metric, hyperparameters and run directory
    (which holds its checkpoints)."""
    measured = [row for row in table if row["best"] is not None]
    if not state["trials"]:
        return "best: none (the search created no trial)"
    if not measured:
        return f"best: no trial reported {metric}"
    row = best_entry(measured, smaller_is_better, lambda candidate: candidate["best"])
    trial = state["trials"][row["request_id"]]
    return (f"best: trial {row['trial']} ({row['state']}), {metric} {row['best']:.6g}, "
            f"hyperparameters {json.dumps(trial['hparams'], sort_keys=True)}, "
            f"checkpoints in {trial['dir']}")


def prefetch_plotting() -> None:
    """Import matplotlib in a thread of its own now, while the trials train (the driver mostly
    waits then): the plot at the search's end only draws, a third of a second sooner."""
    from hookdet.runs.plot import load_pyplot

    def load() -> None:
        try:
            load_pyplot()
        except ImportError:  # plot() returns None then
            pass

    threading.Thread(target=load, name="hookdet-prefetch-matplotlib", daemon=True).start()


def plot(state: Dict[str, Any], metric: str, path: Path) -> Optional[Path]:
    """The searcher metric against batches for every trial (from each trial's metrics.jsonl)."""
    from hookdet.runs.plot import load_pyplot

    try:
        plt = load_pyplot()
    except ImportError:
        return None
    from hookdet.search.worker import validations

    figure, axes = plt.subplots(figsize=(8, 5))
    plotted = 0
    for rid in state["order"]:
        trial = state["trials"][rid]
        points = validations(Path(trial["dir"]), metric)
        if points:
            plotted += 1
            axes.plot([p[0] for p in points], [p[1] for p in points], marker=".",
                      label=f"trial {trial['number']} ({trial['state']})")
    axes.set_xlabel("batches")
    axes.set_ylabel(metric)
    if 0 < plotted <= 20:
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
