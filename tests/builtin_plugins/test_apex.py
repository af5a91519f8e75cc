"""The ``apex`` plugin: ``configure_apex_amp`` on a machine without NVIDIA apex (torch.amp backend).

NVIDIA apex is not on PyPI and needs CUDA; this machine has neither, so these tests run the
torch.amp backend, which is what every CPU machine runs. Half precision here is bfloat16 (the
CPU default) unless a test asks for float16.
"""
from __future__ import annotations

import re
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from hookdet import pytorch
from hookdet.config import ConfigError
from hookdet.plugins.manager import PluginError
from hookdet.trial_api.trial import TrialError
from hookdet.plugin import run_of
from tests.support.amp_trials import ApexTrial, RegressionTrial, TwoLossApexTrial
from tests.support.devices import AUTO_DTYPE, CPU_ONLY
from tests.support.trials import fit

REPO = Path(__file__).resolve().parents[2]
HP = {"lr": 0.02, "records": 256, "global_batch_size": 16}


def apex_hp(**apex: Any) -> Dict[str, Any]:
    return {**HP, "apex": apex}


def same_weights(a: List[torch.Tensor], b: List[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def last_epoch_loss(trial: RegressionTrial) -> float:
    return torch.stack(trial.losses[-16:]).mean().item()


def nvidia_apex_importable() -> bool:
    try:
        from apex import amp  # noqa: F401

        return callable(getattr(amp, "initialize", None))
    except Exception:
        return False


pytestmark = [
    # Determined warns that its apex support is deprecated; the warning is tested once below.
    pytest.mark.filterwarnings("ignore:configure_apex_amp. Determined deprecates:FutureWarning"),
    pytest.mark.skipif(nvidia_apex_importable(), reason="these test the torch.amp backend"),
]


# ---------------------------------------------------------------------------------------------
# Running Determined trials without apex
# ---------------------------------------------------------------------------------------------


@CPU_ONLY
def test_a_determined_o1_trial_runs_unmodified_without_apex(tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="hookdet")
    with pytest.warns(FutureWarning, match="deprecates NVIDIA apex"):
        trial = fit(ApexTrial, apex_hp(opt_level="O1"), tmp_path, max_length=pytorch.Batch(20))
    backend_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("apex:")]
    assert backend_lines == [
        "apex: NVIDIA apex is not importable (ModuleNotFoundError: No module named 'apex'); "
        "running opt_level O1 on torch.amp: autocast bfloat16 on cpu, dynamic loss scale"
    ]
    assert trial.hidden_dtypes == [torch.bfloat16] * 20
    assert trial.output_dtypes == [torch.float32] * 20
    assert all(p.dtype == torch.float32 for p in trial.model.parameters())
    assert trial.scales_before[-1] == [2.0**16]  # no overflow: the dynamic scale holds
    assert last_epoch_loss(trial) < 0.5 * torch.stack(trial.losses[:4]).mean().item()


@pytest.mark.slow
def test_o1_o2_o3_train_to_within_5_percent_of_float32_loss(tmp_path: Path) -> None:
    """Mean training loss over the last epoch (16 batches) after 64 batches, against float32
    (measured: within 1% for bfloat16 O1, O2 and O3)."""
    reference = last_epoch_loss(fit(RegressionTrial, HP, tmp_path / "fp32", max_length=pytorch.Batch(64)))
    start = None
    for level in ("O1", "O2", "O3"):
        trial = fit(ApexTrial, apex_hp(opt_level=level), tmp_path / level, max_length=pytorch.Batch(64))
        start = start or torch.stack(trial.losses[:16]).mean().item()
        loss = last_epoch_loss(trial)
        assert abs(loss - reference) <= 0.05 * reference, (level, loss, reference)
    assert reference < 0.5 * start  # they did learn


def test_o2_keeps_float32_master_weights_and_batchnorm(tmp_path: Path) -> None:
    trial = fit(ApexTrial, apex_hp(opt_level="O2"), tmp_path, max_length=pytorch.Batch(6))
    linear, batchnorm = trial.model[0], trial.model[1]
    assert linear.weight.dtype == AUTO_DTYPE and batchnorm.weight.dtype == torch.float32
    assert batchnorm.running_mean.dtype == torch.float32
    assert trial.hidden_dtypes == [AUTO_DTYPE] * 6 and trial.output_dtypes == [torch.float32] * 6
    masters = [p for group in trial.optimizer.param_groups for p in group["params"]]
    assert all(m.dtype == torch.float32 for m in masters)
    model_params = list(trial.model.parameters())
    assert masters[0] is not model_params[0]  # the Linear weight has a separate master...
    assert masters[2] is model_params[2]  # ...batch norm's float32 weight is its own master
    for master, param in zip(masters, model_params):
        assert torch.equal(param, master.to(param.dtype))  # the model is refreshed from them
    # The masters carry precision the half-precision weights cannot hold.
    assert not torch.equal(masters[0], linear.weight.float())


def test_o3_is_pure_half_precision(tmp_path: Path) -> None:
    trial = fit(ApexTrial, apex_hp(opt_level="O3"), tmp_path, max_length=pytorch.Batch(4))
    assert all(p.dtype == AUTO_DTYPE for p in trial.model.parameters())
    assert [p for g in trial.optimizer.param_groups for p in g["params"]] == list(trial.model.parameters())
    assert not trial.context.precision.changes_steps  # loss scale 1: nothing per batch
    assert not torch.equal(trial.weights_before[0][0], trial.model[0].weight)


def test_o0_is_float32_even_for_float64_input(tmp_path: Path) -> None:
    class DoubleInput(ApexTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
            x, y = batch
            return super().train_batch((x.double(), y), epoch_idx, batch_idx)

    trial = fit(DoubleInput, apex_hp(opt_level="O0"), tmp_path, max_length=pytorch.Batch(2))
    assert trial.hidden_dtypes == [torch.float32] * 2


def test_float16_can_be_chosen_on_cpu(tmp_path: Path) -> None:
    config = {"plugin_config": {"apex": {"dtype": "float16"}}}
    trial = fit(ApexTrial, apex_hp(opt_level="O2"), tmp_path, config, max_length=pytorch.Batch(2))
    assert trial.model[0].weight.dtype == torch.float16 and trial.hidden_dtypes == [torch.float16] * 2


# ---------------------------------------------------------------------------------------------
# Loss scaling
# ---------------------------------------------------------------------------------------------


@CPU_ONLY
def test_overflow_skips_the_step_and_halves_the_dynamic_scale(tmp_path: Path) -> None:
    hp = {**apex_hp(opt_level="O1"), "batchnorm": False, "overflow_batches": [2]}
    trial = fit(ApexTrial, hp, tmp_path, max_length=pytorch.Batch(5))
    assert same_weights(trial.weights_before[2], trial.weights_before[3])
    assert not same_weights(trial.weights_before[3], trial.weights_before[4])
    assert [s[0] for s in trial.scales_before] == [2.0**16] * 3 + [2.0**15] * 2


@CPU_ONLY
def test_min_and_max_loss_scale_bound_the_dynamic_scale(tmp_path: Path) -> None:
    hp = {**apex_hp(opt_level="O2", min_loss_scale=2.0**15), "batchnorm": False, "overflow_batches": [1, 2, 3]}
    trial = fit(ApexTrial, hp, tmp_path, max_length=pytorch.Batch(5))
    assert [s[0] for s in trial.scales_before] == [2.0**16, 2.0**16, 2.0**15, 2.0**15, 2.0**15]
    capped = fit(ApexTrial, apex_hp(opt_level="O1", max_loss_scale=2.0**10), tmp_path / "cap",
                 max_length=pytorch.Batch(2))
    assert capped.scales_before[0] == [2.0**10]


def test_a_fixed_loss_scale_never_changes(tmp_path: Path) -> None:
    hp = {**apex_hp(opt_level="O1", loss_scale="128.0"), "batchnorm": False, "overflow_batches": [1]}
    trial = fit(ApexTrial, hp, tmp_path, max_length=pytorch.Batch(3))
    assert [s[0] for s in trial.scales_before] == [128.0] * 3
    # apex does not skip with a fixed scale: the overflow reaches the weights.
    assert not all(torch.isfinite(w).all() for w in trial.weights_before[2])


@CPU_ONLY
def test_num_losses_gives_each_loss_its_own_scale(tmp_path: Path) -> None:
    hp = {**apex_hp(opt_level="O1", num_losses=2), "batchnorm": False, "overflow_second_loss": [1]}
    trial = fit(TwoLossApexTrial, hp, tmp_path, max_length=pytorch.Batch(3))
    assert trial.scales_before == [[2.0**16, 2.0**16], [2.0**16, 2.0**16], [2.0**16, 2.0**15]]
    assert same_weights(trial.weights_before[1], trial.weights_before[2])  # the step was skipped
    shared = fit(TwoLossApexTrial, {**hp, "apex": {"opt_level": "O1"}}, tmp_path / "one",
                 max_length=pytorch.Batch(3))
    assert [s[0] for s in shared.scales_before] == [2.0**16, 2.0**16, 2.0**15]


# ---------------------------------------------------------------------------------------------
# Determined's rules and bad input
# ---------------------------------------------------------------------------------------------


def wrapped(context: Any) -> Any:
    model = context.wrap_model(torch.nn.Linear(2, 2))
    return model, context.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))


