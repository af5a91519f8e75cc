"""hook_timing: time per hook and per implementation, the trial's and the loop's share; HOOKDET_TRACE."""
from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any, Dict, Generator

import pytest

from hookdet import pytorch
from hookdet.runs.metrics import read_reports
from hookdet.markers import hookimpl
from hookdet.plugins.manager import PluginError
from hookdet.plugin import run_of
from tests.support.trials import OneWeightTrial, fit

HP = {"lr": 0.1, "records": 8, "global_batch_size": 2}
PLUGINS = ["callbacks", "metrics_log", "checkpoint", "hook_timing"]
SLEEP_AROUND_STEP = 0.002
SLEEP_IN_TRIAL = 0.05  # far above the wrapper's sleeps, even where a 2 ms sleep takes 10 (a loaded machine)


def timing_report(run_dir: Path) -> Dict[str, Any]:
    return json.loads((run_dir / "hook_timing-rank0.json").read_text())


def test_counts_every_hook_call_and_implementation(tmp_path: Path, capsys: Any) -> None:
    trial = fit(OneWeightTrial, HP, tmp_path, config={"plugins": PLUGINS}, max_length=pytorch.Batch(12),
                validation_period=pytorch.Batch(4), reporting_period=pytorch.Batch(3))
    report = timing_report(tmp_path)
    reports = read_reports(tmp_path)
    hooks = report["hooks"]

    assert hooks["hookdet_report_metrics"]["calls"] == len(reports) == 9
    assert hooks["hookdet_report_metrics"]["implementations"]["metrics_log"]["calls"] == len(reports)
    assert hooks["on_training_workload_end"]["calls"] == 6
    assert hooks["on_training_workload_end"]["implementations"]["callbacks:adapter"]["calls"] == 6
    assert hooks["hookdet_save_checkpoint"]["implementations"]["checkpoint"]["calls"] == hooks["hookdet_save_checkpoint"]["calls"] >= 1
    assert hooks["on_trial_startup"]["calls"] == hooks["on_trial_shutdown"]["calls"] == 1
    assert report["trial_methods"]["train_batch"]["calls"] == 12
    assert report["trial_methods"]["evaluate_batch"]["calls"] == 3 * 4
    for entry in hooks.values():
        for implementation in entry["implementations"].values():
            assert 0 <= implementation["total_s"]
            if entry["total_s"] is not None:
                assert implementation["total_s"] <= entry["total_s"]

    window = report["fit_window_s"]
    assert window > 0 and report["loop_s"] >= 0
    assert report["in_hooks_s"] + report["in_trial_s"] + report["loop_s"] == pytest.approx(window)
    assert report["in_trial_s"] == pytest.approx(
        sum(timing["total_s"] for timing in report["trial_methods"].values())
    )

    table = capsys.readouterr().err
    assert "hookdet hook timing (rank 0)" in table
    assert re.search(rf"fit window {window:.3f} s = hooks [\d.]+ s \([\d.]+%\) \+ trial", table)
    assert re.search(r"^hookdet_report_metrics +9 +[\d.]+ +[\d.]+$", table, re.MULTILINE)
    assert re.search(r"^  metrics_log +9 +[\d.]+ +[\d.]+$", table, re.MULTILINE)
    assert re.search(r"^trial\.train_batch +12 ", table, re.MULTILINE)

    # Everything it wrapped is put back when the run ends.
    run = run_of(trial.context)
    manager = run.plugins.pluggy_manager
    for caller in vars(manager.hook).values():
        for implementation in getattr(caller, "get_hookimpls", lambda: [])():
            assert not hasattr(implementation.function, "_hookdet_timed"), (caller.name, implementation.plugin_name)
    assert "train_batch" not in vars(trial)


class AroundTheStep:
    """A ``wrapper=True`` and an old-style ``hookwrapper=True`` implementation around each batch."""

    def __init__(self) -> None:
        self.batches = 0

    @hookimpl(wrapper=True)
    def hookdet_train_batch(self, trial: Any, batch: Any, epoch_idx: int, batch_idx: int) -> Generator:
        time.sleep(SLEEP_AROUND_STEP)
        metrics = yield
        time.sleep(SLEEP_AROUND_STEP)
        self.batches += 1
        return {**metrics, "wrapped": 1.0}

    @hookimpl(hookwrapper=True)
    def on_validation_end(self, metrics: Dict[str, Any]) -> Generator:
        time.sleep(SLEEP_AROUND_STEP)
        yield
        time.sleep(SLEEP_AROUND_STEP)


