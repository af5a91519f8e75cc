"""``hookdet plot RUN... -o out.png``: every metric of one or more runs against batches, as a PNG.

One panel per metric (training and validation metrics apart, validation first), one line per
run, drawn headless with matplotlib's Agg backend, so it works over ssh and in CI. matplotlib is
an optional extra: ``pip install 'hookdet[plot]'``.

The image is :data:`PANEL_WIDTH_PX` wide per column (up to :data:`COLUMNS` columns) and
:data:`PANEL_HEIGHT_PX` high per row of panels.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from hookdet.runs.index import iter_series, read_reports

COLUMNS = 3
PANEL_WIDTH_PX = 400
PANEL_HEIGHT_PX = 300
DPI = 100


class PlotUnavailableError(Exception):
    """matplotlib is not installed; the message names the extra."""


def image_size(panels: int) -> Tuple[int, int]:
    """(width, height) in pixels of a plot with ``panels`` panels."""
    columns = min(COLUMNS, max(panels, 1))
    rows = max(1, math.ceil(panels / columns))
    return columns * PANEL_WIDTH_PX, rows * PANEL_HEIGHT_PX


def load_pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed), with matplotlib's own INFO
    lines ("generated new fontManager", once per machine) kept out of hookdet's output.
    ImportError without matplotlib."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def plot_runs(run_dirs: Sequence[Path], output: Path, log_scale: bool = False) -> int:
    """Draw the metrics of ``run_dirs`` into the PNG ``output`` (``log_scale``: every panel's
    values on a log scale); return the number of panels."""
    pyplot = pyplot_or_extra()
    figure, panels = figure_of(run_dirs, log_scale)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=DPI, format="png")
    pyplot.close(figure)
    return panels


def pyplot_or_extra() -> Any:
    """:func:`load_pyplot`, or a :class:`PlotUnavailableError` naming the extra."""
    try:
        return load_pyplot()
    except ImportError as error:
        raise PlotUnavailableError("hookdet plot needs matplotlib: pip install 'hookdet[plot]'") from error


def figure_of(run_dirs: Sequence[Path], log_scale: bool = False) -> Tuple[Any, int]:
    """The figure of :func:`plot_runs`, one panel per metric (validation first) with a line per
    run, and its number of panels."""
    pyplot = pyplot_or_extra()
    curves: Dict[Tuple[str, str], List[Tuple[str, List[int], List[float]]]] = {}
    for run_dir in run_dirs:
        for key, steps, values in iter_series(read_reports(run_dir)):
            curves.setdefault(key, []).append((run_dir.name, steps, values))
    if not curves:
        raise PlotUnavailableError(f"nothing to plot: no metrics reported in {', '.join(map(str, run_dirs))}")
    order = sorted(curves, key=lambda key: (key[0] != "validation", key[0], key[1]))
    width, height = image_size(len(order))
    columns = min(COLUMNS, len(order))
    rows = math.ceil(len(order) / columns)
    figure, axes = pyplot.subplots(rows, columns, figsize=(width / DPI, height / DPI), dpi=DPI, squeeze=False)
    for index, key in enumerate(order):
        panel = axes[index // columns][index % columns]
        for name, steps, values in curves[key]:
            panel.plot(steps, values, marker="." if len(steps) < 30 else None, label=name)
        if log_scale:  # "symlog" where a value is zero or negative, which a log scale cannot show
            positive = all(value > 0 for _, _, values in curves[key] for value in values)
            panel.set_yscale("log" if positive else "symlog")
        panel.set_title(f"{key[0]}: {key[1]}", fontsize=9)
        panel.set_xlabel("batches", fontsize=8)
        panel.tick_params(labelsize=7)
        panel.grid(alpha=0.3)
        if len(run_dirs) > 1:
            panel.legend(fontsize=7)
    for index in range(len(order), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    figure.tight_layout()
    return figure, len(order)
