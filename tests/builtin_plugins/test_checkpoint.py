"""The checkpoint plugin: what a checkpoint holds, what it refuses, and what retention keeps.

Everything trains for real, in this process, with tiny trials; checkpoints are real directories.
Retention is checked against Determined's documented rule (``save_trial_latest``,
``save_trial_best``, ``save_experiment_best``, ``searcher.metric``/``smaller_is_better``) and
``Trainer.fit``'s ``checkpoint_policy`` (``best``: after a validation better than every earlier
one; ``all``: after every validation; ``none``: never because of a validation, but still at
``checkpoint_period``, on a stop and at the end of training).
"""
from __future__ import annotations

import json
import pickletools
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch
from torch import nn

from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import lookup as lookup
from hookdet import pytorch
from hookdet.checkpoints.retention import checkpoints_to_delete
from hookdet.trial_api.cluster_info import activated, local_cluster_info
from hookdet.config import parse_experiment_config
from hookdet.markers import hookimpl
from hookdet.plugin import run_of
from tests.support.resume_trials import RegressionTrial, run_spec

SPEC: Dict[str, Any] = {
    "trial": "tests.support.resume_trials:RegressionTrial",
    "hparams": {"records": 32, "global_batch_size": 8, "lr": 0.05, "shuffle": True},
    "max_batches": 6,
    "validation_period": 2,
    "reporting_period": 2,
}


def checkpoint_steps(checkpoints_dir: Path) -> List[int]:
    """Batches trained of every checkpoint in a storage directory, sorted."""
    return sorted(metadata["steps_completed"] for _, metadata in lookup.find_checkpoints(checkpoints_dir))


def checkpoint_by_steps(checkpoints_dir: Path, steps: int) -> Path:
    (path,) = [path for path, metadata in lookup.find_checkpoints(checkpoints_dir) if metadata["steps_completed"] == steps]
    return path


# ---------------------------------------------------------------------------------------------
# What a checkpoint holds
# ---------------------------------------------------------------------------------------------


def test_checkpoint_contents_need_no_unpickling(tmp_path: Path) -> None:
    """Every global the pickle references is torch's or OrderedDict: ``weights_only`` loads
    it, and torch's own audit finds nothing unsafe."""
    result = run_spec({**SPEC, "hparams": {**SPEC["hparams"], "stateful": True, "scheduler": "epoch"}, "run_dir": str(tmp_path)})
    directory = lookup.resolve_checkpoint_dir(tmp_path)
    state_file = directory / fmt.STATE_FILE
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(state_file)) == []
    with zipfile.ZipFile(state_file) as archive:
        (pickle_name,) = [name for name in archive.namelist() if name.endswith("/data.pkl")]
        ops = list(pickletools.genops(archive.read(pickle_name)))
    referenced = {arg for op, arg, _ in ops if op.name == "GLOBAL"}
    assert not any(op.name in ("STACK_GLOBAL", "INST", "OBJ") for op, _, _ in ops)
    assert referenced and all(name.split(" ")[0] in ("torch", "torch._utils") or name == "collections OrderedDict" for name in referenced), referenced

    state = torch.load(state_file, weights_only=True)
    assert set(state) == {
        "models_state_dict", "optimizers_state_dict", "lr_schedulers_state_dict", "callbacks",
        "plugins", "trial_state", "rng_state",
    }
    assert set(state["callbacks"]) == {"recorder", "stateful"}
    assert state["callbacks"]["stateful"]["batches_seen"] == 6
    assert state["trial_state"]["batches_trained"] == 6
    assert state["trial_state"]["latest_checkpoint"] == directory.name == result["latest_checkpoint"]
    assert len(state["rng_state"]) == 1 and set(state["rng_state"][0]) >= {"python", "numpy", "torch"}
    metadata = fmt.verify(directory)
    assert metadata["trial_class"] == "tests.support.resume_trials:RegressionTrial"
    assert metadata["steps_completed"] == 6 and metadata["hparams"]["lr"] == 0.05
    # The callback's value is Determined's (averaged in float32); the reports' in float64.
    assert metadata["validation_metric"] == pytest.approx(result["validations"][-1]["validation_loss"], rel=1e-6)


class WrapInDataParallel:
    """A plugin that wraps every model the way a distribution plugin does (DataParallel adds
    the same ``module.`` prefix to state_dict keys as DistributedDataParallel)."""

    @hookimpl
    def hookdet_wrap_model(self, model: nn.Module, context: Any, options: Dict[str, Any]) -> nn.Module:
        return nn.DataParallel(model.to(context.device))