def test_return_shapes_follow_the_arguments(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path) as context:
        model, optimizer = wrapped(context)
        models, optimizers = [model], [optimizer]
        out_models, out_optimizers = context.configure_apex_amp(models, optimizers, opt_level="O2")
        assert out_models is models and out_optimizers is optimizers and out_models[0] is model
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path / "b") as context:
        model, optimizer = wrapped(context)
        assert context.configure_apex_amp(model, optimizer) == (model, optimizer)


def test_configuring_twice_or_wrapping_afterwards_is_refused(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path) as context:
        model, optimizer = wrapped(context)
        context.configure_apex_amp(model, optimizer, enabled=False)  # a no-op, as in Determined
        context.configure_apex_amp(model, optimizer)
        with pytest.raises(TrialError, match="please only call configure_apex_amp once"):
            context.configure_apex_amp(model, optimizer)
        with pytest.raises(TrialError, match="must call wrap_model\\(\\) before configure_apex_amp"):
            context.wrap_model(torch.nn.Linear(2, 2))
        with pytest.raises(TrialError, match="must call wrap_optimizer\\(\\) before configure_apex_amp"):
            context.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))


def test_configure_apex_amp_then_use_amp_is_refused_in_determineds_words(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path) as context:
        context.configure_apex_amp(*wrapped(context))
        for switch in (context.experimental.use_amp, lambda: context.wrap_scaler(torch.amp.GradScaler("cpu"))):
            with pytest.raises(TrialError, match="Do not mix APEX with PyTorch AMP. \\(this run's precision is 'apex'\\)"):
                switch()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"opt_level": "O4"}, ValueError, "unexpected opt_level 'O4'"),
        ({"opt_level": "O1", "cast_model_type": torch.float16}, ValueError, "cast_model_type must stay None with O1"),
        ({"opt_level": "O2", "patch_torch_functions": True}, ValueError, "patch_torch_functions=True is only valid"),
        ({"opt_level": "O1", "keep_batchnorm_fp32": True}, ValueError, "keep_batchnorm_fp32 must be None"),
        ({"opt_level": "O2", "keep_batchnorm_fp32": "yes"}, TypeError, "keep_batchnorm_fp32 must be a bool"),
        ({"opt_level": "O1", "master_weights": True}, ValueError, "master_weights makes no sense with opt_level O1"),
        ({"loss_scale": "big"}, ValueError, "loss_scale must be 'dynamic' or a positive number"),
        ({"num_losses": 0}, ValueError, "num_losses must be an integer >= 1"),
        ({"min_loss_scale": 8.0, "max_loss_scale": 4.0}, ValueError, "min_loss_scale \\(8.0\\) is above"),
        ({"cast_model_outputs": "float"}, TypeError, "cast_model_outputs must be a floating torch.dtype"),
    ],
)
def test_bad_arguments_name_the_argument(tmp_path: Path, kwargs: Dict[str, Any], error: type, match: str) -> None:
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path) as context:
        model, optimizer = wrapped(context)
        with pytest.raises(error, match=match):
            context.configure_apex_amp(model, optimizer, **kwargs)


