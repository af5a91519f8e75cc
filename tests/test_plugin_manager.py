"""Plugins by name: resolution, defaults, ``no:``, options, conflicts, errors that name the plugin."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hookdet import pytorch
from hookdet.markers import hookimpl
from hookdet.plugins.manager import (
    DEFAULT_PLUGINS,
    PluginError,
    PluginManager,
    installed_plugins,
)
from hookdet.plugins.selection import Launch, select_plugins
from hookdet.plugin import run_of
from tests.support.trials import OneWeightTrial

HP = {"lr": 0.1, "records": 4, "global_batch_size": 1}


def test_every_builtin_is_an_installed_entry_point() -> None:
    installed = installed_plugins()
    for name in (*DEFAULT_PLUGINS, "amp", "apex", "ddp", "horovod", "profiler"):
        assert installed[name].startswith("hookdet.plugins.builtin."), name


DEFAULTS = ["callbacks", "preemption", "metrics_log", "checkpoint", "tensorboard", "progress", "run_log"]


@pytest.mark.parametrize(
    "requested, expected",
    [
        (None, DEFAULTS),
        ([], DEFAULTS),
        (["no:progress", "no:tensorboard"], ["callbacks", "preemption", "metrics_log", "checkpoint", "run_log"]),
        # pytest's -p: a bare name adds to the defaults, exactly as +name does
        (["mlflow"], [*DEFAULTS, "mlflow"]),
        (["+hook_timing", "no:progress"], ["callbacks", "preemption", "metrics_log", "checkpoint", "tensorboard", "run_log",
                                          "hook_timing"]),
        (["amp", "+hook_timing"], [*DEFAULTS, "amp", "hook_timing"]),
        (["checkpoint"], DEFAULTS),
        # the one spelling for "exactly these"
        ({"only": ["checkpoint", "amp"]}, ["checkpoint", "amp"]),
        ({"only": []}, []),
    ],
)
def test_resolve_plugin_list_names(requested: Any, expected: list) -> None:
    assert list(select_plugins(requested).names) == expected


def test_the_selection_keeps_what_no_removed_and_whether_it_was_exact() -> None:
    selection = select_plugins(["amp", "no:progress"])
    assert selection.removed == frozenset({"progress"}) and not selection.exact
    assert "amp" in selection and "progress" not in selection
    assert select_plugins({"only": ["amp"]}).exact


def test_unknown_plugin_lists_installed_ones() -> None:
    manager = PluginManager()
    with pytest.raises(PluginError) as error:
        manager.load_all(["tensorbored"])
    message = str(error.value)
    assert "unknown plugin 'tensorbored'" in message
    assert "tensorboard" in message and "checkpoint" in message


def test_only_listed_plugins_are_imported() -> None:
    code = (
        "import sys\n"
        "from hookdet.plugins.manager import PluginManager\n"
        "PluginManager().load_all(['metrics_log'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('hookdet.plugins.builtin.')))\n"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    imported = eval(output)
    assert "hookdet.plugins.builtin.metrics_log" in imported
    assert "hookdet.plugins.builtin.amp" not in imported and "hookdet.plugins.builtin.ddp" not in imported


def test_plugin_config_reaches_options_and_is_refused_by_plugins_without_options() -> None:
    class WithOptions:
        def __init__(self, options: dict) -> None:
            self.options = options

    class WithoutOptions:
        pass

    manager = PluginManager({"with": {"level": 3}, "without": {"level": 3}})
    assert manager.register("with", WithOptions).options == {"level": 3}
    with pytest.raises(PluginError, match="plugin 'without' takes no plugin_config options"):
        manager.register("without", WithoutOptions)


def test_declared_conflict_is_refused_naming_both() -> None:
    class Left:
        conflicts_with = ("right",)

    class Right:
        pass

    manager = PluginManager()
    manager.register("left", Left)
    with pytest.raises(PluginError, match="plugins 'left' and 'right' cannot run together"):
        manager.register("right", Right)


def test_exception_in_a_plugin_names_plugin_and_hook(tmp_path: Path) -> None:
    class Broken:
        @hookimpl
        def on_validation_end(self, metrics: dict) -> None:
            raise ZeroDivisionError("boom")

    with pytorch.init(hparams=HP, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path) as context:
        run_of(context).plugins.register("broken", Broken())
        with pytest.raises(PluginError, match=r"plugin 'broken' failed in hook on_validation_end: ZeroDivisionError\('boom'\)"):
            pytorch.Trainer(OneWeightTrial(context), context).fit(max_length=pytorch.Batch(2))


def test_exception_in_a_callback_comes_out_as_the_callback_raised_it(tmp_path: Path) -> None:
    """The callbacks plugin called user code: the error is the user's, not a PluginError."""
    class Failing(pytorch.PyTorchCallback):
        def on_training_start(self) -> None:
            raise RuntimeError("callback trouble")

    with pytorch.init(hparams=HP, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path) as context:
        trial = OneWeightTrial(context)
        trial.build_callbacks = lambda: {"failing": Failing()}  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="^callback trouble$") as raised:
            pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(2))
        assert not isinstance(raised.value, PluginError)