def test_wrapped_models_are_saved_unwrapped(tmp_path: Path) -> None:
    hparams = {**SPEC["hparams"]}
    exp_conf = {"hyperparameters": hparams, "plugins": {"only": ["callbacks", "checkpoint"]}}
    with pytorch.init(hparams=hparams, exp_conf=exp_conf, run_dir=tmp_path) as context:
        run_of(context).plugins.register("wrap_in_data_parallel", WrapInDataParallel())
        trial = RegressionTrial(context)
        assert isinstance(trial.model, nn.DataParallel)
        assert all(key.startswith("module.") for key in trial.model.state_dict())
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(2))
        trained = {key[len("module."):]: value.clone() for key, value in trial.model.state_dict().items()}
    saved = fmt.load_state(lookup.resolve_checkpoint_dir(tmp_path))["models_state_dict"][0]
    assert sorted(saved) == sorted(trained) and not any(key.startswith("module.") for key in saved)
    bare = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.0), nn.Linear(16, 1))
    bare.load_state_dict(saved)
    assert all(torch.equal(bare.state_dict()[key], trained[key].cpu()) for key in trained)


def test_gradients_are_saved_inside_an_aggregation_window_only(tmp_path: Path) -> None:
    config = {"optimizations": {"aggregation_frequency": 2}}
    odd = run_spec({**SPEC, "config": config, "hparams": {**SPEC["hparams"], "stop_at": 3}, "run_dir": str(tmp_path / "odd")})
    even = run_spec({**SPEC, "config": config, "hparams": {**SPEC["hparams"], "stop_at": 4}, "run_dir": str(tmp_path / "even")})
    assert odd["batches_trained"] == 3 and even["batches_trained"] == 4
    mid_window = fmt.load_state(lookup.resolve_checkpoint_dir(tmp_path / "odd"))
    (grads,) = mid_window["gradients"]  # one rank
    assert sorted(grads[0]) == ["0.bias", "0.weight", "3.bias", "3.weight"]
    assert all(grad.abs().sum() > 0 for grad in grads[0].values())
    assert "gradients" not in fmt.load_state(lookup.resolve_checkpoint_dir(tmp_path / "even"))


# ---------------------------------------------------------------------------------------------
# What a checkpoint refuses, and what is left afterwards
# ---------------------------------------------------------------------------------------------


class UnsaveableCallback(pytorch.PyTorchCallback):
    def __init__(self) -> None:
        self.calls = 0

    def state_dict(self) -> Dict[str, Any]:
        self.calls += 1
        import numpy as np

        return {"fine": 1} if self.calls == 1 else {"history": np.arange(3)}


class TrialWithBadCallback(RegressionTrial):
    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        return {**super().build_callbacks(), "history": UnsaveableCallback()}


def test_unsaveable_callback_state_is_one_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    spec = {**SPEC, "trial": f"{__name__}:TrialWithBadCallback", "run_dir": str(tmp_path), "checkpoint_policy": "all"}
    with pytest.raises(fmt.CheckpointError) as raised:
        run_spec(spec)
    message = str(raised.value)
    assert "checkpoint['callbacks']['history']['history'] is a numpy.ndarray" in message
    checkpoints = tmp_path / "checkpoints"
    assert checkpoint_steps(checkpoints) == [2]  # the first checkpoint, intact
    fmt.verify(checkpoint_by_steps(checkpoints, 2))
    assert [p.name for p in checkpoints.iterdir() if p.name.startswith(".")] == []  # no litter


