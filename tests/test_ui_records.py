"""``hookdet ui``'s reading of run files: incremental, bounded, never outside a run directory.

The web pages are tested in a real browser (``tests/test_ui_browser.py``); here, what the server
reads: a file is read from where the last refresh stopped (never whole again), a curve keeps at
most twice its limit of points however long the run, a replaced or cut file starts over, and a
run's file that is a symlink out of the run directory reads as absent.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

from hookdet.ui.records import RunRecords
from hookdet.runs.tail import JsonLinesTail
from hookdet.ui.series import BoundedSeries


def report(batch: int, loss: float, group: str = "training") -> str:
    return json.dumps({"group": group, "steps_completed": batch, "metrics": {"loss": loss}, "time": 0.0}) + "\n"


def test_a_series_stays_bounded_and_spans_the_whole_run() -> None:
    series = BoundedSeries(limit=100)
    epochs = set()
    for batch in range(1, 100_001):
        series.add(batch, 1.0 / batch)
        assert series.kept < 200
        epochs.add(series.epoch)
    assert series.xs[0] == 1 and series.xs[-1] > 99_000  # first point kept, last stretch covered
    assert series.xs == sorted(series.xs)
    assert len(epochs) > 5  # each thinning starts a new epoch, so pages take the series anew
    if series.tail is not None:
        assert series.tail == (100_000, 1.0 / 100_000)  # the latest point is never lost
    else:
        assert series.xs[-1] == 100_000


def test_thinning_keeps_each_buckets_lowest_and_highest_point_so_no_spike_or_best_is_lost() -> None:
    import random

    generator = random.Random(3)
    series = BoundedSeries(limit=100)
    values = [1.0 / batch + generator.random() * 0.01 for batch in range(1, 50_001)]
    values[31_337], values[7_777] = 50.0, -3.0  # a spike and a dip, one report each
    for batch, value in enumerate(values, start=1):
        series.add(batch, value)
    assert series.kept <= 200 and series.xs == sorted(series.xs)
    assert max(series.ys) == 50.0 and series.xs[series.ys.index(50.0)] == 31_338
    assert min(series.ys) == -3.0 and series.xs[series.ys.index(-3.0)] == 7_778
    # every kept point is a report, at its own batch
    assert all(values[int(x) - 1] == y for x, y in zip(series.xs, series.ys))
    # the latest report is kept or is the tail: the chart reaches the end of the run
    assert (series.xs[-1] == 50_000) != (series.tail == (50_000, values[-1]))


def test_a_file_is_read_from_where_it_stopped_and_a_torn_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    seen: List[Dict[str, Any]] = []
    resets: List[int] = []
    tail = JsonLinesTail(path, seen.append, lambda: resets.append(1))
    assert not tail.refresh()  # no file yet
    path.write_text(report(1, 1.0) + report(2, 0.5))
    assert tail.refresh() and [r["steps_completed"] for r in seen] == [1, 2]
    offset = tail.offset
    with open(path, "a") as handle:
        line = report(3, 0.25)
        handle.write(line[:10])  # a writer caught mid-line
        handle.flush()
        assert tail.refresh() and len(seen) == 2
        handle.write(line[10:])
    assert tail.refresh() and [r["steps_completed"] for r in seen] == [1, 2, 3]
    assert tail.offset == offset + len(line)  # only the appended bytes were read
    assert not tail.refresh() and not resets


def test_a_replaced_or_cut_file_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(report(1, 1.0) + report(2, 0.5) + report(3, 0.25))
    records = RunRecords(tmp_path)
    records.refresh()
    assert records.series["training/loss"].xs == [1, 2, 3]
    replacement = tmp_path / "new.jsonl"
    replacement.write_text(report(1, 1.0))  # a resume dropped a killed attempt's reports
    os.replace(replacement, path)
    records.refresh()
    assert records.series["training/loss"].xs == [1] and records.resets == 1 and records.last_batch == 1


def test_a_long_run_costs_a_bounded_number_of_points(tmp_path: Path) -> None:
    with open(tmp_path / "metrics.jsonl", "w") as handle:
        for batch in range(1, 50_001):
            handle.write(report(batch, 1.0 / batch))
            if batch % 100 == 0:
                handle.write(report(batch, 2.0 / batch, group="validation"))
    records = RunRecords(tmp_path)
    records.refresh()
    assert records.last_batch == 50_000
    assert all(series.kept < 2000 for series in records.series.values())
    assert records.reports_summary().best("loss", smaller_is_better=True) == 2.0 / 50_000


def test_the_writer_keeps_a_summary_and_a_reader_reads_only_what_came_after_it(tmp_path: Path) -> None:
    """``ReportLog`` keeps ``metrics-summary.json`` equal to a fold of every report; the list's
    reader starts from it, reading only the bytes written after it; a summary of a file a resume
    replaced is not used (the file is read from its start)."""
    from hookdet.runs.metrics import ReportLog, ReportsSummary, read_reports, read_summary

    log = ReportLog(tmp_path)
    for batch in range(1, 101):
        log.append("training", batch, {"loss": 1.0 / batch}, continues_from=0)
        if batch % 10 == 0:
            log.append("validation", batch, {"loss": 2.0 / batch, "accuracy": batch / 100}, continues_from=0)
    log.close()
    folded = ReportsSummary()
    for each in read_reports(tmp_path):
        folded.take(each)
    kept = read_summary(tmp_path)
    assert kept is not None and kept.fields()["reports"] == folded.reports == 110
    assert (kept.last_batch, kept.best("loss", True), kept.best("accuracy", False)) == (100, 0.02, 1.0)
    assert kept.bytes == (tmp_path / "metrics.jsonl").stat().st_size
    # Past the summary: one more validation, written by another writer; the reader folds it in.
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write(report(101, 0.001, group="validation"))
    records = RunRecords(tmp_path)
    assert records.reports_summary().best("loss", True) == 0.001 and records.reports_summary().reports == 111
    # A summary that claims what the file does not hold is believed up to its bytes: proof that
    # the reader took it instead of reading the file again.
    claimed = dict(kept.fields(), smallest={"loss": -5.0})
    (tmp_path / "metrics-summary.json").write_text(json.dumps(claimed))
    assert RunRecords(tmp_path).reports_summary().best("loss", True) == -5.0
    # A resume replaces the file: the summary of the old one is not used.
    replacement = tmp_path / "new.jsonl"
    replacement.write_text(report(1, 1.0, group="validation"))
    os.replace(replacement, tmp_path / "metrics.jsonl")
    assert read_summary(tmp_path) is None
    assert RunRecords(tmp_path).reports_summary().best("loss", True) == 1.0


def test_a_resumed_writer_sums_up_what_the_file_keeps(tmp_path: Path) -> None:
    from hookdet.runs.metrics import ReportLog, read_summary

    first = ReportLog(tmp_path)
    for batch in range(1, 9):
        first.append("validation", batch, {"loss": float(10 - batch)}, continues_from=0)
    first.close()
    resumed = ReportLog(tmp_path)  # from batch 4: the reports after it are dropped
    resumed.append("validation", 5, {"loss": 7.5}, continues_from=4)
    resumed.close()
    kept = read_summary(tmp_path)
    assert kept is not None and (kept.reports, kept.last_batch, kept.best("loss", True)) == (5, 5, 6.0)


def test_files_that_lead_out_of_the_run_directory_read_as_absent(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "metrics.jsonl").write_text(report(1, 1.0))
    (outside / "run.json").write_text(json.dumps({"state": "completed", "secret": "outside"}))
    (outside / "rank-0.log").write_text("[2026-01-01T00:00:00] [rank=0] [stdout] a secret line\n")
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    for name in ("metrics.jsonl", "run.json"):
        (run_dir / name).symlink_to(outside / name)
    (run_dir / "logs" / "rank-0.log").symlink_to(outside / "rank-0.log")
    records = RunRecords(run_dir)
    records.refresh()
    assert records.series == {} and records.record() == {}
    assert records.new_log_lines() == 0 and list(records.log_lines) == []


def test_a_run_pages_validations_travel_once(tmp_path: Path) -> None:
    """The page says which validations it holds; an answer brings only those after them, and all
    of them again once the run's file was replaced."""
    from hookdet.ui import pages
    from hookdet.ui.catalog import Catalog

    run_dir = tmp_path / "runs" / "one"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(report(batch, 1.0 / batch, group="validation") for batch in (1, 2)))
    catalog = Catalog([tmp_path / "runs"])
    first = pages.run_updates(catalog, run_dir, {}, 0)["validations"]
    assert (first["reset"], [row["batch"] for row in first["rows"]]) == (True, [1, 2])
    with open(run_dir / "metrics.jsonl", "a") as handle:
        handle.write(report(3, 0.3, group="validation"))
    had = f"{first['epoch']}.{first['count']}"
    after = pages.run_updates(catalog, run_dir, {}, 0, had)["validations"]
    assert (after["reset"], [row["batch"] for row in after["rows"]]) == (False, [3])
    replacement = run_dir / "new.jsonl"
    replacement.write_text(report(1, 9.0, group="validation"))
    os.replace(replacement, run_dir / "metrics.jsonl")
    again = pages.run_updates(catalog, run_dir, {}, 0, f"{after['epoch']}.{after['count']}")["validations"]
    assert (again["reset"], [row["metrics"]["loss"] for row in again["rows"]]) == (True, [9.0])


