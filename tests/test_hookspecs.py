"""The hook catalogue: every spec is documented, grouped, and fires in a real run."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Dict

import torch

import pytest

import hookdet.plugin
from hookdet import pytorch
from hookdet.plugins import hookspecs
from hookdet.markers import hookimpl
from hookdet.plugins.selection import DEFAULT_PROVIDERS, PRECISION_FOR_CALL
from hookdet.plugins.manager import PluginError, installed_plugins
from hookdet.plugins.builtin.callbacks import LIFECYCLE_METHODS
from hookdet.plugin import Precision, run_of
from tests.support.hook_recorder import SPEC_NAMES, HookRecorder
from tests.support.trials import OneWeightTrial


def test_every_spec_has_a_docstring() -> None:
    for name in SPEC_NAMES:
        assert inspect.getdoc(getattr(hookspecs, name)), f"{name} is undocumented"


def test_every_spec_appears_in_the_one_loop_map() -> None:
    """The order is said once, in docs/hooks.md's map, which names every hook."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "hooks.md").read_text()
    loop_map = page.split("## Where each hook fires", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    for name in SPEC_NAMES:
        assert f"{name}(" in loop_map, f"{name} is missing from the map in docs/hooks.md"


def test_every_spec_says_whether_it_observes_or_may_change_what_it_gets() -> None:
    """Composer's rule: each spec ends with exactly one of **Observes**, **May change** (and
    what), **Provides**."""
    for name in SPEC_NAMES:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        roles = [role for role in ("**Observes**", "**May change**", "**Provides**") if role in doc]
        assert len(roles) == 1 and doc.splitlines()[-1].startswith(roles[0]), (name, roles)


def test_lifecycle_hooks_are_exactly_the_callback_methods() -> None:
    lifecycle = {name for name in SPEC_NAMES if not name.startswith("hookdet_")}
    assert lifecycle == set(LIFECYCLE_METHODS)
    for name in lifecycle:
        spec_parameters = list(inspect.signature(getattr(hookspecs, name)).parameters)
        callback_parameters = list(inspect.signature(getattr(pytorch.PyTorchCallback, name)).parameters)[1:]
        assert spec_parameters == ["run", *callback_parameters], name


def test_every_lifecycle_hook_reaches_implementations_with_and_without_run(tmp_path: Path) -> None:
    """pluggy passes each implementation only the arguments it names: a plugin's hook that takes
    ``run`` gets the run; a Determined-shaped one without it works unchanged."""
    seen: Dict[str, Any] = {}

    class WithRun:
        @hookimpl
        def on_validation_end(self, run: Any, metrics: Any) -> None:
            seen["with_run"] = run

        @hookimpl
        def on_trial_shutdown(self, run: Any) -> None:
            seen["shutdown"] = run

    class WithoutRun:
        @hookimpl
        def on_validation_end(self, metrics: Any) -> None:
            seen["without_run"] = dict(metrics)

    with pytorch.init(hparams={"lr": 0.1, "records": 4, "global_batch_size": 1}, exp_conf={"plugins": {"only": []}},
                      run_dir=tmp_path, plugins=[WithRun(), WithoutRun()]) as context:
        pytorch.Trainer(OneWeightTrial(context), context).fit(max_length=pytorch.Batch(2))
        run = hookdet.plugin.run_of(context)
    assert seen["with_run"] is run and seen["shutdown"] is run
    assert set(seen["without_run"]) == {"validation_loss"}


def test_per_batch_hooks_are_specs() -> None:
    assert set(hookspecs.PER_BATCH_HOOKS) <= set(SPEC_NAMES)
    assert set(hookspecs.CHIEF_ONLY_HOOKS) <= set(SPEC_NAMES)


def test_every_spec_fires(tmp_path: Path) -> None:
    """A fit, a checkpoint, a resume and a warm start with a plugin that implements every hook
    fire them all."""
    hparams: Dict[str, Any] = {"lr": 0.1, "records": 4, "global_batch_size": 1}
    exp_conf = {"hyperparameters": hparams, "plugins": {"only": ["callbacks", "checkpoint", "metrics_log"]}}
    warm_conf = dict(exp_conf, searcher={"source_checkpoint_uuid": str(tmp_path / "first")})
    fired = set()
    for run_dir, resume, conf in ((tmp_path / "first", None, exp_conf), (tmp_path / "second", tmp_path / "first", exp_conf),
                                  (tmp_path / "warm", None, warm_conf)):
        recorder = HookRecorder()
        with pytorch.init(hparams=hparams, exp_conf=conf, run_dir=run_dir, plugins=[recorder]) as context:
            trial = OneWeightTrial(context)
            pytorch.Trainer(trial, context).fit(
                max_length=pytorch.Batch(4 if resume is None else 6),
                validation_period=pytorch.Batch(2),
                latest_checkpoint=None if resume is None else str(resume),
            )
        fired.update(recorder.names())
        assert isinstance(trial.model.weight, torch.Tensor)
    expected = set(SPEC_NAMES) - set(TRIAL_API_PROVIDERS)
    assert fired >= expected, f"never fired: {sorted(expected - fired)}"


#: Provider hooks only the trial's own calls reach, or only a plugin of the trial's (a
#: precision) answers (fired by the test below).
TRIAL_API_PROVIDERS = (
    "hookdet_make_precision",
    "hookdet_set_profiler",
    "hookdet_make_tensorboard_writer",
    "hookdet_resume_point",
)


class RecordingPrecision(Precision):
    """A precision that records Determined's mixed-precision switches and changes nothing."""

    name = "AnswersTheTrialApi"

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def use_amp(self, context: Any) -> None:
        self.calls.append("use_amp")

    def wrap_scaler(self, context: Any, scaler: Any) -> Any:
        self.calls.append("wrap_scaler")
        return scaler

    def configure_apex_amp(self, context: Any, models: Any, optimizers: Any, **arguments: Any) -> Any:
        self.calls.append(("configure_apex_amp", arguments))
        return models, optimizers

    def autocast_forward_pass(self, context: Any, module: Any) -> Any:
        self.calls.append("autocast_forward_pass")
        return module


class AnswersTheTrialApi:
    """Answers every provider hook of the trial API, and gives the run's precision, so no
    built-in is loaded for them."""

    def __init__(self) -> None:
        self.calls: list = []
        self.writer = object()
        self.precision = RecordingPrecision(self.calls)

    @hookimpl
    def hookdet_make_precision(self, run: Any) -> Any:
        return self.precision

    @hookimpl
    def hookdet_set_profiler(self, context: Any, args: Any, kwargs: Any) -> bool:
        self.calls.append(("hookdet_set_profiler", tuple(args), dict(kwargs)))
        return True

    @hookimpl
    def hookdet_make_tensorboard_writer(self, run: Any) -> Any:
        self.calls.append("hookdet_make_tensorboard_writer")
        return self.writer

    @hookimpl
    def hookdet_resume_point(self, run: Any, checkpoint: str) -> int:
        self.calls.append(("hookdet_resume_point", checkpoint))
        return 7


#: ``configure_apex_amp``'s parameters after models and optimizers, with Determined's defaults.
APEX_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(pytorch.PyTorchTrialContext.configure_apex_amp).parameters.items()
    if name not in ("self", "models", "optimizers")
}


