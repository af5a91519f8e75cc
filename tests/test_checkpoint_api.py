"""Using checkpoints outside training: rebuild the trial, build its context, export weights."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
from torch import nn

from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import lookup as lookup
from hookdet import pytorch
from hookdet.cli import commands as cli
from hookdet.checkpoints.api import CheckpointLoadContext, load_trial_from_checkpoint_path
from hookdet.plugin import run_of
from tests.support import hookdet_process
from tests.support.resume_trials import GANTrial, RegressionTrial, run_spec

REPO = Path(__file__).resolve().parents[1]
HPARAMS = {"records": 32, "global_batch_size": 8, "lr": 0.05, "shuffle": True, "hidden": 12}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """A finished RegressionTrial run and a finished GANTrial run, with their final weights."""
    root = tmp_path_factory.mktemp("trained")
    spec = {"max_batches": 4, "validation_period": 2, "reporting_period": 2}
    regression = run_spec({**spec, "trial": "tests.support.resume_trials:RegressionTrial", "hparams": HPARAMS, "run_dir": str(root / "reg")})
    gan = run_spec({**spec, "trial": "tests.support.resume_trials:GANTrial", "hparams": HPARAMS, "run_dir": str(root / "gan")})
    return {
        "regression_dir": lookup.resolve_checkpoint_dir(root / "reg"),
        "regression_run": root / "reg",
        "regression_models": regression["models"],
        "gan_dir": lookup.resolve_checkpoint_dir(root / "gan"),
        "gan_models": gan["models"],
    }


def assert_same_weights(module: nn.Module, expected: Dict[str, torch.Tensor]) -> None:
    state = module.state_dict()
    assert sorted(state) == sorted(expected)
    assert all(torch.equal(state[key], expected[key]) for key in expected)


def test_load_trial_rebuilds_the_recorded_class_with_its_weights(trained: Dict[str, Any]) -> None:
    trial = load_trial_from_checkpoint_path(str(trained["regression_dir"]))
    assert type(trial) is RegressionTrial
    assert isinstance(trial.context, CheckpointLoadContext)
    assert trial.context.get_hparam("hidden") == 12  # hparams from the checkpoint's metadata
    assert trial.context.get_experiment_config()["searcher"]["metric"] == "validation_loss"
    assert_same_weights(trial.model, trained["regression_models"][0])
    x = torch.randn(5, 4)
    trial.model.eval()
    reference = nn.Sequential(nn.Linear(4, 12), nn.ReLU(), nn.Dropout(0.0), nn.Linear(12, 1))
    reference.load_state_dict(trained["regression_models"][0])
    assert torch.equal(trial.model(x), reference.eval()(x))


def test_load_trial_from_a_run_directory_and_with_two_models(trained: Dict[str, Any]) -> None:
    trial = load_trial_from_checkpoint_path(str(trained["regression_run"]))
    assert_same_weights(trial.model, trained["regression_models"][0])
    gan = load_trial_from_checkpoint_path(str(trained["gan_dir"]))
    assert type(gan) is GANTrial
    assert_same_weights(gan.generator, trained["gan_models"][0])
    assert_same_weights(gan.critic, trained["gan_models"][1])


class TrialWithExtraArguments(RegressionTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext, note: str, scale: float = 1.0) -> None:
        super().__init__(context)
        self.note, self.scale = note, scale


def test_explicit_trial_class_kwargs_and_torch_load_kwargs(trained: Dict[str, Any]) -> None:
    trial = load_trial_from_checkpoint_path(
        str(trained["regression_dir"]),
        trial_class=TrialWithExtraArguments,
        trial_kwargs={"note": "eval", "scale": 2.0},
        torch_load_kwargs={"weights_only": True, "mmap": True},
    )
    assert (trial.note, trial.scale) == ("eval", 2.0)
    assert_same_weights(trial.model, trained["regression_models"][0])


def test_deprecated_torch_load_keywords_warn_and_cannot_be_mixed(trained: Dict[str, Any]) -> None:
    with pytest.warns(FutureWarning, match="torch_load_kwargs"):
        trial = load_trial_from_checkpoint_path(str(trained["regression_dir"]), map_location="cpu")
    assert_same_weights(trial.model, trained["regression_models"][0])
    with pytest.raises(ValueError, match="not both"):
        load_trial_from_checkpoint_path(
            str(trained["regression_dir"]), torch_load_kwargs={"map_location": "cpu"}, map_location="cpu"
        )


class NarrowTrial(RegressionTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        run_of(context).hparams["hidden"] = 5
        super().__init__(context)


def test_a_trial_that_does_not_fit_the_checkpoint_is_refused(trained: Dict[str, Any]) -> None:
    with pytest.raises(fmt.CheckpointError, match=r"(?s)model 0 does not match NarrowTrial's: .*size mismatch for 0.weight"):
        load_trial_from_checkpoint_path(str(trained["regression_dir"]), trial_class=NarrowTrial)
    with pytest.raises(fmt.CheckpointError, match="holds 2 model\\(s\\) but RegressionTrial wraps 1"):
        load_trial_from_checkpoint_path(str(trained["gan_dir"]), trial_class=RegressionTrial)


def test_checkpoint_load_context_builds_a_trial_directly() -> None:
    """Determined's documented use: CheckpointLoadContext(hparams, exp_conf), then the trial."""
    context = pytorch.CheckpointLoadContext(
        hparams={**HPARAMS, "dropout": 0.5}, exp_conf={"searcher": {"name": "single", "metric": "loss"}}
    )
    trial = RegressionTrial(context)
    assert context.get_hparam("dropout") == 0.5 and context.get_initial_batch() == 0
    assert context.get_experiment_config()["searcher"]["metric"] == "loss"
    assert context.unwrapped_models == [trial.model] and len(context.optimizers) == 1
    defaults = pytorch.CheckpointLoadContext()
    assert defaults.get_hparams() == {} and defaults.distributed.size == 1