class RegressionTrialWithTwoModels(RegressionTrial):
    """Same class name as a checkpoint's trial, different structure."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.extra = context.wrap_model(nn.Linear(2, 2))


RegressionTrialWithTwoModels.__qualname__ = "RegressionTrial"


@pytest.fixture
def trained_run(tmp_path: Path) -> Path:
    """A run directory with checkpoints at batches 2, 4 and 6 (policy all, keep everything)."""
    config = {"checkpoint_storage": {"type": "directory", "container_path": str(tmp_path / "run" / "checkpoints"),
                                     "save_trial_latest": 10}}
    run_spec({**SPEC, "config": config, "checkpoint_policy": "all", "run_dir": str(tmp_path / "run")})
    assert checkpoint_steps(tmp_path / "run" / "checkpoints") == [2, 4, 6]
    return tmp_path / "run"


def resume(run_dir: Path, target: Path, **spec_overrides: Any) -> Dict[str, Any]:
    return run_spec({**SPEC, "run_dir": str(run_dir.parent / "resumed"), "resume": str(target), **spec_overrides})


def test_a_checkpoint_of_another_trial_class_is_refused(trained_run: Path) -> None:
    newest = checkpoint_by_steps(trained_run / "checkpoints", 6)
    with pytest.raises(fmt.CheckpointError) as raised:
        resume(trained_run, newest, trial="tests.support.resume_trials:GANTrial", hparams={**SPEC["hparams"]})
    assert (
        f"checkpoint {newest} was written by trial class tests.support.resume_trials:RegressionTrial, "
        "not tests.support.resume_trials:GANTrial" in str(raised.value)
    )
    fmt.verify(newest)  # untouched


def test_mismatched_shapes_are_refused_saying_what_differs(trained_run: Path) -> None:
    newest = checkpoint_by_steps(trained_run / "checkpoints", 6)
    with pytest.raises(fmt.CheckpointError) as raised:
        resume(trained_run, newest, hparams={**SPEC["hparams"], "hidden": 8})
    message = str(raised.value)
    assert "model 0 (Sequential) does not match the trial's" in message
    assert "size mismatch for 0.weight" in message and "torch.Size([16, 4])" in message and "torch.Size([8, 4])" in message


def test_a_different_number_of_models_is_refused_before_anything_is_applied(
    trained_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    newest = checkpoint_by_steps(trained_run / "checkpoints", 6)
    with pytest.raises(fmt.CheckpointError, match=r"holds 1 model state\(s\) but RegressionTrial wraps 2"):
        resume(trained_run, newest, trial=f"{__name__}:RegressionTrialWithTwoModels")
    assert "same class name, other module" in caplog.text


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "delete_metadata"])
def test_a_damaged_checkpoint_is_refused_naming_the_newest_intact_one(trained_run: Path, damage: str) -> None:
    checkpoints = trained_run / "checkpoints"
    newest, intact = checkpoint_by_steps(checkpoints, 6), checkpoint_by_steps(checkpoints, 4)
    state_file = newest / fmt.STATE_FILE
    if damage == "flip_byte":
        data = bytearray(state_file.read_bytes())
        data[len(data) // 2] ^= 0x10
        state_file.write_bytes(bytes(data))
        reason = "state_dict.pth fails its xxh3_128 check"
    elif damage == "truncate":
        state_file.write_bytes(state_file.read_bytes()[:1000])
        reason = "truncated"
    else:
        (newest / fmt.METADATA_FILE).unlink()
        reason = "no metadata.json"
    with pytest.raises(fmt.CheckpointError) as raised:
        resume(trained_run, newest)
    message = str(raised.value)
    assert reason in message and f"the newest intact checkpoint is {intact} (batch 4)" in message
    # Pointing at the run directory resumes from that intact checkpoint instead.
    resumed = resume(trained_run, trained_run)
    assert resumed["startup"] == {"first_batch_idx": 4, "checkpoint_uuid": intact.name}


def test_an_unknown_storage_id_is_a_clear_error(tmp_path: Path) -> None:
    run_spec({**SPEC, "run_dir": str(tmp_path)})
    with pytest.raises(fmt.CheckpointError, match=r"cannot resume from 'no-such-id': no such run directory or checkpoint directory in .*, and no checkpoint with that id in this user's checkpoint index or in local directory"):
        run_spec({**SPEC, "run_dir": str(tmp_path), "resume": "no-such-id"})
    with pytest.raises(fmt.CheckpointError, match="cannot resume: .*/nowhere does not exist"):
        run_spec({**SPEC, "run_dir": str(tmp_path), "resume": str(tmp_path / "nowhere")})


# ---------------------------------------------------------------------------------------------
# Retention and checkpoint policy
# ---------------------------------------------------------------------------------------------

#: The validation metric reported after batch 1, 2, ..., 6.
METRICS = [5.0, 3.0, 4.0, 1.0, 2.0, 6.0]


class ScriptedMetricTrial(pytorch.PyTorchTrial):
    """Validates to a scripted metric (``METRICS[batches - 1]``) and records how many
    checkpoints the storage holds at the start of every batch."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(2, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
        self.stored_during_training: List[int] = []

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.ones(12, 2)), batch_size=2)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.ones(2, 2)), batch_size=2)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        self.stored_during_training.append(len(run_of(self.context).storage.list_ids()))
        loss = self.model(batch[0]).pow(2).mean()
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_full_dataset(self, data_loader: Any) -> Dict[str, Any]:
        return {"validation_loss": METRICS[run_of(self.context).state.batches_trained - 1]}