class SlowTrial(OneWeightTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        time.sleep(SLEEP_IN_TRIAL)
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_wrappers_are_timed_around_the_yield_only(tmp_path: Path) -> None:
    around = AroundTheStep()
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP, "plugins": {"only": ["metrics_log", "hook_timing"]}},
                      run_dir=tmp_path) as context:
        run_of(context).plugins.register("around", around)
        trial = SlowTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(6), validation_period=pytorch.Batch(3),
                                            reporting_period=pytorch.Batch(3))
    assert around.batches == 6
    training = [r["metrics"] for r in read_reports(tmp_path) if r["group"] == "training"]
    assert [metrics["wrapped"] for metrics in training] == [1.0, 1.0]

    report = timing_report(tmp_path)
    step = report["hooks"]["hookdet_train_batch"]
    wrapper = step["implementations"]["around"]
    assert step["calls"] == wrapper["calls"] == 6
    assert wrapper["total_s"] >= 6 * 2 * SLEEP_AROUND_STEP
    # The trial's 50 ms per batch ran inside the wrapper's yield: counted for the trial, not it.
    assert wrapper["total_s"] < report["trial_methods"]["train_batch"]["total_s"]
    assert report["trial_methods"]["train_batch"]["total_s"] >= 6 * SLEEP_IN_TRIAL
    assert step["implementations"]["hookdet.defaults"]["total_s"] >= 6 * SLEEP_IN_TRIAL
    old_style = report["hooks"]["on_validation_end"]["implementations"]["around"]
    assert old_style["calls"] == 2 and old_style["total_s"] >= 2 * 2 * SLEEP_AROUND_STEP
    # The trial ran inside a hook (the default hookdet_train_batch): not counted twice.
    assert report["in_hooks_s"] + report["in_trial_s"] <= report["fit_window_s"]


class Faulty:
    @hookimpl
    def on_training_epoch_end(self, epoch_idx: int) -> None:
        raise ValueError("broken on purpose")


def test_a_failing_plugin_is_still_named_while_timed(tmp_path: Path) -> None:
    with pytest.raises(PluginError, match=r"plugin 'faulty' failed in hook on_training_epoch_end: ValueError"):
        with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP, "plugins": {"only": ["hook_timing"]}},
                          run_dir=tmp_path) as context:
            run_of(context).plugins.register("faulty", Faulty())
            pytorch.Trainer(OneWeightTrial(context), context).fit(max_length=pytorch.Batch(8))
    assert timing_report(tmp_path)["hooks"]["on_training_epoch_end"]["implementations"]["faulty"]["calls"] == 1


def test_nothing_is_wrapped_when_the_plugin_is_not_listed(tmp_path: Path) -> None:
    trial = fit(OneWeightTrial, HP, tmp_path, config={"plugins": {"only": ["callbacks", "metrics_log"]}},
                max_length=pytorch.Batch(2))
    manager = run_of(trial.context).plugins.pluggy_manager
    implementations = [impl for caller in vars(manager.hook).values() for impl in getattr(caller, "get_hookimpls", list)()]
    assert implementations and not any(hasattr(impl.function, "_hookdet_timed") for impl in implementations)
    assert not (tmp_path / "hook_timing-rank0.json").exists()


TRACE_LINE = re.compile(r"^hook (\w+) \[([\w.:,-]+)\] (\d+\.\d{3}) ms$")


def test_hookdet_trace_logs_every_hook_call_with_its_plugins(
    tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    monkeypatch.setenv("HOOKDET_TRACE", "1")
    caplog.set_level(logging.INFO, logger="hookdet")
    fit(OneWeightTrial, HP, tmp_path, config={"plugins": {"only": ["callbacks", "metrics_log"]}},
        max_length=pytorch.Batch(8), validation_period=pytorch.Batch(4), reporting_period=pytorch.Batch(4))
    traced = [TRACE_LINE.match(record.getMessage()) for record in caplog.records if record.getMessage().startswith("hook ")]
    assert traced and all(traced), [record.getMessage() for record in caplog.records]
    calls = [(match.group(1), match.group(2).split(",")) for match in traced]
    names = [name for name, _ in calls]
    assert names[0] == "hookdet_configure" and names[-1] == "hookdet_unconfigure"
    assert names.count("on_training_start") == 1 and names.count("on_validation_start") == 2
    assert "on_training_epoch_start" not in names  # no implementation: never called, so not traced
    reports = [plugins for name, plugins in calls if name == "hookdet_report_metrics"]
    assert len(reports) == 4 and all("metrics_log" in plugins for plugins in reports)
    assert ("on_training_workload_end", ["callbacks:adapter"]) in calls


def test_hookdet_trace_is_silent_when_unset(tmp_path: Path, monkeypatch: Any, caplog: Any) -> None:
    monkeypatch.delenv("HOOKDET_TRACE", raising=False)
    caplog.set_level(logging.INFO, logger="hookdet")
    fit(OneWeightTrial, HP, tmp_path, config={"plugins": {"only": ["metrics_log"]}}, max_length=pytorch.Batch(2))
    assert not any(record.getMessage().startswith("hook ") for record in caplog.records)
