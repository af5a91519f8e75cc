"""``hookdet run`` / ``plugins`` / ``export`` as a user runs them, and bad input, each with one message."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any, List

import pytest
import torch

from hookdet.runs.metrics import read_reports
from hookdet.cli.commands import main
from tests.support import hookdet_process

REPO = Path(__file__).resolve().parent.parent
DETERMINED_STYLE = Path(__file__).parent / "fixtures" / "determined_style"


def hookdet(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run the installed ``hookdet`` console script in a child process (cold: the test is about
    the installed entry point)."""
    return hookdet_process.run(*args, cwd=cwd, timeout=timeout, entry_point=True)


@pytest.mark.slow
def test_determined_trial_runs_through_hookdet_run(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(DETERMINED_STYLE, model_dir)
    result = hookdet("run", "const.yaml", "--run-dir", str(tmp_path / "run"), cwd=model_dir)
    assert result.returncode == 0, result.stderr
    assert "cluster-only fields ignored when running locally: environment" in result.stderr
    assert "completed after 48 batches" in result.stdout
    records = read_reports(tmp_path / "run")
    validations = [r for r in records if r["group"] == "validation"]
    assert [r["steps_completed"] for r in validations] == [16, 32, 48]
    assert validations[-1]["metrics"]["accuracy"] > 0.5
    assert json.loads((tmp_path / "run" / "config.json").read_text())["entrypoint"] == "model_def:MNistTrial"


def test_determined_trial_runs_through_trainer_fit(tmp_path: Path) -> None:
    sys.path.insert(0, str(DETERMINED_STYLE))
    try:
        import model_def
    finally:
        sys.path.remove(str(DETERMINED_STYLE))
    from hookdet import pytorch

    hparams = {"learning_rate": 1.0, "global_batch_size": 32, "n_filters1": 8, "n_filters2": 16, "dropout1": 0.25, "dropout2": 0.5}
    with pytorch.init(hparams=hparams, exp_conf={"plugins": {"only": ["callbacks"]}}, run_dir=tmp_path) as context:
        trial = model_def.MNistTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Epoch(1), validation_period=pytorch.Epoch(1))
    assert trial.epoch_counter.epochs == 1
    assert context.current_train_batch() == 15


def test_plugins_command_lists_plugins_and_hooks(capsys: pytest.CaptureFixture) -> None:
    assert main(["plugins"]) == 0
    output = capsys.readouterr().out
    assert "checkpoint (default)\n  from: hookdet.plugins.builtin.checkpoint:CheckpointPlugin" in output
    assert "hookdet_save_checkpoint" in output and "metrics_log (default)" in output
    # every plugin says what it takes: its declared options with defaults, none, or its own checks
    progress = output[output.index("progress (default)\n"):].split("\n")[:5]
    assert progress[3:] == ["  options:", "    log_every_s: float = 30.0  # seconds between progress lines when stderr is not a terminal"]
    callbacks = output[output.index("callbacks (default)\n"):].split("\n")[:4]
    assert callbacks[3] == "  options: none"
    assert "not declared" not in output  # every installed plugin declares its options or takes none
    ddp = output[output.index("ddp\n"):output.index("hook_timing\n")]
    assert "    timeout_seconds: Optional[float] = None  # the process group's collective timeout" in ddp
    assert "    find_unused_parameters: Any = False  # DistributedDataParallel's" in ddp


def test_export_writes_a_bare_state_dict(tmp_path: Path) -> None:
    from hookdet import pytorch
    from tests.support.trials import OneWeightTrial

    hparams = {"lr": 0.1, "records": 4, "global_batch_size": 1}
    with pytorch.init(hparams=hparams, exp_conf={"plugins": {"only": ["checkpoint"]}}, run_dir=tmp_path / "run") as context:
        trial = OneWeightTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(3))
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "weights.pt")]) == 0
    plain = torch.nn.Linear(1, 1, bias=False)
    plain.load_state_dict(torch.load(tmp_path / "weights.pt", weights_only=True))
    assert torch.equal(plain.weight, trial.model.weight)


