"""The migration guide's snippets run as printed.

``docs/migrating-from-determined.md`` shows a Determined user the imports, and how to continue a
checkpoint Determined wrote, from the command line and from Python. Each Python block, and the
``hookdet run ... --resume`` command of that section, runs here in a model directory laid out as
the guide says: a checkpoint the real ``determined==0.38.1`` wrote at
``./checkpoints/0a1b2c3d-...``, the trial class in ``model_def.py``, ``const.yaml`` beside it.
"""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from hookdet.runs.metrics import read_reports
from tests.test_determined_checkpoints import determined_checkpoint  # noqa: F401 - a fixture
from tests.support import hookdet_process
from tests.test_docs import CodeBlock, code_blocks

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "migrating-from-determined.md"
CHECKPOINT = "./checkpoints/0a1b2c3d-..."


def python_blocks() -> List[CodeBlock]:
    return [block for block in code_blocks(GUIDE) if block.language == "python"]


def model_directory(tmp_path: Path, checkpoint: Path) -> Path:
    """A model directory as the guide describes: the Determined checkpoint where the guide puts
    it, ``model_def.MNistTrial`` (the trial that wrote it, under the tutorial's name), and an
    experiment file that trains it to batch 7 (the checkpoint is at batch 4)."""
    directory = tmp_path / "model"
    shutil.copytree(checkpoint, directory / CHECKPOINT)
    (directory / "model_def.py").write_text("from tests.parity.trials import Continued as MNistTrial\n")
    (directory / "const.yaml").write_text(yaml.safe_dump({
        "name": "mnist", "entrypoint": "model_def:MNistTrial",
        "hyperparameters": {"global_batch_size": 4},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 7}},
        "scheduling_unit": 1,
    }))
    return directory


def guide_env(directory: Path) -> Dict[str, str]:
    """A user's shell in ``directory``: its code importable, not inside another run."""
    return {"PYTHONPATH": f"{directory}:{REPO}", "OMP_NUM_THREADS": "1",
            **{key: value for key, value in __import__("os").environ.items()
               if key not in ("PYTHONPATH", "HOOKDET_RUN_DIR", "HOOKDET_CLUSTER_INFO")}}


def run_in(directory: Path, command: List[str]) -> subprocess.CompletedProcess:
    """The guide's Python code run as typed (``python -c ...``)."""
    return subprocess.run(command, cwd=directory, env=guide_env(directory), capture_output=True, text=True, timeout=300)


def trained_batches(directory: Path) -> List[int]:
    (run_dir,) = (directory / "runs").iterdir()
    return [report["steps_completed"] for report in read_reports(run_dir) if report["group"] == "training"]


def test_the_guide_has_the_snippets_this_file_runs() -> None:
    blocks = python_blocks()
    assert len(blocks) == 2 and "import hookdet as det" in blocks[0].text and CHECKPOINT in blocks[1].text
    assert f"hookdet run const.yaml --resume {CHECKPOINT}" in GUIDE.read_text()


def test_the_imports_run_as_printed(tmp_path: Path) -> None:
    result = run_in(tmp_path, [sys.executable, "-c", python_blocks()[0].text])
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_continuing_a_determined_checkpoint_from_python_runs_as_printed(
        tmp_path: Path, determined_checkpoint: Path) -> None:  # noqa: F811
    directory = model_directory(tmp_path, determined_checkpoint)
    result = run_in(directory, [sys.executable, "-c", python_blocks()[1].text])
    assert result.returncode == 0, result.stderr[-3000:]
    assert trained_batches(directory) == [7]  # Trainer.fit reports every 100 batches, and at the end
    (run_dir,) = (directory / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["resumed_from"] == CHECKPOINT


@pytest.mark.slow
def test_continuing_a_determined_checkpoint_from_the_command_line_runs_as_printed(
        tmp_path: Path, determined_checkpoint: Path) -> None:  # noqa: F811
    directory = model_directory(tmp_path, determined_checkpoint)
    command = shlex.split(f"hookdet run const.yaml --resume {CHECKPOINT}")
    result = hookdet_process.run(*command[1:], cwd=directory, env=guide_env(directory))
    assert result.returncode == 0, result.stderr[-3000:]
    assert trained_batches(directory) == [5, 6, 7]


def test_a_trial_that_takes_more_than_the_context_is_told_to_pass_trial_kwargs(tmp_path: Path) -> None:
    """The guide's word on ``trial_kwargs``, for a trial like the Trainer API tutorial's
    ``MNistTrial(context, hparams)``: without them, a TypeError naming ``trial_kwargs``."""
    from hookdet import pytorch
    from tests.parity.trials import Continued

    class TakesHparams(Continued):
        def __init__(self, context: pytorch.PyTorchTrialContext, hparams: dict) -> None:
            super().__init__(context)

    checkpoint = tmp_path / "ckpt"
    result = hookdet_process.run("run", _tiny_experiment(tmp_path), "--run-dir", checkpoint, cwd=REPO,
                                 env=guide_env(REPO))
    assert result.returncode == 0, result.stderr[-3000:]
    with pytest.raises(TypeError, match=r"TakesHparams\(context, \*\*trial_kwargs\) does not fit its __init__ "
                                        r"\(missing a required argument: 'hparams'\); pass the arguments after "
                                        r"the context as trial_kwargs="):
        pytorch.load_trial_from_checkpoint_path(str(checkpoint), trial_class=TakesHparams)
    trial = pytorch.load_trial_from_checkpoint_path(str(checkpoint), trial_class=TakesHparams,
                                                    trial_kwargs={"hparams": {}})
    assert isinstance(trial, TakesHparams)


def _tiny_experiment(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny", "entrypoint": "tests.parity.trials:Continued",
        "hyperparameters": {"global_batch_size": 4},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 2}},
    }))
    return path
