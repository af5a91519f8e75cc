"""The progress plugin: a live view in a real terminal (a pseudo-terminal), plain lines elsewhere."""
from __future__ import annotations

import contextlib
import datetime
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
import torch

from hookdet import pytorch
from hookdet.runs.metrics import read_reports
from hookdet.plugins.builtin.progress import ProgressPlugin, format_metrics
from hookdet.metrics.live_view import format_number
from hookdet.plugins.manager import PluginError
from hookdet.plugin import RankAloneContext, run_of
from tests.test_core_loop import BUDGET_PYTHON
from tests.support.trials import OneWeightTrial, fit

REPO = Path(__file__).resolve().parents[2]
HOOKDET = Path(sys.executable).with_name("hookdet")
HP = {"lr": 0.1, "records": 8, "global_batch_size": 2}

EXPERIMENT = """
entrypoint: tests.support.trials:OneWeightTrial
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


def write_experiment(directory: Path, entrypoint: str = "tests.support.trials:OneWeightTrial") -> Path:
    path = directory / "experiment.yaml"
    path.write_text(textwrap.dedent(EXPERIMENT).replace("tests.support.trials:OneWeightTrial", entrypoint))
    return path


def hookdet_run(experiment: Path, run_dir: Path) -> List[str]:
    return [str(HOOKDET), "run", str(experiment), "--model-dir", str(REPO), "--run-dir", str(run_dir)]


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def screen_lines(screen: str) -> List[str]:
    """What the terminal showed, line by line and redraw by redraw, without colours."""
    text = ANSI.sub("", screen)
    return [part.rstrip() for line in text.split("\n") for part in line.split("\r") if part.strip()]


@pytest.mark.slow
def test_live_view_in_a_terminal(tmp_path: Path) -> None:
    experiment = write_experiment(tmp_path, "tests.support.progress_trials:ManyMetricsTrial")
    controller, terminal = open_terminal(columns=120)
    process = subprocess.Popen(
        hookdet_run(experiment, tmp_path / "run"),
        stdin=terminal, stdout=terminal, stderr=terminal, cwd=tmp_path, close_fds=True,
        env={**os.environ, "COLUMNS": "120"},
    )
    os.close(terminal)
    screen = read_until_closed(controller)
    assert process.wait(timeout=60) == 0, screen
    lines = screen_lines(screen)
    lines = lines[: next(i for i, line in enumerate(lines) if line.startswith("hookdet: completed"))]
    assert all(len(line) <= 120 for line in lines), max(lines, key=len)

    # Epoch (4 batches each) and batch of the total, rate and ETA on the training bar.
    bars = [line for line in lines if re.match(r"epoch \d+/10 ", line)]
    assert re.search(r" 0/40 batches   0%$", bars[0]), bars[0]
    assert re.search(r" 40/40 batches 100% [\d.]+ batch/s  ETA 0:00:00 loss=\S+$", bars[-1]), bars[-1]
    assert any(re.search(r"epoch [2-9]/10 .* (\d+)/40 batches +(\d+)% [\d.]+ batch/s  ETA \d:\d\d:\d\d loss=\S+$", line)
               for line in bars)
    for line in bars:  # the percentage is the count's
        done, percent = re.search(r" (\d+)/40 batches +(\d+)%", line).groups()
        assert int(percent) == 100 * int(done) // 40, line
    # The bar ends with the latest batch's loss, read between reports: the trial's loss at
    # batch k is exactly 0.64**k (w = 1 - 0.8**k), and the last frame shows batch 39's.
    def batch_of(loss: str) -> int:
        """The batch whose loss this is (float32 rounding aside), or -1."""
        return next((k for k in range(40) if abs(float(loss) / 0.64 ** k - 1) < 1e-3), -1)

    shown = [line.rsplit("loss=", 1)[1] for line in bars if "loss=" in line]
    assert all(batch_of(value) >= 0 for value in shown), shown
    assert batch_of(shown[-1]) == 39
    assert len(set(shown)) >= 3  # it changes between the reports at 10, 20, 30
    # A validation bar while one runs, knowing the 4 batches a validation has from the first one on.
    validation_bars = [line for line in lines if re.match(r"validation +\S+ +\d+/(\?|\d+) +batches", line)]
    assert validation_bars and all("/4 " in line for line in validation_bars), validation_bars

    # The latest metrics, each group on its own labelled row: every training metric readable
    # (the row wraps instead of squeezing the bar), the searcher metric first in validation.
    latest = {record["group"]: record for record in read_reports(tmp_path / "run")}
    final_frame = lines[lines.index(bars[-1]):]
    training_rows = [line for line in final_frame if re.match(r" *training  @ batch 40  ", line)]
    assert training_rows, final_frame
    shown_training = " ".join(final_frame[final_frame.index(training_rows[0]):])
    for name, value in latest["training"]["metrics"].items():
        assert f"{name}={format_number(value)}" in shown_training, (name, shown_training)
    validation_row = next(line for line in final_frame if line.startswith("validation  @ batch 40"))
    expected = format_metrics(latest["validation"]["metrics"], first="validation_loss").replace(" ", "  ")
    assert validation_row.endswith(expected) and expected.startswith("validation_loss="), validation_row

    # One short line per checkpoint, its path relative to the run directory.
    saved = [line for line in lines if "checkpoint saved at batch" in line]
    assert len(saved) == 4, saved
    for line in saved:
        assert re.search(r"hookdet INFO checkpoint saved at batch \d+: checkpoints/[0-9a-f-]{36}$", line), line


@pytest.mark.slow
def test_plain_lines_without_a_terminal(tmp_path: Path) -> None:
    experiment = write_experiment(tmp_path, "tests.support.progress_trials:ManyMetricsTrial")
    result = subprocess.run(
        hookdet_run(experiment, tmp_path / "run"),
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    messages = [line.split(" hookdet INFO ", 1)[1] for line in result.stderr.splitlines() if " hookdet INFO " in line]
    reports = [line for line in messages if line.startswith(("training:", "validation:"))]
    records = read_reports(tmp_path / "run")
    assert len(records) == 8
    # One line per report, the searcher metric first in validation.
    expected = [
        f"{record['group']}: batch {record['steps_completed']}/40 "
        f"({100 * record['steps_completed'] // 40}%) "
        f"{format_metrics(record['metrics'], 'validation_loss' if record['group'] == 'validation' else None)}"
        for record in records
    ]
    assert reports == expected
    assert all(line.startswith("validation: batch 10/40 (25%) validation_loss=") for line in reports[1:2])
    assert "\r" not in result.stderr and "\x1b[" not in result.stderr


@pytest.mark.slow
def test_a_long_validation_off_a_terminal_never_goes_silent(tmp_path: Path) -> None:
    """Validation takes about 3 s (10 batches of 0.3 s); with ``log_every_s: 0.5`` the log gets a
    line at least every half second or so all the way through, saying where validation is."""
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(textwrap.dedent("""
        entrypoint: tests.support.progress_trials:SlowValidationTrial
        hyperparameters: {lr: 0.1, records: 10, global_batch_size: 1, eval_sleep_s: 0.3}
        searcher: {name: single, metric: validation_loss, max_length: {batches: 2}}
        scheduling_unit: 1
        plugin_config: {progress: {log_every_s: 0.5}}
    """))
    started = time.monotonic()
    result = subprocess.run(
        hookdet_run(experiment, tmp_path / "run"), capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if " hookdet " in line]
    stamps = [
        datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() for line in lines
    ]
    heartbeats = [line.split(" hookdet INFO ", 1)[1] for line in lines if " hookdet INFO validation: batch " in line
                  and "validation_loss" not in line]
    assert len(heartbeats) >= 3, result.stderr
    heartbeat = r"validation: batch \d+/10 \(\d+%\)(, [\d.]+ (batch/s|s/batch))?(, ETA \d:\d\d:\d\d)?"
    assert all(re.fullmatch(heartbeat, line) for line in heartbeats), heartbeats
    assert any(", batch/s" not in line and "batch/s" in line for line in heartbeats), heartbeats
    validation_start = next(i for i, line in enumerate(lines) if "training: batch 2/2" in line)
    validation_end = next(i for i, line in enumerate(lines) if "validation: batch 2/2" in line)
    gaps = [later - earlier for earlier, later in zip(stamps[validation_start:validation_end + 1], stamps[validation_start + 1:validation_end + 1])]
    assert gaps and max(gaps) < 1.0, (gaps, result.stderr)
    assert time.monotonic() - started < 60


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
    bars = [line for line in screen_lines(terminal.screen) if line.startswith("epoch ")]
    assert bars and re.match(r"epoch 2/2 .* 4/8 batches", bars[0]), bars
    assert all(" 0/8 " not in bar for bar in bars)
    assert re.match(r"epoch 2/2 .* 8/8 batches", bars[-1]), bars[-1]


def test_other_ranks_show_nothing(tmp_path: Path) -> None:
    """A rank-1 process (its collectives are the identity: only its rank matters here)."""
    exp_conf = {"hyperparameters": HP, "plugins": {"only": ["progress"]}}
    with terminal_as_stderr() as terminal:
        with pytorch.init(hparams=HP, exp_conf=exp_conf, run_dir=tmp_path,
                          distributed=RankAloneContext(rank=1, size=2)) as context:
            pytorch.Trainer(OneWeightTrial(context), context).fit(
                max_length=pytorch.Batch(4), validation_period=pytorch.Batch(2)
            )
    assert terminal.screen == ""


def test_the_chief_in_the_same_setting_shows_bars(tmp_path: Path) -> None:
    """The control for the test above: rank 0, same setting, the bar is there."""
    exp_conf = {"hyperparameters": HP, "plugins": {"only": ["progress"]}}
    with terminal_as_stderr() as terminal:
        with pytorch.init(hparams=HP, exp_conf=exp_conf, run_dir=tmp_path,
                          distributed=RankAloneContext(rank=0, size=2)) as context:
            pytorch.Trainer(OneWeightTrial(context), context).fit(
                max_length=pytorch.Batch(4), validation_period=pytorch.Batch(2)
            )
    assert any(" 4/4 batches" in line for line in screen_lines(terminal.screen))


def test_a_core_api_scripts_own_progress_and_status_are_its_bar(tmp_path: Path, monkeypatch) -> None:
    """A Core API script names no length: its bar is the progress it reports, with its status."""
    import hookdet as det

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HOOKDET_CLUSTER_INFO", raising=False)
    with terminal_as_stderr() as terminal:
        with det.core.init() as core_context:
            core_context.train.report_training_metrics(steps_completed=5, metrics={"loss": 0.25})
            core_context.train.report_progress(0.5)
            core_context.train.set_status("evaluating")
    lines = screen_lines(terminal.screen)
    assert any(re.match(r"progress .* 50% · evaluating$", line) for line in lines), lines
    assert any(re.match(r" *training  @ batch 5  loss=0.25", line) for line in lines), lines


def test_format_metrics_shows_numbers_only() -> None:
    metrics = {"loss": 0.123456, "step": 7, "flag": True, "name": "x", "tiny": 1.5e-9}
    assert format_metrics(metrics) == "loss=0.1235 step=7 tiny=1.5e-09"
    assert format_metrics(metrics, first="tiny") == "tiny=1.5e-09 loss=0.1235 step=7"


class PerBatchProbe(pytorch.PyTorchCallback):
    """Notes, as training starts, whether the loop will call a per-batch hook after each batch."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.per_batch_hook = None

    def on_training_start(self) -> None:
        self.per_batch_hook = run_of(self.context).plugins.implemented("hookdet_train_batch_end")