def test_export_writes_a_bare_state_dict_plain_pytorch_loads(trained: Dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "model.pt"
    completed = hookdet_process.run("export", trained["regression_dir"], out, cwd=REPO, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "wrote model 0's state_dict" in completed.stdout
    model = nn.Sequential(nn.Linear(4, 12), nn.ReLU(), nn.Dropout(0.0), nn.Linear(12, 1))
    model.load_state_dict(torch.load(out, weights_only=True))
    assert_same_weights(model, trained["regression_models"][0])
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no partial file left


def test_export_of_a_second_model_and_a_missing_one(
    trained: Dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "critic.pt"
    assert cli.main(["export", str(trained["gan_dir"]), str(out), "--model-index", "1"]) == 0
    critic = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Dropout(0.25), nn.Linear(8, 1))
    critic.load_state_dict(torch.load(out, weights_only=True))
    assert_same_weights(critic, trained["gan_models"][1])
    assert cli.main(["export", str(trained["gan_dir"]), str(tmp_path / "x.pt"), "--model-index", "2"]) == 2
    assert "holds 2 model(s); there is no model 2" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()


def test_export_refuses_a_corrupt_checkpoint(trained: Dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(trained["regression_dir"], copy)
    state_file = copy / fmt.STATE_FILE
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_file.write_bytes(bytes(data))
    assert cli.main(["export", str(copy), str(tmp_path / "x.pt")]) == 2
    assert "fails its xxh3_128 check" in capsys.readouterr().err


def test_a_checkpoint_id_is_read_by_export_and_load_as_by_resume_and_an_unknown_one_says_where_it_looked(
    trained: Dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint id of the user's index (what ``--resume`` accepts) names the same checkpoint
    to ``hookdet export`` and ``load_trial_from_checkpoint_path``, from any directory."""
    from hookdet.checkpoints import user_index

    monkeypatch.chdir(tmp_path)
    storage_id = trained["regression_dir"].name
    assert user_index.lookup(storage_id) is not None
    out = tmp_path / "by-id.pt"
    assert cli.main(["export", storage_id, str(out)]) == 0, capsys.readouterr().err
    model = nn.Sequential(nn.Linear(4, 12), nn.ReLU(), nn.Dropout(0.0), nn.Linear(12, 1))
    model.load_state_dict(torch.load(out, weights_only=True))
    assert_same_weights(model, trained["regression_models"][0])
    assert_same_weights(load_trial_from_checkpoint_path(storage_id).model, trained["regression_models"][0])
    capsys.readouterr()
    assert cli.main(["export", "no-such-checkpoint-id", str(tmp_path / "x.pt")]) == 2
    told = capsys.readouterr().err
    assert f"no such run directory or checkpoint directory in {tmp_path}" in told, told
    assert f"this user's checkpoint index ({user_index.index_dir()})" in told, told
    assert not (tmp_path / "x.pt").exists()
