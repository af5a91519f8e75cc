"""Every example under ``examples/`` trains, offline, and shows what it claims to show.

Each example is run the way its README says, shortened: ``hookdet run const.yaml`` (in process,
through the real ``hookdet.cli.commands.main``, with the experiment file rewritten into ``tmp_path`` with a
short ``searcher.max_length``) or its Python API. The assertions are about the example's point:
the LR schedule stepped per epoch, both GAN optimizers stepped in the trial's order, the custom
reducers equal scikit-learn's metrics over the whole validation set, the checkpoint holds the
callbacks' keys and files and they are read back on resume, mixed precision really ran in
reduced precision. The multi-process and subprocess runs are marked ``slow``.

Examples import their own ``model_def``/``data`` modules by those bare names (as Determined's do),
so each test purges them from ``sys.modules`` before and after, and restores ``sys.path``.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
import torch

from hookdet import pytorch
from hookdet.runs.metrics import read_reports
from hookdet.checkpoints.format import load_state, read_metadata
from hookdet.checkpoints.lookup import resolve_checkpoint_dir
from hookdet.cli.commands import load_trial_class, main
from hookdet.config import ExperimentConfig, load_experiment_config
from hookdet.markers import hookimpl
from hookdet.plugin import run_of
from tests.support.devices import AUTO_DTYPE

REPO = Path(__file__).resolve().parent.parent
#: Two ranks train on two GPUs where there are GPUs; a machine with one can run neither.
TWO_RANKS = pytest.mark.skipif(0 < torch.cuda.device_count() < 2, reason="two ranks need two GPUs")
EXAMPLES = REPO / "examples"
NEW_EXAMPLES = (
    "mnist_pytorch",
    "cifar10_pytorch",
    "gan_mnist_pytorch",
    "custom_reducers",
    "checkpoint_hooks",
    "amp_pytorch",
    "apex_pytorch",
)
# The apex plugin warns, as Determined does, that apex is deprecated; the apex example means it.
pytestmark = pytest.mark.filterwarnings("ignore:configure_apex_amp.*deprecates:FutureWarning")

ALL_EXAMPLES = sorted(path.name for path in EXAMPLES.iterdir() if (path / "const.yaml").is_file())


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def example_imports(name: str) -> Iterator[Path]:
    """Make ``examples/<name>`` importable by bare module names for the duration, then forget it."""
    directory = EXAMPLES / name
    stems = {path.stem for path in directory.glob("*.py")}
    saved_path = list(sys.path)

    def purge() -> None:
        for stem in stems:
            sys.modules.pop(stem, None)

    purge()
    sys.path.insert(0, str(directory))
    try:
        yield directory
    finally:
        sys.path[:] = saved_path
        purge()


def short_config(name: str, tmp_path: Path, file: str = "const.yaml", **overrides: Any) -> Path:
    """The example's experiment file with ``overrides`` (dotted keys) applied, written to tmp.

    Written as JSON, which is YAML 1.2, from the validated config: what ``hookdet run`` reads is
    exactly the example's file with the overrides, defaults made explicit.
    """
    config = load_experiment_config(EXAMPLES / name / file, overrides=overrides)
    path = tmp_path / f"{name}-{file}"
    path.write_text(json.dumps(config.to_dict(), indent=2))
    return path


def hookdet_run(name: str, config: Path, run_dir: Path, *extra: str) -> None:
    """``hookdet run CONFIG --model-dir examples/<name> --run-dir RUN`` in this process."""
    with example_imports(name) as directory:
        status = main(["run", str(config), "--model-dir", str(directory), "--run-dir", str(run_dir), *extra])
    assert status == 0


def validations(run_dir: Path) -> List[Dict[str, Any]]:
    return [r for r in read_reports(run_dir) if r["group"] == "validation"]


def trainings(run_dir: Path) -> List[Dict[str, Any]]:
    return [r for r in read_reports(run_dir) if r["group"] == "training"]


def latest_state(run_dir: Path) -> Dict[str, Any]:
    """The newest intact checkpoint's state dict, loaded as hookdet loads it (weights only)."""
    return load_state(resolve_checkpoint_dir(run_dir))


