"""The progress plugin: tqdm bars in a real terminal (a pseudo-terminal), plain lines elsewhere."""
from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from hookdet import pytorch
from hookdet.builtin_plugins.metrics_log import read_metrics
from hookdet.builtin_plugins.progress import ProgressPlugin, format_metrics
from hookdet.plugin_manager import PluginError
from hookdet.distributed import DistributedContext
from tests.trials import OneWeightTrial, fit

REPO = Path(__file__).resolve().parents[2]
HOOKDET = Path(sys.executable).with_name("hookdet")
HP = {"lr": 0.1, "records": 8, "global_batch_size": 2}

EXPERIMENT = """
entrypoint: tests.trials:OneWeightTrial
hyperparameters: {lr: 0.1, records: 8, global_batch_size: 2}
searcher: {name: single, metric: validation_loss, max_length: {batches: 40}}
min_validation_period: {batches: 10}
scheduling_unit: 10
"""


def open_terminal(columns: int = 150) -> tuple:
    """A pseudo-terminal ``(controller_fd, terminal_fd)`` sized ``columns`` wide."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    return controller, terminal


def read_until_closed(controller: int, timeout: float = 120.0) -> str:
    """Everything written to the terminal until every writer closed it."""
    chunks: List[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], deadline - time.monotonic())
        if not ready:
            break
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    return b"".join(chunks).decode()


def write_experiment(directory: Path) -> Path:
    path = directory / "experiment.yaml"
    path.write_text(textwrap.dedent(EXPERIMENT))
    return path


def hookdet_run(experiment: Path, run_dir: Path) -> List[str]:
    return [str(HOOKDET), "run", str(experiment), "--model-dir", str(REPO), "--run-dir", str(run_dir)]


@pytest.mark.slow
def test_bars_in_a_terminal(tmp_path: Path) -> None:
    controller, terminal = open_terminal()
    process = subprocess.Popen(
        hookdet_run(write_experiment(tmp_path), tmp_path / "run"),
        stdin=terminal, stdout=terminal, stderr=terminal, cwd=tmp_path, close_fds=True,
    )
    os.close(terminal)
    screen = read_until_closed(controller)
    assert process.wait(timeout=60) == 0, screen

    redraws = screen.split("\r")
    training = [text for text in redraws if text.startswith("training:")]
    assert re.match(r"training: +0%\| +\| 0/40 ", training[0]), training[0]
    final = training[-1]
    assert re.match(r"training: 100%\|█+\| 40/40 ", final), final
    latest = {record["group"]: record["metrics"] for record in read_metrics(tmp_path / "run" / "metrics.jsonl")}
    shown = f"{format_metrics(latest['training'])} {format_metrics(latest['validation'])}]"
    assert final.rstrip().endswith(shown), final
    # The first validation has no known length; the next ones know it has 4 batches.
    validation = [text for text in redraws if text.startswith("validation:")]
    assert validation[0].startswith("validation: 0batch") and "/4 " in validation[-1]
    # A log message clears the bar (a carriage return, blanks, a carriage return), takes the whole
    # line, and the bar is redrawn below it: bars are never torn.
    saved = [line for line in screen.split("\n") if "hookdet INFO checkpoint" in line]
    assert len(saved) == 4
    for line in saved:
        assert re.search(r"\r +\r\d{4}-\d\d-\d\d [\d:,]+ hookdet INFO checkpoint [^\r]+\r$", line), line
    assert "training: batch" not in screen


@pytest.mark.slow
@pytest.mark.parametrize("log_every_s", [0, None])
def test_plain_lines_without_a_terminal(tmp_path: Path, log_every_s: Any) -> None:
    experiment = write_experiment(tmp_path)
    if log_every_s is not None:
        with experiment.open("a") as handle:
            handle.write(f"plugin_config: {{progress: {{log_every_s: {log_every_s}}}}}\n")
    result = subprocess.run(
        hookdet_run(experiment, tmp_path / "run"),
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    messages = [line.split(" hookdet INFO ", 1)[1] for line in result.stderr.splitlines() if " hookdet INFO " in line]
    reports = [line for line in messages if line.startswith(("training:", "validation:"))]
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(records) == 8
    if log_every_s is None:
        # The default (5 s) in a run of about a second: the first and the last training report,
        # and every validation.
        records = [
            record for record in records
            if record["group"] == "validation" or record["steps_completed"] in (10, 40)
        ]
    expected = [
        f"{record['group']}: batch {record['steps_completed']}/40 "
        f"({100 * record['steps_completed'] // 40}%) {format_metrics(record['metrics'])}"
        for record in records
    ]
    assert reports == expected
    assert "\r" not in result.stderr and "%|" not in result.stderr


def test_a_bad_log_every_s_is_refused_naming_the_field() -> None:
    with pytest.raises(PluginError, match=r"plugin_config\.progress\.log_every_s must be a number of seconds"):
        ProgressPlugin(options={"log_every_s": -2})
    with pytest.raises(PluginError, match="unknown option 'every'; known options: log_every_s"):
        ProgressPlugin(options={"every": 1})


class TerminalStderr:
    """``sys.stderr`` replaced by a pseudo-terminal whose output a thread collects."""

    def __init__(self) -> None:
        self.controller, terminal = open_terminal()
        self.stream = io.TextIOWrapper(os.fdopen(terminal, "wb", buffering=0), write_through=True)
        self.screen = ""
        self._reader = threading.Thread(target=self._read)
        self._reader.start()

    def _read(self) -> None:
        self.screen = read_until_closed(self.controller, timeout=60)

    def close(self) -> str:
        self.stream.close()
        self._reader.join(timeout=60)
        return self.screen


@contextlib.contextmanager
def terminal_as_stderr() -> Iterator[TerminalStderr]:
    """``sys.stderr`` is a pseudo-terminal inside the block (set in the test body: pytest puts
    its own capture back on ``sys.stderr`` between fixture setup and the test)."""
    terminal = TerminalStderr()
    saved, sys.stderr = sys.stderr, terminal.stream
    try:
        yield terminal
    finally:
        sys.stderr = saved
        terminal.close()


def test_resumed_training_bar_starts_at_the_resume_point(tmp_path: Path) -> None:
    fit(OneWeightTrial, HP, tmp_path / "first", max_length=pytorch.Batch(4))
    with terminal_as_stderr() as terminal:
        fit(OneWeightTrial, HP, tmp_path / "resumed", config={"plugins": {"only": ["callbacks", "checkpoint", "progress"]}},
            max_length=pytorch.Batch(8), latest_checkpoint=str(tmp_path / "first"))
    bars = [text for text in terminal.screen.split("\r") if text.startswith("training:")]
    assert bars and re.match(r"training: +50%\|.*\| 4/8 ", bars[0]), bars
    assert all("| 0/8 " not in bar for bar in bars)
    assert re.match(r"training: 100%\|.*\| 8/8 ", bars[-1]), bars[-1]


def test_other_ranks_show_nothing(tmp_path: Path) -> None:
    """A rank-1 process (its collectives are the identity: only its rank matters here)."""
    exp_conf = {"hyperparameters": HP, "plugins": {"only": ["progress"]}}
    with terminal_as_stderr() as terminal:
        with pytorch.init(hparams=HP, exp_conf=exp_conf, run_dir=tmp_path,
                          distributed=DistributedContext(rank=1, size=2)) as context:
            pytorch.Trainer(OneWeightTrial(context), context).fit(
                max_length=pytorch.Batch(4), validation_period=pytorch.Batch(2)
            )
    assert terminal.screen == ""


def test_the_chief_in_the_same_setting_shows_bars(tmp_path: Path) -> None:
    """The control for the test above: rank 0, same setting, the bar is there."""
    exp_conf = {"hyperparameters": HP, "plugins": {"only": ["progress"]}}
    with terminal_as_stderr() as terminal:
        with pytorch.init(hparams=HP, exp_conf=exp_conf, run_dir=tmp_path,
                          distributed=DistributedContext(rank=0, size=2)) as context:
            pytorch.Trainer(OneWeightTrial(context), context).fit(
                max_length=pytorch.Batch(4), validation_period=pytorch.Batch(2)
            )
    assert "| 4/4 " in terminal.screen


def test_format_metrics_shows_numbers_only() -> None:
    metrics = {"loss": 0.123456, "step": 7, "flag": True, "name": "x", "tiny": 1.5e-9}
    assert format_metrics(metrics) == "loss=0.1235 step=7 tiny=1.5e-09"


class PerBatchProbe(pytorch.PyTorchCallback):
    """Notes, as training starts, whether the loop will call a per-batch hook after each batch."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.per_batch_hook = None

    def on_training_start(self) -> None:
        self.per_batch_hook = self.context._run.plugins.implemented("hookdet_train_batch_end")


class ProbedTrial(OneWeightTrial):
    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        self.probe = PerBatchProbe(self.context)
        return {"probe": self.probe}


def test_no_per_batch_hook_unless_bars_are_shown(tmp_path: Path) -> None:
    config = {"plugins": {"only": ["callbacks", "progress"]}}
    plain = fit(ProbedTrial, HP, tmp_path / "plain", config=config, max_length=pytorch.Batch(2))
    with terminal_as_stderr() as terminal:
        barred = fit(ProbedTrial, HP, tmp_path / "bars", config=config, max_length=pytorch.Batch(2))
    assert (plain.probe.per_batch_hook, barred.probe.per_batch_hook) == (False, True)
    assert "| 2/2 " in terminal.screen
    assert barred.context._run.plugins.get("progress:bars") is None  # gone when the run ended