# ---------------------------------------------------------------------------------------------
# Bad input: one clear message naming the culprit, exit status 2
# ---------------------------------------------------------------------------------------------

TRIAL_TEMPLATE = '''
import torch
from hookdet import pytorch

class Trial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(1, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def _data(self):
        return torch.utils.data.TensorDataset(torch.ones(8, 1), torch.ones(8, 1))

    def build_training_data_loader(self):
        return pytorch.DataLoader(self._data(), batch_size=2)

    def build_validation_data_loader(self):
        return pytorch.DataLoader(self._data(), batch_size=2)

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
'''

CONFIG_TEMPLATE = """\
entrypoint: {module}:Trial
hyperparameters:
  global_batch_size: 2
searcher:
  name: single
  max_length:
    batches: 4
plugins: {{only: [callbacks, checkpoint, metrics_log]}}
"""


def run_cli(tmp_path: Path, trial_source: str = TRIAL_TEMPLATE, config: str = CONFIG_TEMPLATE, edit: Any = None) -> List[str]:
    """Write a trial module and config, run ``hookdet run`` in-process; return stderr lines."""
    module = f"trial_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(trial_source))
    text = config.format(module=module)
    if edit is not None:
        text = edit(text)
    (tmp_path / "exp.yaml").write_text(text)
    return [str(tmp_path / "exp.yaml"), "--run-dir", str(tmp_path / "run")]


