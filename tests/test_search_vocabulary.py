"""One vocabulary for a search's trials, whichever command shows them: the live lines, the
summary, ``hookdet runs``, ``show`` and ``compare`` (real searches through ``hookdet run``)."""
from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from tests.test_search_run import search
from tests.test_searcher_block import hookdet

pytest.importorskip("optuna")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_random_search_has_no_rungs_and_counts_invalid_hp_apart(tmp_path: Path) -> None:
    """Random-search trials reach no rung (``-``, not ``-1``); the live line counts InvalidHP
    trials as ``invalid_hp``, the summary's word, not as failed; matplotlib's first-use font
    cache line (a fresh cache here) is not in the output."""
    result = search(tmp_path, "random.yaml", "--run-dir", "random", "--workers", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "random" / "summary.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["rung"] for row in rows} == {""} and {row["state"] for row in rows} == {"completed", "invalid_hp"}
    table = result.stdout[result.stdout.index("trial  state"):].splitlines()
    rung_column = table[0].index("rung")
    assert {line[rung_column] for line in table[1:len(rows) + 1]} == {"-"}
    live = [line for line in result.stdout.splitlines() if line.startswith("search: trial ")]
    assert live and not any("failed" in line for line in live)
    assert any(re.search(r"\| .*invalid_hp \d", line) for line in live), live
    assert "fontManager" not in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_runs_show_and_compare_call_a_stopped_trial_stopped_and_list_trials_by_number(tmp_path: Path) -> None:
    """ASHA stops trials at a rung: their own run.json says the process ended ``paused``; the
    search calls them ``stopped``, and so do ``runs``, ``show`` and ``compare``. ``runs`` lists
    the trials by number, not by when each last started."""
    result = search(tmp_path, "asha_promote.yaml", "--run-dir", "asha", "--workers", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "asha" / "summary.csv") as handle:
        states = {int(row["trial"]): row["state"] for row in csv.DictReader(handle)}
    stopped = [number for number, state in states.items() if state == "stopped"]
    assert stopped, states
    stopped_dir = tmp_path / "asha" / f"trial-{stopped[0]:03d}"
    assert '"paused"' in (stopped_dir / "run.json").read_text()  # the process's own word

    shown = hookdet(tmp_path, "show", str(stopped_dir))
    assert shown.returncode == 0, shown.stderr
    assert "  state: stopped" in shown.stdout and "paused" not in shown.stdout

    compared = hookdet(tmp_path, "compare", str(tmp_path / "asha"))
    assert compared.returncode == 0, compared.stderr
    state_row = next(line for line in compared.stdout.splitlines() if line.startswith("state"))
    assert state_row.split()[1:] == [states[number] for number in sorted(states)]

    # Trial 1 started again last (as a promoted or continued trial's next segment does, hours
    # later on real lengths): listed by when each last started, it would come last.
    record = tmp_path / "asha" / "trial-001" / "run.json"
    record.write_text(re.sub(r'"started": "[^"]*"', '"started": "2099-01-01T00:00:00+00:00"', record.read_text()))
    listed = hookdet(tmp_path, "runs", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    group = listed.stdout.split("search asha", 1)[1].splitlines()
    names = [line.split()[0] for line in group if line.strip().startswith("trial-")]
    assert names == [f"trial-{number:03d}" for number in sorted(states)]
    assert "paused" not in listed.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_export_and_plot_of_a_search(tmp_path: Path) -> None:
    """``hookdet export SEARCH_DIR`` exports its best trial, saying which; ``hookdet plot
    SEARCH_DIR --log`` draws every metric of every trial on a log scale."""
    import torch

    result = search(tmp_path, "grid.yaml", "--run-dir", "grid", "--workers", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "grid" / "summary.csv") as handle:
        rows = [row for row in csv.DictReader(handle) if row["best"]]
    best = min(rows, key=lambda row: float(row["best"]))
    exported = hookdet(tmp_path, "export", "grid", "search.pt")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.startswith(f"search grid: its best trial is trial {best['trial']} (completed, "
                                      f"validation_loss {float(best['best']):.6g}); exporting ")
    trial = hookdet(tmp_path, "export", f"grid/trial-{int(best['trial']):03d}", "trial.pt")
    assert trial.returncode == 0, trial.stderr
    search_state = torch.load(tmp_path / "search.pt", weights_only=True)
    trial_state = torch.load(tmp_path / "trial.pt", weights_only=True)
    assert search_state.keys() == trial_state.keys()
    assert all(torch.equal(search_state[key], trial_state[key]) for key in search_state)
    # hookdet plot of a search: every metric of every trial (a panel a metric), on a log scale.
    from matplotlib import image

    from hookdet.runs.plot import figure_of, image_size

    plotted = hookdet(tmp_path, "plot", "grid", "--log", "-o", "grid.png")
    assert plotted.returncode == 0, plotted.stderr
    width, height = image_size(2)  # validation_loss, and training loss
    assert image.imread(str(tmp_path / "grid.png")).shape[:2] == (height, width)
    trial_dirs = sorted(path for path in (tmp_path / "grid").glob("trial-*") if path.is_dir())
    figure, panels = figure_of(trial_dirs, log_scale=True)
    visible = [axes for axes in figure.axes if axes.get_visible()]
    assert panels == len(visible) == 2
    assert [axes.get_yscale() for axes in visible] == ["log", "log"]
    reported = {group: sum(f'"group": "{group}"' in (d / "metrics.jsonl").read_text() for d in trial_dirs)
                for group in ("validation", "training")}
    assert [len(axes.get_lines()) for axes in visible] == [reported["validation"], reported["training"]]