def test_every_trial_api_call_is_a_provider_hook(tmp_path: Path) -> None:
    """The context reaches plugins only through hooks (and the precision one of them gives): a
    plugin answering them replaces amp, apex, the profiler, TensorBoard's writer and the resume
    point, and none of those loads."""
    provider = AnswersTheTrialApi()
    exp_conf = {"plugins": {"only": []}}
    with pytorch.init(hparams={"lr": 0.1}, exp_conf=exp_conf, run_dir=tmp_path, plugins=[provider]) as context:
        run = run_of(context)
        run.resume_from = "some-checkpoint"
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        context.experimental.use_amp()
        assert context.wrap_scaler(scaler) is scaler
        assert context.configure_apex_amp(model, optimizer, opt_level="O2") == (model, optimizer)
        context.set_profiler(record_shapes=True)
        assert context.autocast_forward_pass(model) is model
        assert context.get_tensorboard_writer() is provider.writer
        assert context.get_enable_tensorboard_logging()
        assert context.get_initial_batch() == 7
        loaded = set(run.plugins.named_plugins())
    assert provider.calls == [
        "use_amp",
        "wrap_scaler",
        # Determined's named parameters, every one passed on (opt_level as given).
        ("configure_apex_amp", dict(APEX_DEFAULTS, opt_level="O2")),
        ("hookdet_set_profiler", (), {"record_shapes": True}),
        "autocast_forward_pass",
        "hookdet_make_tensorboard_writer",
        ("hookdet_resume_point", "some-checkpoint"),
    ]
    assert loaded == {"AnswersTheTrialApi"}, "a built-in was loaded although a plugin answered"


def test_a_trial_api_call_loads_the_builtin_provider_unless_removed(tmp_path: Path) -> None:
    with pytorch.init(hparams={"lr": 0.1}, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path / "a") as context:
        context.experimental.use_amp()
        assert "amp" in run_of(context).plugins.named_plugins()
    with pytorch.init(hparams={"lr": 0.1}, exp_conf={"plugins": ["no:amp"]}, run_dir=tmp_path / "b") as context:
        with pytest.raises(PluginError, match=r"plugin 'amp' is needed here but the experiment file removes it \(no:amp\)"):
            context.experimental.use_amp()


def test_every_provider_with_a_builtin_answer_names_an_installed_plugin() -> None:
    installed = installed_plugins()
    for hook_name, plugin_name in DEFAULT_PROVIDERS.items():
        assert hook_name in SPEC_NAMES and getattr(hookspecs, hook_name).hookdet_spec["firstresult"], hook_name
        assert plugin_name in installed, plugin_name
        assert hook_name in hookspecs.TRIAL_API_HOOKS, hook_name
    for call, plugin_name in PRECISION_FOR_CALL.items():
        assert callable(getattr(Precision, call)) and plugin_name in installed, call