def fit_example(
    name: str,
    run_dir: Path,
    max_length: pytorch.TrainUnit,
    validation_period: Optional[pytorch.TrainUnit] = None,
    checkpoint_period: Optional[pytorch.TrainUnit] = None,
    latest_checkpoint: Optional[Path] = None,
    plugins: tuple = (),
    overrides: Optional[Dict[str, Any]] = None,
) -> Any:
    """Build the example's trial from its const.yaml through the Trainer API, fit, return it.

    Must run inside :func:`example_imports` for ``name``.
    """
    config = load_experiment_config(EXAMPLES / name / "const.yaml", overrides=overrides)
    trial_class = load_trial_class(config.entrypoint, EXAMPLES / name, "const.yaml")
    with pytorch.init(exp_conf=config, run_dir=run_dir, plugins=plugins) as context:
        trial = trial_class(context)
        pytorch.Trainer(trial, context).fit(
            max_length=max_length,
            validation_period=validation_period,
            checkpoint_period=checkpoint_period,
            latest_checkpoint=None if latest_checkpoint is None else str(latest_checkpoint),
        )
    return trial


def child_env() -> Dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def hookdet_executable() -> str:
    return str(Path(sys.executable).with_name("hookdet"))


# ---------------------------------------------------------------------------------------------
# Every example: a valid experiment file, a trial class, and a test-mode run
# ---------------------------------------------------------------------------------------------


def test_the_examples_of_issue_8_are_all_there() -> None:
    assert set(NEW_EXAMPLES) <= set(ALL_EXAMPLES)
    assert (EXAMPLES / "mnist_pytorch" / "trainer_api.py").is_file()


@pytest.mark.parametrize("name", ALL_EXAMPLES)
def test_experiment_files_validate_and_name_a_trial(name: str) -> None:
    """const.yaml (and distributed.yaml) load cleanly, with nothing ignored, and name a trial."""
    files = ["const.yaml"] + (["distributed.yaml"] if (EXAMPLES / name / "distributed.yaml").exists() else [])
    configs: List[ExperimentConfig] = []
    for file in files:
        config = load_experiment_config(EXAMPLES / name / file)
        assert config.ignored_fields == [], f"{name}/{file} sets cluster-only fields"
        assert config.searcher.max_length is not None
        assert config.searcher.metric
        configs.append(config)
        with example_imports(name) as directory:
            trial_class = load_trial_class(config.entrypoint, directory, file)
        assert issubclass(trial_class, pytorch.PyTorchTrial)
    if len(configs) == 2:
        const, distributed = configs
        assert distributed.resources.slots_per_trial == 2
        assert distributed.entrypoint == const.entrypoint
        assert distributed.global_batch_size == 2 * const.global_batch_size, "keep 32 records per slot"


@pytest.mark.parametrize("name", ALL_EXAMPLES)
def test_example_runs_in_test_mode(name: str, tmp_path: Path) -> None:
    """``hookdet run const.yaml --test-mode``: one batch, one validation batch, one checkpoint."""
    run_dir = tmp_path / "run"
    hookdet_run(name, EXAMPLES / name / "const.yaml", run_dir, "--test-mode")
    config = load_experiment_config(EXAMPLES / name / "const.yaml")
    assert [r["steps_completed"] for r in trainings(run_dir)] == [1]
    (validation,) = validations(run_dir)
    assert validation["steps_completed"] == 1
    assert math.isfinite(validation["metrics"][config.searcher.metric])
    metadata = read_metadata(resolve_checkpoint_dir(run_dir))
    assert metadata["steps_completed"] == 1
    assert metadata["experiment_config"]["entrypoint"] == config.entrypoint


# ---------------------------------------------------------------------------------------------
# mnist_pytorch: the experiment file, the Trainer API script, distributed
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_mnist_learns_the_digits_in_one_epoch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = short_config("mnist_pytorch", tmp_path, **{"searcher.max_length": {"epochs": 1}})
    hookdet_run("mnist_pytorch", config, run_dir)
    (validation,) = validations(run_dir)
    assert validation["steps_completed"] == 45  # 1,437 training digits in batches of 32
    assert validation["metrics"]["accuracy"] > 0.6, validation
    assert validation["metrics"]["validation_loss"] < 1.5, validation


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="cuDNN's convolutions differ run to run: tests/test_cuda.py resumes it with deterministic kernels")
def test_mnist_trainer_api_resumes_bit_for_bit(tmp_path: Path) -> None:
    """trainer_api.train: 12 batches, then resumed to 24, equals 24 batches straight through."""
    with example_imports("mnist_pytorch"):
        import trainer_api

        straight = trainer_api.train(pytorch.Batch(24), run_dir=str(tmp_path / "straight"))
        trainer_api.train(pytorch.Batch(12), run_dir=str(tmp_path / "first"))
        resumed = trainer_api.train(
            pytorch.Batch(24), run_dir=str(tmp_path / "second"), latest_checkpoint=str(tmp_path / "first")
        )
    for expected, actual in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(expected, actual)
    assert validations(tmp_path / "straight")[-1]["metrics"] == validations(tmp_path / "second")[-1]["metrics"]
    assert read_metadata(resolve_checkpoint_dir(tmp_path / "second"))["steps_completed"] == 24