def test_unwrapped_models_and_optimizers_are_refused(tmp_path: Path) -> None:
    with pytorch.init(hparams=HP, exp_conf={"hyperparameters": HP}, run_dir=tmp_path) as context:
        model, optimizer = wrapped(context)
        stray = torch.nn.Linear(2, 2)
        with pytest.raises(TrialError, match=r"models\[1\] was not returned by context.wrap_model"):
            context.configure_apex_amp([model, stray], optimizer)
        with pytest.raises(TrialError, match="optimizers was not returned by context.wrap_optimizer"):
            context.configure_apex_amp(model, torch.optim.SGD(stray.parameters(), lr=0.1))


@pytest.mark.parametrize(
    "options, match",
    [
        ({"backend": "cuda"}, "plugin_config.apex.backend: expected one of 'auto', 'torch' or 'apex'; got 'cuda'"),
        ({"dtype": "int8"}, "plugin_config.apex.dtype: expected one of auto, float16"),
        ({"opt_level": "O1"}, "plugin_config.apex.opt_level: unknown option 'opt_level'; known options: backend, dtype"),
    ],
)
def test_bad_settings_name_the_field(tmp_path: Path, options: Dict[str, Any], match: str) -> None:
    conf = {"hyperparameters": HP, "plugins": {"only": ["apex"]}, "plugin_config": {"apex": options}}
    with pytest.raises(ConfigError, match=re.escape(match)):
        with pytorch.init(hparams=HP, exp_conf=conf, run_dir=tmp_path):
            pass


