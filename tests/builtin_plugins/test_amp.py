"""The ``amp`` plugin: ``use_amp``, ``wrap_scaler`` and ``plugins: [amp]`` on this CPU machine.

float16 autocast and ``torch.amp.GradScaler("cpu")`` both run on CPU with torch >= 2.3, so the
loss-scaling behaviour (skip on overflow, back off, grow) is tested for real here; bfloat16 is
the CPU default and needs no scaler.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

from hookdet import pytorch
from hookdet.config import ConfigError
from hookdet.plugins.builtin.amp import AmpPlugin
from hookdet.checkpoints.format import load_state
from hookdet.checkpoints.lookup import resolve_checkpoint_dir
from hookdet.plugins.manager import PluginError
from hookdet.trial_api.trial import TrialError
from hookdet.plugin import run_of
from tests.support.amp_trials import ManualScalerTrial, RegressionTrial, UseAmpAfterWrapTrial, UseAmpTrial
from tests.support.devices import AUTO_DTYPE, CPU_ONLY, DEVICE
from tests.support.trials import fit

REPO = Path(__file__).resolve().parents[2]
HP = {"lr": 0.02, "records": 256, "global_batch_size": 16}


def float16(**scaler: Any) -> Dict[str, Any]:
    """An experiment-file fragment: amp in float16 with these GradScaler settings."""
    return {"plugin_config": {"amp": {"dtype": "float16", **scaler}}}


def same_weights(a: list, b: list) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------------------------------------
# Automatic mode
# ---------------------------------------------------------------------------------------------


@CPU_ONLY
def test_use_amp_runs_the_forward_in_bfloat16_on_cpu(tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="hookdet")
    trial = fit(UseAmpTrial, HP, tmp_path, max_length=pytorch.Batch(3))
    assert trial.hidden_dtypes == [torch.bfloat16] * 3  # inside the model: autocast
    assert trial.output_dtypes == [torch.float32] * 3  # out of the model: back to float32
    assert all(p.dtype == torch.float32 for p in trial.model.parameters())
    precision = trial.context.precision
    assert precision.name == "amp" and not precision.scaler.is_enabled()
    # bfloat16 needs no loss scaling, so the context calls nothing of the precision per batch.
    assert not precision.changes_steps and not trial.context._precision_steps
    assert "autocast bfloat16 on cpu, no loss scaling" in caplog.text


def test_listing_amp_in_the_experiment_file_autocasts_an_unmodified_trial(tmp_path: Path) -> None:
    config = {"plugins": {"only": ["callbacks", "checkpoint", "amp"]}}
    trial = fit(RegressionTrial, HP, tmp_path, config, max_length=pytorch.Batch(2))
    assert trial.hidden_dtypes == [AUTO_DTYPE] * 2
    assert trial.output_dtypes == [torch.float32] * 2


def test_a_deep_copy_of_an_autocast_model_runs_its_own_weights(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path) as context:
        context.experimental.use_amp()
        model = context.wrap_model(torch.nn.Sequential(torch.nn.Linear(4, 4)))
        twin = copy.deepcopy(model)  # what torch.optim.swa_utils.AveragedModel does
        with torch.no_grad():
            twin[0].weight.zero_()
            twin[0].bias.fill_(1.0)
        hidden = []
        twin[0].register_forward_hook(lambda module, args, output: hidden.append(output.dtype))
        x = torch.randn(3, 4, device=DEVICE)
        out, twin_out = model(x), twin(x)
        assert out.dtype == twin_out.dtype == torch.float32
        assert torch.equal(twin_out, torch.ones(3, 4, device=DEVICE))
        with torch.autocast(DEVICE, dtype=AUTO_DTYPE):
            reference = model[0](x).float()
        assert torch.equal(out, reference)  # the original still runs its own weights
        assert hidden == [AUTO_DTYPE]  # the copy's layer ran under autocast


def test_float16_overflow_skips_the_step_and_backs_off_the_scale(tmp_path: Path) -> None:
    hp = {**HP, "batchnorm": False, "overflow_batches": [2]}
    trial = fit(UseAmpTrial, hp, tmp_path, float16(init_scale=2.0**8), max_length=pytorch.Batch(5))
    assert trial.hidden_dtypes == [torch.float16] * 5
    assert not math.isfinite(trial.losses[2].item())  # inf, or NaN once inf meets -inf
    before, after = trial.weights_before[2], trial.weights_before[3]
    assert same_weights(before, after), "the overflowing batch must not change the weights"
    assert not same_weights(trial.weights_before[1], before), "clean batches do step"
    assert not same_weights(after, trial.weights_before[4])
    assert [s[0] for s in trial.scales_before] == [256.0, 256.0, 256.0, 128.0, 128.0]


def test_automatic_float16_trains_bit_for_bit_as_the_plain_torch_amp_recipe(tmp_path: Path) -> None:
    """The amp precision is PyTorch's own recipe and nothing else: autocast forward (outputs
    back to float32), scaled backward, unscale, step, update, zero_grad, from the same weights
    on the same batches, overflowing ones included, gives the same weights, bit for bit."""
    hp = {**HP, "batchnorm": False, "overflow_batches": [2, 5]}
    batches = 9
    trial = fit(UseAmpTrial, hp, tmp_path, float16(init_scale=2.0**8, growth_interval=3),
                max_length=pytorch.Batch(batches))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(DEVICE)
    with torch.no_grad():
        for parameter, initial in zip(model.parameters(), trial.weights_before[0]):
            parameter.copy_(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=hp["lr"], momentum=0.5)
    scaler = torch.amp.GradScaler(DEVICE, init_scale=2.0**8, growth_interval=3)
    loader = torch.utils.data.DataLoader(trial._dataset(True), batch_size=hp["global_batch_size"])
    for _, (x, y) in zip(range(batches), loader):
        x, y = x.to(DEVICE), y.to(DEVICE)
        with torch.autocast(DEVICE, dtype=torch.float16):
            output = model(x)
        loss = torch.nn.functional.mse_loss(output.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    assert same_weights(list(model.parameters()), list(trial.model.parameters()))
    assert scaler.state_dict() == trial.context.precision.scaler.state_dict()


def test_scale_grows_after_growth_interval_clean_steps(tmp_path: Path) -> None:
    trial = fit(
        UseAmpTrial, HP, tmp_path, float16(init_scale=2.0**8, growth_interval=3),
        max_length=pytorch.Batch(8),
    )
    assert [s[0] for s in trial.scales_before] == [256.0] * 3 + [512.0] * 3 + [1024.0] * 2
    assert trial.context.precision.scaler.get_scale() == 1024.0


def test_with_gradient_aggregation_the_scale_updates_only_on_optimizer_step_batches(tmp_path: Path) -> None:
    config = {**float16(init_scale=2.0**8, growth_interval=2), "optimizations": {"aggregation_frequency": 2}}
    trial = fit(UseAmpTrial, HP, tmp_path, config, max_length=pytorch.Batch(9))
    # Steps end batches 1, 3, 5, 7: two clean steps (after batch 3) double the scale.
    assert [s[0] for s in trial.scales_before] == [256.0] * 4 + [512.0] * 4 + [1024.0]


def test_unscaled_gradients_reach_clip_grads(tmp_path: Path) -> None:
    seen = []

    class ClipTrial(UseAmpTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.context.backward(loss)
            reference = torch.autograd.grad(
                torch.nn.functional.mse_loss(self.model(x), y), self.model[3].bias
            )[0]

            def clip(parameters: Any) -> None:
                seen.append((parameters[-1].grad.clone(), reference))

            self.context.step_optimizer(self.optimizer, clip_grads=clip)
            return {"loss": loss}

    fit(ClipTrial, HP, tmp_path, float16(init_scale=2.0**10), max_length=pytorch.Batch(2))
    for grad, reference in seen:
        # Scaled by 1024 these would be ~1000x the reference; unscaled they match it closely.
        assert torch.allclose(grad, reference, rtol=2e-2, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# Manual mode
# ---------------------------------------------------------------------------------------------


def test_wrap_scaler_leaves_the_scaler_to_the_trial_and_checkpoints_it(tmp_path: Path) -> None:
    hp = {**HP, "batchnorm": False, "overflow_batches": [1], "init_scale": 2.0**8, "growth_interval": 2}
    trial = fit(ManualScalerTrial, hp, tmp_path, max_length=pytorch.Batch(5))
    precision = trial.context.precision
    assert precision.mode == "manual" and precision.scaler is trial.scaler
    assert not precision.changes_steps  # hookdet neither scales, unscales, nor updates
    # The trial's own update() ran once per batch: a second one would have raised in GradScaler.
    assert [s[0] for s in trial.scales_before] == [256.0, 256.0, 128.0, 128.0, 256.0]
    assert same_weights(trial.weights_before[1], trial.weights_before[2])
    saved = load_state(resolve_checkpoint_dir(tmp_path))["plugins"]["amp"]["scaler"]
    assert saved["scale"] == trial.scaler.get_scale() == 256.0
    assert saved["_growth_tracker"] == 1


# ---------------------------------------------------------------------------------------------
# Determined's ordering rules and bad input
# ---------------------------------------------------------------------------------------------


def test_use_amp_after_wrap_model_is_refused_as_in_determined(tmp_path: Path) -> None:
    with pytest.raises(TrialError, match="before wrap_model"):
        fit(UseAmpAfterWrapTrial, HP, tmp_path, max_length=pytorch.Batch(1))


def test_scaler_registration_happens_once(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path) as context:
        context.experimental.use_amp()
        with pytest.raises(TrialError, match="only call wrap_scaler or use_amp once"):
            context.wrap_scaler(torch.amp.GradScaler("cpu"))
        with pytest.raises(TrialError, match="only call wrap_scaler or use_amp once"):
            context.experimental.use_amp()


def test_wrap_scaler_rejects_what_is_not_a_scaler(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path) as context:
        with pytest.raises(TypeError, match="wrap_scaler takes a torch.amp.GradScaler, got a float"):
            context.wrap_scaler(1.0)


@pytest.mark.parametrize(
    "options, culprit",
    [
        ({"dtype": "float64"}, "dtype: expected one of auto, float16, fp16, half, bfloat16, bf16; got 'float64'"),
        ({"init_scale": -1}, "init_scale: must be more than 0.0; got -1"),
        ({"growth_factor": 1.0}, "growth_factor: must be more than 1.0; got 1.0"),
        ({"backoff_factor": 1.5}, "backoff_factor: must be less than 1.0; got 1.5"),
        ({"growth_interval": 0}, "growth_interval: must be at least 1; got 0"),
        ({"growth_interval": 2.5}, "growth_interval: expected a whole number; got 2.5"),
        ({"enabled": "yes"}, "enabled: expected true or false; got 'yes'"),
        ({"init_scal": 8}, "init_scal: unknown option 'init_scal'; did you mean 'init_scale'?"),
    ],
)
def test_bad_settings_name_the_field(tmp_path: Path, options: Dict[str, Any], culprit: str) -> None:
    """Declared options (``AmpPlugin.Options``): refused when the experiment is read."""
    conf = {"hyperparameters": HP, "plugins": {"only": ["amp"]}, "plugin_config": {"amp": options}}
    with pytest.raises(ConfigError) as error:
        with pytorch.init(hparams=HP, exp_conf=conf, run_dir=tmp_path):
            pass
    assert str(error.value) == f"exp_conf: plugin_config.amp.{culprit}"


def test_settings_defaults_are_gradscalers() -> None:
    plugin = AmpPlugin(options={"growth_interval": 7})
    assert plugin.settings.init_scale == torch.amp.GradScaler("cpu").get_scale()
    assert plugin.settings.growth_interval == 7


def test_disabled_amp_trains_in_float32(tmp_path: Path) -> None:
    config = {"plugin_config": {"amp": {"enabled": False}}}
    trial = fit(UseAmpTrial, HP, tmp_path, config, max_length=pytorch.Batch(2))
    assert trial.hidden_dtypes == [torch.float32] * 2


def test_amp_and_apex_listed_together_are_refused_before_training(tmp_path: Path) -> None:
    """No declared conflict: both answer ``hookdet_make_precision``, and a run has one."""
    assert not hasattr(AmpPlugin, "conflicts_with")
    conf = {"hyperparameters": HP, "plugins": {"only": ["callbacks", "amp", "apex"]}}
    with pytest.raises(PluginError, match="plugins 'amp' and 'apex' both provide the run's precision, and a run has one"):
        with pytorch.init(hparams=HP, exp_conf=conf, run_dir=tmp_path):
            pass


def test_a_second_precision_plugin_is_refused_however_it_arrives(tmp_path: Path) -> None:
    """A plugin the trial switches on (``use_plugin``) that also provides a precision is refused
    at the next thing the context asks of the precision, naming both."""
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path) as context:
        context.experimental.use_amp()
        context.experimental.use_plugin("apex")
        with pytest.raises(PluginError, match="plugins 'amp' and 'apex' both provide the run's precision"):
            context.wrap_model(torch.nn.Linear(2, 2))


def test_use_amp_then_configure_apex_amp_is_refused_in_determineds_words(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path) as context:
        context.experimental.use_amp()
        model = context.wrap_model(torch.nn.Linear(2, 2))
        optimizer = context.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        with pytest.raises(TrialError, match="Do not mix APEX with PyTorch AMP. \\(this run's precision is 'amp'"):
            context.configure_apex_amp(model, optimizer)


# ---------------------------------------------------------------------------------------------
# Resume
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_with_a_scaler_in_a_new_process_is_bitwise_exact(tmp_path: Path) -> None:
    hp = {**HP, "batchnorm": False, "overflow_batches": [1, 7]}
    config = float16(init_scale=2.0**10, growth_interval=3)
    straight = fit(UseAmpTrial, hp, tmp_path / "straight", config, max_length=pytorch.Batch(10))
    fit(UseAmpTrial, hp, tmp_path / "first", config, max_length=pytorch.Batch(4))
    spec = {
        "trial": "UseAmpTrial", "hparams": hp, "config": config, "max_length": 10,
        "run_dir": str(tmp_path / "resumed"), "latest_checkpoint": str(tmp_path / "first"),
        "out": str(tmp_path / "resumed.pt"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    subprocess.run(
        [sys.executable, "-m", "tests.support.amp_trials", str(tmp_path / "spec.json")], cwd=REPO, check=True
    )
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert resumed["batches_trained"] == 10
    for name, tensor in straight.context.unwrapped_models[0].state_dict().items():
        assert torch.equal(tensor, resumed["model"][name]), name
    momentum = [s["momentum_buffer"] for s in straight.optimizer.state_dict()["state"].values()]
    resumed_momentum = [s["momentum_buffer"] for s in resumed["optimizer"]["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(momentum, resumed_momentum))
    scaler_state = run_of(straight.context).plugins.get("amp").state_dict()
    assert scaler_state == straight.context.precision.state_dict()  # the plugin keeps its precision's
    assert resumed["plugins"]["amp"] == scaler_state
    # Neither the checkpoint's scaler (512, 2 clean steps) nor the final one is a fresh scaler's.
    assert [s[0] for s in straight.scales_before] == [1024.0, 1024.0, 512.0, 512.0, 512.0, 1024.0,
                                                      1024.0, 1024.0, 512.0, 512.0]
    assert scaler_state["scaler"]["scale"] == 512.0 and scaler_state["scaler"]["_growth_tracker"] == 2