@pytest.mark.slow
def test_mnist_trainer_api_script_runs_from_the_command_line(tmp_path: Path) -> None:
    script = EXAMPLES / "mnist_pytorch" / "trainer_api.py"
    result = subprocess.run(
        [sys.executable, str(script), "--batches", "6", "--run-dir", str(tmp_path / "run")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=child_env(),
    )
    assert result.returncode == 0, result.stderr
    assert [r["steps_completed"] for r in validations(tmp_path / "run")] == [6]


@pytest.mark.slow
@TWO_RANKS
def test_mnist_distributed_yaml_trains_on_two_processes(tmp_path: Path) -> None:
    """``hookdet run distributed.yaml``: torchrun with two ranks; each rank's RNG is checkpointed."""
    config = short_config("mnist_pytorch", tmp_path, "distributed.yaml", **{"searcher.max_length": {"batches": 6}})
    result = subprocess.run(
        [hookdet_executable(), "run", str(config), "--model-dir", str(EXAMPLES / "mnist_pytorch"),
         "--run-dir", str(tmp_path / "run")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=child_env(),
    )
    assert result.returncode == 0, result.stderr
    assert "completed after 6 batches" in result.stdout
    assert [r["steps_completed"] for r in validations(tmp_path / "run")] == [6]
    assert read_metadata(resolve_checkpoint_dir(tmp_path / "run"))["num_ranks"] == 2


# ---------------------------------------------------------------------------------------------
# cifar10_pytorch: an epoch-stepped LR schedule
# ---------------------------------------------------------------------------------------------


def test_cifar_learning_rate_decays_once_per_epoch(tmp_path: Path) -> None:
    """4 batches an epoch, 3 epochs: the rate trained with is lr, lr*decay, lr*decay**2."""
    run_dir = tmp_path / "run"
    config = short_config(
        "cifar10_pytorch",
        tmp_path,
        **{"searcher.max_length": {"epochs": 3}, "data.train_records": 128, "data.validation_records": 64},
    )
    hookdet_run("cifar10_pytorch", config, run_dir)
    hparams = load_experiment_config(EXAMPLES / "cifar10_pytorch" / "const.yaml").hyperparameters
    records = trainings(run_dir)
    assert [r["steps_completed"] for r in records] == [4, 8, 12]
    expected = [hparams["learning_rate"] * hparams["lr_decay"] ** epoch for epoch in range(3)]
    assert [r["metrics"]["lr"] for r in records] == pytest.approx(expected, rel=1e-9)
    assert [r["steps_completed"] for r in validations(run_dir)] == [4, 8, 12]
    (scheduler_state,) = latest_state(run_dir)["lr_schedulers_state_dict"]
    assert scheduler_state["last_epoch"] == 3
    assert records[-1]["metrics"]["loss"] < records[0]["metrics"]["loss"]


# ---------------------------------------------------------------------------------------------
# gan_mnist_pytorch: two models, two optimizers, the trial's order
# ---------------------------------------------------------------------------------------------


class OptimizerStepOrder:
    """Records which wrapped model each optimizer step belongs to (through on_before_optimizer_step)."""

    def __init__(self) -> None:
        self.steps: List[str] = []
        self.owners: Dict[int, str] = {}

    @hookimpl
    def on_before_optimizer_step(self, parameters: List[torch.nn.Parameter]) -> None:
        self.steps.append(self.owners[id(parameters[0])])


def test_gan_steps_discriminator_then_generator_every_batch(tmp_path: Path) -> None:
    recorder = OptimizerStepOrder()
    with example_imports("gan_mnist_pytorch"):
        import model_def

        original_init = model_def.GANTrial.__init__

        def init_and_label(trial: Any, context: Any) -> None:
            original_init(trial, context)
            recorder.owners.update({id(p): "generator" for p in trial.generator.parameters()})
            recorder.owners.update({id(p): "discriminator" for p in trial.discriminator.parameters()})

        model_def.GANTrial.__init__ = init_and_label
        try:
            fit_example("gan_mnist_pytorch", tmp_path / "run", pytorch.Batch(6), plugins=(recorder,))
        finally:
            model_def.GANTrial.__init__ = original_init
    assert recorder.steps == ["discriminator", "generator"] * 6
    state = latest_state(tmp_path / "run")
    assert len(state["models_state_dict"]) == 2
    generator_opt, discriminator_opt = state["optimizers_state_dict"]
    for optimizer_state in (generator_opt, discriminator_opt):
        steps = {int(param_state["step"]) for param_state in optimizer_state["state"].values()}
        assert steps == {6}, "every parameter of both optimizers took all six steps"
    (validation,) = validations(tmp_path / "run")
    for key in ("validation_loss", "g_loss", "d_real_accuracy", "d_fake_accuracy"):
        assert math.isfinite(validation["metrics"][key])


# ---------------------------------------------------------------------------------------------
# custom_reducers: a MetricReducer and a function reducer give whole-dataset metrics
# ---------------------------------------------------------------------------------------------


def expected_validation_metrics(model: torch.nn.Module, dataset: Any) -> Dict[str, float]:
    """Accuracy and per-class F1 of ``model`` on all of ``dataset``, by scikit-learn."""
    from sklearn.metrics import accuracy_score, f1_score

    images, labels = dataset.tensors
    model.eval()
    with torch.no_grad():
        predictions = model(images.to(next(model.parameters()).device)).argmax(dim=1).cpu()
    scores = f1_score(labels.numpy(), predictions.numpy(), average=None, labels=list(range(10)), zero_division=0)
    expected = {f"f1_class_{index}": float(score) for index, score in enumerate(scores)}
    expected["macro_f1"] = float(scores.mean())
    expected["exact_accuracy"] = float(accuracy_score(labels.numpy(), predictions.numpy()))
    return expected


def test_custom_reducers_equal_scikit_learn_over_the_whole_validation_set(tmp_path: Path) -> None:
    with example_imports("custom_reducers"):
        import data

        trial = fit_example("custom_reducers", tmp_path / "run", pytorch.Batch(20))
        expected = expected_validation_metrics(trial.model, data.get_dataset(train=False))
    (validation,) = validations(tmp_path / "run")
    reported = validation["metrics"]
    assert reported["exact_accuracy"] > 0.5
    for name, value in expected.items():
        assert reported[name] == pytest.approx(value, abs=1e-12), name
    (training,) = trainings(tmp_path / "run")
    assert "macro_f1" in training["metrics"] and "exact_accuracy" not in training["metrics"]


@pytest.mark.slow
@TWO_RANKS
def test_custom_reducers_combine_both_slots(tmp_path: Path) -> None:
    """Two ranks each validate half the digits; the reported metrics cover all of them."""
    config = short_config("custom_reducers", tmp_path, "distributed.yaml", **{"searcher.max_length": {"batches": 8}})
    result = subprocess.run(
        [hookdet_executable(), "run", str(config), "--model-dir", str(EXAMPLES / "custom_reducers"),
         "--run-dir", str(tmp_path / "run")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=child_env(),
    )
    assert result.returncode == 0, result.stderr
    with example_imports("custom_reducers"):
        import data

        trial = pytorch.load_trial_from_checkpoint_path(str(tmp_path / "run"))
        expected = expected_validation_metrics(trial.model, data.get_dataset(train=False))
    (validation,) = validations(tmp_path / "run")
    for name, value in expected.items():
        assert validation["metrics"][name] == pytest.approx(value, abs=1e-12), name


# ---------------------------------------------------------------------------------------------
# checkpoint_hooks: custom keys and files in, read back on resume; callback state
# ---------------------------------------------------------------------------------------------


def test_checkpoint_hooks_write_keys_and_files_and_read_them_back(tmp_path: Path) -> None:
    with example_imports("checkpoint_hooks"):
        import model_def

        first = fit_example(
            "checkpoint_hooks", tmp_path / "first", pytorch.Batch(10),
            validation_period=pytorch.Batch(5), checkpoint_period=pytorch.Batch(5),
        )
        checkpoint_dir = resolve_checkpoint_dir(tmp_path / "first")
        state = load_state(checkpoint_dir)
        assert state["class_names"] == model_def.CLASS_NAMES
        assert state["preprocessing"] == {"image_size": 28, "mean": 0.1307, "std": 0.3081}
        assert state["notes_format"] == model_def.NOTES_FORMAT
        history = state["callbacks"]["validation_history"]["history"]
        assert history == first.validation_history.history and len(history) == 2
        assert "labels.txt" in read_metadata(checkpoint_dir)["files"]
        assert (checkpoint_dir / "labels.txt").read_text().split() == model_def.CLASS_NAMES

        resumed = fit_example(
            "checkpoint_hooks", tmp_path / "second", pytorch.Batch(15),
            validation_period=pytorch.Batch(5), latest_checkpoint=tmp_path / "first",
        )
        assert resumed.notes.restored_notes == {
            "class_names": model_def.CLASS_NAMES,
            "preprocessing": model_def.preprocessing(),
            "notes_format": model_def.NOTES_FORMAT,
        }
        assert resumed.validation_history.history[:2] == history
        assert len(resumed.validation_history.history) == 3

        # Changed preprocessing: on_checkpoint_load_start refuses the checkpoint.
        model_def.data.MNIST_MEAN = 0.5
        with pytest.raises(Exception, match="preprocessed as"):
            fit_example(
                "checkpoint_hooks", tmp_path / "third", pytorch.Batch(15), latest_checkpoint=tmp_path / "first"
            )


# ---------------------------------------------------------------------------------------------
# amp_pytorch and apex_pytorch: reduced precision really runs
# ---------------------------------------------------------------------------------------------


class LayerDtypes:
    """Records the dtype of every output of the model's modules of one type while training."""

    def __init__(self, module_type: type) -> None:
        self.module_type = module_type
        self.dtypes: set = set()

    def attach(self, trial: Any) -> None:
        for module in trial.model.modules():
            if isinstance(module, self.module_type):
                module.register_forward_hook(lambda _m, _i, output: self.dtypes.add(output.dtype))


def fit_recording_dtypes(name: str, trial_attr: str, run_dir: Path, batches: int) -> tuple:
    recorder = LayerDtypes(torch.nn.Conv2d)
    with example_imports(name):
        import model_def

        trial_class = getattr(model_def, trial_attr)
        original_init = trial_class.__init__

        def init_and_attach(trial: Any, context: Any) -> None:
            original_init(trial, context)
            recorder.attach(trial)

        trial_class.__init__ = init_and_attach
        try:
            trial = fit_example(name, run_dir, pytorch.Batch(batches))
        finally:
            trial_class.__init__ = original_init
    return trial, recorder.dtypes


@pytest.mark.slow
def test_amp_example_autocasts_the_forward_pass(tmp_path: Path) -> None:
    pytest.importorskip("hookdet.plugins.builtin.amp")
    trial, dtypes = fit_recording_dtypes("amp_pytorch", "MNistAutoAMPTrial", tmp_path / "run", batches=20)
    assert dtypes == {AUTO_DTYPE}, "every convolution ran in reduced precision"
    precision = trial.context.precision
    assert run_of(trial.context).plugins.get("amp") is not None
    assert precision.name == "amp" and precision.mode == "auto" and precision.dtype == AUTO_DTYPE
    for value in trial.model.state_dict().values():
        assert value.dtype == torch.float32, "weights stay float32 under autocast"
    (validation,) = validations(tmp_path / "run")
    assert validation["metrics"]["accuracy"] > 0.4, validation


@pytest.mark.slow
def test_apex_example_runs_opt_level_o1(tmp_path: Path) -> None:
    pytest.importorskip("hookdet.plugins.builtin.apex")
    trial, dtypes = fit_recording_dtypes("apex_pytorch", "MNistApexAMPTrial", tmp_path / "run", batches=20)
    assert dtypes == {AUTO_DTYPE}, "O1 casts convolutions to reduced precision"
    apex_state = latest_state(tmp_path / "run")["plugins"]["apex"]
    assert apex_state["opt_level"] == "O1"
    assert len(apex_state["loss_scalers"]) == 1
    (validation,) = validations(tmp_path / "run")
    assert validation["metrics"]["accuracy"] > 0.4, validation