def test_importance_ranks_the_searched_hyperparameters_and_leaves_out_values_the_space_does_not_name() -> None:
    from hookdet.ui.importance import importances

    space = {"lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10}, "layers": {"type": "int", "minval": 1, "maxval": 4},
             "width": 64}
    rows = [{"best": (lr - 0.01) ** 2 + layers / 1000, "hparams": {"lr": lr, "layers": layers, "width": 64, "tag": "x"}}
            for lr, layers in [(0.001, 1), (0.01, 2), (0.05, 3), (0.1, 4), (0.0005, 2), (0.02, 1), (0.003, 3), (0.07, 4)]]
    ranked = importances(space, rows, smaller_is_better=True)
    assert sorted(ranked["values"]) == ["layers", "lr"]  # neither the constant nor the unnamed "tag"
    assert abs(sum(ranked["values"].values()) - 1) < 1e-9
    assert importances({}, rows, True) == {"note": "no hyperparameter is searched"}
    assert "importance needs 3" in importances(space, rows[:2], True)["note"]


def test_the_web_view_has_importance_computed_by_a_process_of_its_own_and_asks_again() -> None:
    import time

    from hookdet.ui.importance import Computed, importances

    space = {"lr": {"type": "double", "minval": 0.0, "maxval": 1.0}, "depth": {"type": "int", "minval": 1, "maxval": 9}}
    rows = [{"best": lr * lr + depth / 100, "hparams": {"lr": lr, "depth": depth}}
            for lr, depth in [(0.1, 1), (0.5, 3), (0.9, 2), (0.3, 9), (0.7, 5), (0.2, 4)]]
    computed = Computed()
    assert computed.of(space, rows, True, "loss at best") == {"note": "Optuna's importance is being computed"}
    deadline = time.monotonic() + 120
    while "values" not in (found := computed.of(space, rows, True, "loss at best")):
        assert time.monotonic() < deadline, found
        time.sleep(0.05)
    assert found == importances(space, rows, True)  # what this process would have computed
    # New values: the last ones with a note until the next computation (at most one every 10 s) is done
    newer = computed.of(space, rows[:-1], True, "loss at best")
    assert newer["values"] == found["values"] and "being computed again" in newer["note"]
    assert computed.of(space, rows[:2], True, "loss at best") == {
        "note": "2 trials have reported the metric; importance needs 3"}