def test_asking_for_nvidia_apex_where_it_cannot_run_says_why(tmp_path: Path) -> None:
    conf = {"hyperparameters": HP, "plugin_config": {"apex": {"backend": "apex"}}}
    with pytorch.init(hparams=HP, exp_conf=conf, run_dir=tmp_path) as context:
        with pytest.raises(PluginError, match="backend is 'apex' but NVIDIA apex is not importable"):
            context.configure_apex_amp(*wrapped(context))


# ---------------------------------------------------------------------------------------------
# Resume
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@CPU_ONLY
def test_o2_resume_in_a_new_process_is_bitwise_exact(tmp_path: Path) -> None:
    hp = {**apex_hp(opt_level="O2"), "batchnorm": False, "overflow_batches": [2]}
    straight = fit(ApexTrial, hp, tmp_path / "straight", max_length=pytorch.Batch(8))
    fit(ApexTrial, hp, tmp_path / "first", max_length=pytorch.Batch(4))
    spec = {
        "trial": "ApexTrial", "hparams": hp, "max_length": 8, "run_dir": str(tmp_path / "resumed"),
        "latest_checkpoint": str(tmp_path / "first"), "out": str(tmp_path / "resumed.pt"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    subprocess.run(
        [sys.executable, "-W", "ignore::FutureWarning", "-m", "tests.support.amp_trials", str(tmp_path / "spec.json")],
        cwd=REPO, check=True,
    )
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert resumed["batches_trained"] == 8
    for name, tensor in straight.context.unwrapped_models[0].state_dict().items():
        assert torch.equal(tensor, resumed["model"][name]), name
    mine = run_of(straight.context).plugins.get("apex").state_dict()
    theirs = resumed["plugins"]["apex"]
    assert theirs["loss_scalers"][0]["scale"].item() == mine["loss_scalers"][0]["scale"].item() == 2.0**15
    assert torch.equal(theirs["loss_scalers"][0]["growth_tracker"], mine["loss_scalers"][0]["growth_tracker"])
    masters = mine["master_weights"][0]
    assert len(masters) == 4 and all(m.dtype == torch.float32 for m in masters)
    assert all(torch.equal(a, b) for a, b in zip(masters, theirs["master_weights"][0]))
    momentum = [s["momentum_buffer"] for s in straight.optimizer.state_dict()["state"].values()]
    assert all(
        torch.equal(a, s["momentum_buffer"]) for a, s in zip(momentum, resumed["optimizer"]["state"].values())
    )