def run_scripted(
    tmp_path: Path,
    policy: str,
    smaller_is_better: bool = True,
    checkpoint_period: Optional[int] = None,
    stop_at: Optional[int] = None,
    resume: bool = False,
    asynchronous: bool = True,
    **retention: int,
) -> ScriptedMetricTrial:
    """Train 6 batches validating after each; return the trial (its storage is tmp_path/ckpt)."""
    exp_conf = {
        "searcher": {"name": "single", "metric": "validation_loss", "smaller_is_better": smaller_is_better,
                     "max_length": {"batches": 6}},
        "checkpoint_storage": {"type": "directory", "container_path": str(tmp_path / "ckpt"), **retention},
        "plugins": {"only": ["checkpoint"]},
        "plugin_config": {"checkpoint": {"async": asynchronous}},
    }
    # Under hookdet run's cluster info: policy "best" is honoured (run bare, it falls back to "all").
    info = local_cluster_info(parse_experiment_config(exp_conf), slots=1)
    with activated(info), pytorch.init(exp_conf=exp_conf, run_dir=tmp_path / "run") as context:
        trial = ScriptedMetricTrial(context)
        if stop_at is not None:
            original = trial.train_batch

            def train_batch(batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
                if batch_idx + 1 == stop_at:
                    context.set_stop_requested(True)
                return original(batch, epoch_idx, batch_idx)

            trial.train_batch = train_batch  # type: ignore[method-assign]
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(6),
            validation_period=pytorch.Batch(1),
            checkpoint_period=pytorch.Batch(checkpoint_period) if checkpoint_period else None,
            checkpoint_policy=policy,
            latest_checkpoint=str(tmp_path / "ckpt") if resume else None,
        )
    return trial


@pytest.mark.parametrize(
    "retention,smaller_is_better,kept",
    [
        ({}, True, [4, 6]),  # defaults: latest 1 (batch 6) + best 1 (metric 1.0 at batch 4)
        ({"save_trial_latest": 2, "save_trial_best": 0}, True, [5, 6]),
        ({"save_trial_latest": 0, "save_trial_best": 2}, True, [4, 5]),  # 1.0 and 2.0
        ({"save_trial_latest": 1, "save_trial_best": 2}, False, [1, 6]),  # 6.0 and 5.0; 6 is latest too
        ({"save_trial_latest": 1, "save_trial_best": 1, "save_experiment_best": 3}, True, [2, 4, 5, 6]),
        ({"save_trial_latest": 0, "save_trial_best": 0}, True, []),
    ],
)
@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_retention_keeps_exactly_what_the_policy_names(
    tmp_path: Path, retention: Dict[str, int], smaller_is_better: bool, kept: List[int], asynchronous: bool
) -> None:
    trial = run_scripted(tmp_path, "all", smaller_is_better, asynchronous=asynchronous, **retention)
    assert checkpoint_steps(tmp_path / "ckpt") == kept
    # While training, the newest complete checkpoint (the resume point) always survives. Written
    # in the background, the first may still be in flight during the second batch; the second
    # checkpoint waited for it, so from the third batch on one is always there.
    first_protected = 2 if asynchronous else 1
    assert trial.stored_during_training[0] == 0
    assert min(trial.stored_during_training[first_protected:]) >= 1


@pytest.mark.parametrize(
    "policy,checkpoint_period,written",
    [
        ("all", None, [1, 2, 3, 4, 5, 6]),
        ("best", None, [1, 2, 4, 6]),  # improvements (5.0, 3.0, 1.0) and the end of training
        ("none", None, [6]),  # never because of a validation; still at the end
        ("none", 4, [4, 6]),  # ... and at checkpoint_period
    ],
)
def test_checkpoint_policy_decides_which_validations_checkpoint(
    tmp_path: Path, policy: str, checkpoint_period: Optional[int], written: List[int]
) -> None:
    run_scripted(tmp_path, policy, checkpoint_period=checkpoint_period, save_trial_latest=100)
    assert checkpoint_steps(tmp_path / "ckpt") == written


def test_checkpoint_policy_none_still_checkpoints_on_a_stop(tmp_path: Path) -> None:
    run_scripted(tmp_path, "none", stop_at=3, save_trial_latest=100)
    assert checkpoint_steps(tmp_path / "ckpt") == [3]