def test_trial_errors_are_not_blamed_on_plugins(tmp_path: Path) -> None:
    class Wrapping:
        @hookimpl(wrapper=True)
        def hookdet_train_batch(self, trial: Any, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            return (yield)

    class FailingTrial(OneWeightTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            raise KeyError("the trial's own bug")

    with pytorch.init(hparams=HP, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path) as context:
        run_of(context).plugins.register("wrapping", Wrapping())
        with pytest.raises(KeyError, match="the trial's own bug"):
            pytorch.Trainer(FailingTrial(context), context).fit(max_length=pytorch.Batch(2))


def test_trial_switches_a_plugin_on_by_name(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path) as context:
        assert run_of(context).plugins.get("metrics_log") is None
        plugin = run_of(context).plugins.load("metrics_log")
        assert run_of(context).plugins.get("metrics_log") is plugin
        assert run_of(context).plugins.load("metrics_log") is plugin


def test_trace_logs_every_hook_with_plugin_and_time(tmp_path: Path) -> None:
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        "from hookdet import pytorch\n"
        "from tests.support.trials import OneWeightTrial\n"
        f"hp = {HP!r}\n"
        f"with pytorch.init(hparams=hp, exp_conf={{'plugins': {{'only': ['metrics_log']}}}}, run_dir={str(tmp_path)!r}) as c:\n"
        "    pytorch.Trainer(OneWeightTrial(c), c).fit(max_length=pytorch.Batch(2))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "HOOKDET_TRACE": "1", "PYTHONPATH": str(Path(__file__).parent.parent)},
        check=True,
    )
    lines = [line for line in result.stdout.splitlines() if "hook hookdet_report_metrics" in line]
    assert lines and "[metrics_log]" in lines[0] and lines[0].rstrip().endswith("ms")


def test_misspelt_hook_name_is_refused() -> None:
    class Misspelt:
        @hookimpl
        def hookdet_repot_metrics(self, run: Any, group: str, steps_completed: int, metrics: dict) -> None:
            """Never called: the hook is hookdet_report_metrics."""

    manager = PluginManager()
    with pytest.raises(PluginError, match="plugin 'misspelt' does not match hookdet's hooks.*hookdet_repot_metrics"):
        manager.register("misspelt", Misspelt)
    assert manager.get("misspelt") is None


def test_trial_switches_a_plugin_on_through_the_public_call(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path) as context:
        plugin = context.experimental.use_plugin("metrics_log")
        assert run_of(context).plugins.get("metrics_log") is plugin


@pytest.mark.parametrize(
    "requested, launch, expected",
    [
        (None, Launch(world_size=2), [*DEFAULTS, "ddp"]),
        (None, Launch(world_size=2, horovod=True), [*DEFAULTS, "horovod"]),
        (["horovod"], Launch(world_size=2), [*DEFAULTS, "horovod"]),
        (["no:ddp"], Launch(world_size=2), DEFAULTS),
        ({"only": ["checkpoint"]}, Launch(world_size=2), ["checkpoint"]),
        ({"only": ["ddp", "checkpoint"]}, Launch(world_size=2), ["ddp", "checkpoint"]),
        (None, Launch(), DEFAULTS),
    ],
)
def test_the_launch_adds_a_distributed_plugin_unless_the_file_says_otherwise(requested: Any, launch: Launch, expected: list) -> None:
    assert list(select_plugins(requested, launch).names) == expected


def test_the_launch_is_read_from_torchrun_and_horovodrun_variables() -> None:
    assert Launch.from_environment({}) == Launch()
    assert Launch.from_environment({"WORLD_SIZE": "4"}) == Launch(world_size=4)
    assert Launch.from_environment({"HOROVOD_SIZE": "2", "WORLD_SIZE": "1"}) == Launch(world_size=2, horovod=True)
    assert select_plugins(["horovod"]).launcher == "horovodrun" and select_plugins(None).launcher == "torchrun"