class ProbedTrial(OneWeightTrial):
    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        self.probe = PerBatchProbe(self.context)
        return {"probe": self.probe}


def test_the_live_view_calls_no_per_batch_hook_in_training(tmp_path: Path) -> None:
    """Its thread reads the loop's counter: training batches call no hook, in a terminal or not."""
    config = {"plugins": {"only": ["callbacks", "progress"]}}
    plain = fit(ProbedTrial, HP, tmp_path / "plain", config=config, max_length=pytorch.Batch(2))
    with terminal_as_stderr() as terminal:
        viewed = fit(ProbedTrial, HP, tmp_path / "view", config=config, max_length=pytorch.Batch(2))
    assert (plain.probe.per_batch_hook, viewed.probe.per_batch_hook) == (False, False)
    assert any(line.endswith(" 2/2 batches") or " 2/2 batches " in line for line in screen_lines(terminal.screen))
    assert run_of(viewed.context).plugins.get("progress:validation") is None  # gone when the run ended


@BUDGET_PYTHON
def test_the_bytecode_budget_holds_with_the_live_view_on(tmp_path: Path) -> None:
    """The per-batch bytecode budget of ``tests/test_core_loop.py``, run again with stderr a
    terminal, so the live view (and its refresh thread) is on."""
    from tests.test_core_loop import test_the_loop_runs_few_python_bytecodes_of_its_own_per_batch as budget

    with terminal_as_stderr() as terminal:
        budget(tmp_path)
    assert any(" 60/60 batches" in line for line in screen_lines(terminal.screen))


def test_latest_batch_value_reads_the_newest_batch_without_waiting() -> None:
    from hookdet.metrics.live_view import LatestBatchValue

    workload: List[Dict[str, Any]] = []
    latest = LatestBatchValue(lambda: workload)
    assert latest.poll() == ""
    workload.append({"loss": torch.tensor(0.5), "acc": 1.0})
    assert latest.poll() == "loss=0.5"
    workload.append({"accuracy": 0.25})  # no loss: the first metric
    assert latest.poll() == "accuracy=0.25"
    workload.clear()  # a new workload, no batch yet: the last value stays
    assert latest.poll() == "accuracy=0.25"
    workload.append({"loss": torch.ones(3)})  # not a scalar: nothing new to show
    assert latest.poll() == "accuracy=0.25"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_latest_batch_value_copies_a_cuda_value_asynchronously() -> None:
    from hookdet.metrics.live_view import LatestBatchValue

    workload = [{"loss": torch.tensor(0.75, device="cuda")}]
    latest = LatestBatchValue(lambda: workload)
    latest.poll()  # starts the copy
    torch.cuda.synchronize()
    assert latest.poll() == "loss=0.75"