def test_retention_continues_across_a_resume(tmp_path: Path) -> None:
    """Checkpoints the first process wrote are deleted by the resumed one when the policy
    stops keeping them (the retention list travels in the checkpoint)."""
    run_scripted(tmp_path, "all", stop_at=3, save_trial_latest=1, save_trial_best=0)
    assert checkpoint_steps(tmp_path / "ckpt") == [3]
    run_scripted(tmp_path, "all", resume=True, save_trial_latest=1, save_trial_best=0)
    assert checkpoint_steps(tmp_path / "ckpt") == [6]


def test_retention_rule_matches_determined_on_ties_and_nan() -> None:
    saved = [("a", 2, 1.0), ("b", 4, None), ("c", 4, 1.0), ("d", 6, float("nan")), ("e", 6, 0.5)]
    # Equal batches share a rank, so "latest 1" keeps both checkpoints at batch 6.
    assert checkpoints_to_delete(saved, keep_latest=1, keep_best=0, smaller_is_better=True) == ["a", "b", "c"]
    # Metric ties go to the older checkpoint; NaN ranks after every number.
    assert checkpoints_to_delete(saved, 0, 2, True) == ["b", "c", "d"]
    assert checkpoints_to_delete(saved, 0, 4, True) == ["b"]
    assert checkpoints_to_delete(saved, 0, 1, False) == ["b", "c", "d", "e"]
    assert checkpoints_to_delete(saved, 0, 0, True, protect_newest=True) == ["a", "b", "c", "d"]
    assert checkpoints_to_delete([], 0, 0, True, protect_newest=True) == []


def test_trial_state_records_the_checkpoint_itself(tmp_path: Path) -> None:
    run_scripted(tmp_path, "none", save_trial_latest=1)
    (directory,) = [path for path, _ in lookup.find_checkpoints(tmp_path / "ckpt")]
    trial_state = fmt.load_state(directory)["trial_state"]
    assert trial_state["latest_checkpoint"] == directory.name
    assert trial_state["last_checkpoint_batch"] == 6
    assert json.loads((directory / fmt.METADATA_FILE).read_text())["uuid"] == directory.name


def test_a_resumed_run_holds_no_mapping_of_the_checkpoint_it_loaded(tmp_path: Path) -> None:
    """The checkpoint is loaded onto a memory map; the optimizer's moments (Adam) must not stay
    on it, or retention's delete of that checkpoint would free no disk space for the whole run."""
    checkpoints = tmp_path / "ckpt"
    exp_conf = {
        "hyperparameters": {"records": 64, "global_batch_size": 8, "lr": 0.01, "optimizer": "adam"},
        "checkpoint_storage": {"type": "directory", "container_path": str(checkpoints),
                               "save_trial_latest": 1, "save_trial_best": 0},
        "plugins": {"only": ["checkpoint"]},
    }

    def train(batches: int, resume: Optional[str]) -> Any:
        with pytorch.init(hparams=exp_conf["hyperparameters"], exp_conf=exp_conf, run_dir=tmp_path / "run") as context:
            trial = RegressionTrial(context)
            pytorch.Trainer(trial, context).fit(
                max_length=pytorch.Batch(batches), checkpoint_period=pytorch.Batch(4), latest_checkpoint=resume
            )
        return trial

    train(4, None)
    (first,) = [path for path, _ in lookup.find_checkpoints(checkpoints)]
    trial = train(8, str(first))
    assert not first.exists()  # retention deleted the checkpoint the run resumed from
    assert any(state for state in trial.optimizer.state.values())  # the moments live on
    maps = Path("/proc/self/maps").read_text().splitlines()
    assert [line for line in maps if str(checkpoints) in line and "(deleted)" in line] == []


def test_a_script_run_as_main_is_the_class_its_script_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``python3 train.py`` makes its trial ``__main__:MNistTrial``; a checkpoint records it as
    Determined does, ``train:MNistTrial``: the same class, no "other module" warning. Another
    script's class of the same name is a moved one (a warning); another name is refused."""
    import sys
    import types

    from hookdet.plugins.builtin.checkpoint.restore import written_by

    script = types.ModuleType("__main__")
    script.__file__ = str(tmp_path / "train.py")
    monkeypatch.setitem(sys.modules, "__main__", script)
    trial = type("MNistTrial", (), {"__module__": "__main__"})
    assert written_by("train:MNistTrial", trial) == "same"
    assert written_by("__main__:MNistTrial", trial) == "same"
    assert written_by("model_def:MNistTrial", trial) == "moved"
    assert written_by("train:OtherTrial", trial) == "other"