def expect_error(capsys: pytest.CaptureFixture, args: List[str], *fragments: str) -> str:
    assert main(["run", *args]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("hookdet: error: ") and "\n" not in error, error
    for fragment in fragments:
        assert fragment in error, error
    return error


def test_malformed_yaml_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = run_cli(tmp_path, edit=lambda text: text + "searcher: [unclosed\n")
    expect_error(capsys, args, "exp.yaml:10:1: malformed YAML", "started on line 9")


def test_unknown_field_suggests_the_right_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = run_cli(tmp_path, edit=lambda text: text.replace("max_length:", "max_lenght:"))
    expect_error(capsys, args, "exp.yaml:6", "max_lenght", "did you mean 'max_length'")


def test_a_refusal_is_recorded_where_the_starter_asked(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``HOOKDET_OUTCOME_FILE``: how the command ended, as a record (its state and status, the
    line it said and whose error it was), which a search's worker reads instead of the log."""
    import os

    from hookdet.launch import outcome

    args = run_cli(tmp_path, edit=lambda text: text.replace("max_length:", "max_lenght:"))
    monkeypatch.setenv(outcome.OUTCOME_FILE_ENV, str(tmp_path / "outcome.json"))
    line = expect_error(capsys, args, "max_lenght")
    recorded = outcome.read(tmp_path / "outcome.json")
    assert recorded == outcome.Outcome(state="failed", exit_code=2, rank=None, pid=os.getpid(),
                                       error=line[len("hookdet: error: "):], error_by="input")


def test_a_run_records_its_state_and_the_checkpoint_it_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that trains records ``completed`` with the newest checkpoint it left and its
    batches (the run's own ``run.json`` names the same checkpoint); a trial that raises records
    ``failed``, the line said, and that the error was the user's."""
    import json
    import os

    from hookdet.launch import outcome

    record = tmp_path / "outcome.json"
    monkeypatch.setenv(outcome.OUTCOME_FILE_ENV, str(record))
    assert main(["run", *run_cli(tmp_path)]) == 0
    ended = outcome.read(record)
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())
    assert ended is not None and run_json["latest_checkpoint"]
    assert (ended.state, ended.exit_code, ended.error, ended.batches, ended.pid) == ("completed", 0, None, 4, os.getpid())
    assert ended.checkpoint == run_json["latest_checkpoint"]

    failing = TRIAL_TEMPLATE.replace("        x, y = batch\n        loss", "        raise ValueError('no batches today')\n        loss")
    failed_dir = tmp_path / "failing"
    failed_dir.mkdir()
    assert main(["run", *run_cli(failed_dir, trial_source=failing)]) == 1
    ended = outcome.read(record)
    assert ended is not None and (ended.state, ended.exit_code, ended.error_by) == ("failed", 1, "user")
    assert ended.error == "the trial raised ValueError: no batches today (traceback above)"
    assert ended.checkpoint is None and ended.batches == 0


def test_unknown_plugin_lists_installed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = run_cli(tmp_path, edit=lambda text: text.replace("metrics_log]", "metricslog]"))
    expect_error(capsys, args, "unknown plugin 'metricslog' (did you mean 'metrics_log'?)",
                 "installed plugins:", "metrics_log")


def test_entrypoint_that_does_not_import(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = run_cli(tmp_path, trial_source="import not_a_module_anywhere\n")
    expect_error(capsys, args, "exp.yaml: entrypoint", "cannot import module", "not_a_module_anywhere")


def test_entrypoint_naming_a_missing_class(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = run_cli(tmp_path, edit=lambda text: text.replace(":Trial", ":Trail"))
    expect_error(capsys, args, "has no 'Trail'")


@pytest.mark.parametrize("which", ["neither", "both"])
def test_trial_must_override_exactly_one_evaluate_method(tmp_path: Path, capsys: pytest.CaptureFixture, which: str) -> None:
    source = TRIAL_TEMPLATE
    if which == "neither":
        source = source.replace("def evaluate_batch", "def not_evaluate_batch")
    else:
        source += "\n    def evaluate_full_dataset(self, data_loader):\n        return {}\n"
    expect_error(capsys, run_cli(tmp_path, trial_source=source), f"overrides {which} of evaluate_batch and evaluate_full_dataset")


def test_train_batch_returning_the_wrong_type(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = TRIAL_TEMPLATE.replace('return {"loss": loss}', "return [loss]")
    expect_error(capsys, run_cli(tmp_path, trial_source=source), "train_batch must return a dict of metrics or a loss tensor, got list")


def test_metric_that_is_not_json_serialisable(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = TRIAL_TEMPLATE.replace(
        'return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}',
        'return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y), "names": {"a", "b"}}',
    )
    expect_error(capsys, run_cli(tmp_path, trial_source=source), "names")


def test_plain_torch_dataloader_needs_the_opt_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = TRIAL_TEMPLATE.replace(
        "return pytorch.DataLoader(self._data(), batch_size=2)\n\n    def build_validation",
        "return torch.utils.data.DataLoader(self._data(), batch_size=2)\n\n    def build_validation",
    )
    expect_error(capsys, run_cli(tmp_path, trial_source=source), "build_training_data_loader",
                 "you can disable this check by calling context.experimental.disable_dataset_reproducibility_checks()")
    opted_out = source.replace(
        "self.context = context\n", "self.context = context\n        context.experimental.disable_dataset_reproducibility_checks()\n"
    )
    opted_dir = tmp_path / "opted"
    opted_dir.mkdir()
    assert main(["run", *run_cli(opted_dir, trial_source=opted_out)]) == 0


def test_bad_input_loses_nothing_already_saved(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A run that fails at its final validation keeps the checkpoints it already wrote."""
    source = TRIAL_TEMPLATE.replace(
        "    def evaluate_batch(self, batch):\n",
        "    def evaluate_batch(self, batch):\n        if self.context.current_train_batch() >= 3:\n            return {'bad': object()}\n",
    )
    args = run_cli(tmp_path, trial_source=source, edit=lambda t: t + "min_checkpoint_period:\n  batches: 2\n")
    expect_error(capsys, args, "bad")
    checkpoints = [p for p in (tmp_path / "run" / "checkpoints").iterdir() if (p / "metadata.json").exists()]
    # The end's checkpoint period (batch 4) is written before the final validation, as Determined
    # orders them, so it too survives the failure. Its write finishes in the background after the
    # failure, with no retention applied, so the checkpoint at batch 2 stays too.
    steps = sorted(json.loads((path / "metadata.json").read_text())["steps_completed"] for path in checkpoints)
    assert steps == [2, 4]


def test_only_the_users_own_files_count_as_user_frames() -> None:
    """The trimmed traceback starts at the first frame of user code: not hookdet's, pluggy's,
    the standard library's, an installed package's, or the environment's console script."""
    import json as stdlib_module

    import pluggy

    from hookdet.cli import failure_report
    from hookdet.plugins import monitor

    assert monitor.is_user_frame(__file__)
    for internal in (failure_report.__file__, pluggy.__file__, stdlib_module.__file__, torch.__file__,
                     str(Path(sys.prefix) / "bin" / "hookdet"), "<frozen runpy>"):
        assert not monitor.is_user_frame(internal), internal


# ---------------------------------------------------------------------------------------------
# User code is user code: a callback's error is reported as train_batch's is
# ---------------------------------------------------------------------------------------------

RAISING_CALLBACK = '''

class Raising(pytorch.PyTorchCallback):
    def on_validation_end(self, metrics):
        raise ValueError("the callback fails on purpose")


def build_callbacks(self):
    return {"raising": Raising()}


Trial.build_callbacks = build_callbacks
'''


@pytest.mark.parametrize("where", ["train_batch", "callback"])
def test_an_error_in_user_code_shows_the_users_frames_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture, where: str
) -> None:
    """An exception from a ``PyTorchCallback`` (which the callbacks plugin calls) is the user's,
    as one from ``train_batch`` is: the user's frames, one closing line, exit 1; not a plugin's
    failure (exit 2, no traceback)."""
    if where == "callback":
        source, raising_line = TRIAL_TEMPLATE + RAISING_CALLBACK, 'raise ValueError("the callback fails on purpose")'
    else:
        raising_line = 'raise ValueError("train_batch fails on purpose")'
        source = TRIAL_TEMPLATE.replace("        x, y = batch\n        loss", f"        {raising_line}\n        x, y = batch\n        loss")
    assert main(["run", *run_cli(tmp_path, trial_source=source)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last, hookdet's frames left out):", lines
    assert raising_line in [line.strip() for line in lines], lines
    assert not any("hookdet/" in line or "pluggy" in line for line in lines[:-1]), lines
    assert lines[-1].startswith("hookdet: error: the trial raised ValueError: "), lines
    assert "plugin" not in lines[-1]


def test_a_callbacks_error_leaves_trainer_fit_as_the_users_exception(tmp_path: Path) -> None:
    """Through the Trainer API the callback's own exception comes out of ``fit``, as from
    Determined: a script's ``except ValueError`` still catches it."""
    module = f"trial_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(TRIAL_TEMPLATE + RAISING_CALLBACK))
    sys.path.insert(0, str(tmp_path))
    try:
        trial_class = __import__(module).Trial
        from hookdet import pytorch

        with pytorch.init(exp_conf={"plugins": {"only": ["callbacks"]}}, run_dir=tmp_path / "run") as context:
            trainer = pytorch.Trainer(trial_class(context), context)
            with pytest.raises(ValueError, match="the callback fails on purpose"):
                trainer.fit(max_length=pytorch.Batch(2))
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("command", [["plugins"], ["search", "preview", "examples/digits/adaptive.yaml"]])
def test_output_cut_short_by_its_reader_ends_quietly(command: List[str]) -> None:
    """``hookdet plugins | head -1``: the closed pipe ends the command as it ends a Unix tool
    (status 141, 128 + SIGPIPE), with no traceback and no "a bug" line."""
    executable = Path(sys.executable).with_name("hookdet")
    process = subprocess.Popen([str(executable), *command], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader is gone before the first line is written
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 141, stderr
    assert stderr == ""


def test_an_int_metric_past_int64_is_reported_as_a_float(tmp_path: Path) -> None:
    """A Python int is a number however large: 10**30 (past int64, which numpy cannot hold as
    an integer) is averaged and reported as a float, as JSON reads it, not refused."""
    args = run_cli(tmp_path, trial_source=TRIAL_TEMPLATE.replace('return {"loss": loss}',
                                                                 'return {"loss": loss, "big": 10**30}'))
    assert main(["run", *args]) == 0
    reports = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["metrics"]["big"] for r in reports if r["group"] == "training"] == [1e30]
