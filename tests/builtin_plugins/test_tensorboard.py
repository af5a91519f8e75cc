"""The tensorboard plugin: every reported scalar in tfevents, read back with TensorBoard's reader."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
import torch

from hookdet import pytorch
from hookdet.config import ConfigError
from hookdet.runs.metrics import read_reports
from hookdet.plugins.builtin.tensorboard import DiscardingWriter, TorchWriter
from hookdet.distributed.context import DistributedContext
from hookdet.plugin import run_of
from tests.support.trials import OneWeightTrial, fit

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[2]
HP = {"lr": 0.1, "records": 8, "global_batch_size": 2}
PLUGINS = ["callbacks", "metrics_log", "checkpoint", "tensorboard"]


def read_scalars(directory: Path) -> Dict[str, List[Tuple[int, float]]]:
    """Every scalar under ``directory``, by tag, as TensorBoard itself loads them."""
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def reported_scalars(run_dir: Path) -> Dict[str, List[Tuple[int, float]]]:
    """``metrics.jsonl`` as TensorBoard would hold it: float32 values; a later report of the same
    step replaces an earlier one."""
    by_tag: Dict[str, Dict[int, float]] = {}
    for record in read_reports(run_dir):
        for name, value in record["metrics"].items():
            tag = f"{record['group']}/{name}"
            by_tag.setdefault(tag, {})[record["steps_completed"]] = float(np.float32(value))
    return {tag: sorted(points.items()) for tag, points in by_tag.items()}


class WriterTrial(OneWeightTrial):
    """Logs its own scalar through the context's writer and through Determined's TorchWriter."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.writer = context.get_tensorboard_writer()
        self.legacy = TorchWriter()

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        self.writer.add_scalar("custom/batch_squared", batch_idx**2, batch_idx)
        self.legacy.add_scalar("custom/legacy", 2 * batch_idx, batch_idx)
        return metrics


def test_every_reported_scalar_is_in_tensorboard(tmp_path: Path) -> None:
    trial = fit(
        WriterTrial,
        HP,
        tmp_path,
        config={"plugins": PLUGINS},
        max_length=pytorch.Batch(12),
        validation_period=pytorch.Batch(4),
        reporting_period=pytorch.Batch(3),
    )
    run = run_of(trial.context)
    assert trial.legacy.writer is trial.writer
    assert trial.context.get_tensorboard_path() == tmp_path / "tensorboard"

    in_tensorboard = read_scalars(tmp_path / "tensorboard")
    expected = reported_scalars(tmp_path)
    assert set(expected) == {
        "training/loss", "training/weight", "training/lr", "validation/validation_loss"
    }
    for tag, points in expected.items():
        assert in_tensorboard[tag] == points, tag
    training_steps = [step for step, _ in in_tensorboard["training/loss"]]
    assert training_steps == [3, 4, 6, 8, 9, 12]
    assert in_tensorboard["custom/batch_squared"] == [(i, float(i**2)) for i in range(12)]
    assert in_tensorboard["custom/legacy"] == [(i, float(2 * i)) for i in range(12)]
    assert run.exit_reason == "completed"


def test_training_reports_are_kept_until_due_and_on_disk_by_the_next_validation(tmp_path: Path) -> None:
    """With ``write_every_s`` long, training reports stay in the plugin; the validation report
    writes and flushes them, so a checkpoint that follows finds everything reported on disk."""
    seen: Dict[str, Dict[str, List[Tuple[int, float]]]] = {}

    class ReadBack(pytorch.PyTorchCallback):
        def on_validation_start(self) -> None:
            seen.setdefault("validation_start", read_scalars(tmp_path / "tensorboard"))

        def on_checkpoint_save_start(self, checkpoint: Dict[str, Any]) -> None:
            seen.setdefault("checkpoint", read_scalars(tmp_path / "tensorboard"))

    class ReadingTrial(OneWeightTrial):
        def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
            return {"read_back": ReadBack()}

    fit(
        ReadingTrial, HP, tmp_path,
        config={"plugins": PLUGINS, "plugin_config": {"tensorboard": {"write_every_s": 3600}}},
        max_length=pytorch.Batch(8), validation_period=pytorch.Batch(4),
        checkpoint_period=pytorch.Batch(4), reporting_period=pytorch.Batch(2),
    )
    # The first report at batch 2 is written at once (nothing was due before it); the one at
    # batch 4 is kept until the validation report of batch 4.
    assert [step for step, _ in seen["validation_start"].get("training/loss", [])] in ([], [2])
    assert [step for step, _ in seen["checkpoint"]["training/loss"]] == [2, 4]
    assert [step for step, _ in seen["checkpoint"]["validation/validation_loss"]] == [4]
    # One event per report, holding every metric of that report.
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    loss_events = accumulator.Scalars("training/loss")
    weight_events = accumulator.Scalars("training/weight")
    assert [e.step for e in loss_events] == [2, 4, 6, 8]
    assert [e.wall_time for e in loss_events] == [e.wall_time for e in weight_events]


@pytest.mark.parametrize("value, expected", [
    (-1, "must be at least 0.0; got -1"), ("soon", "expected a number; got 'soon'"), (True, "expected a number; got true"),
])
def test_a_bad_write_every_s_is_refused_naming_the_field(tmp_path: Path, value: Any, expected: str) -> None:
    config = {"plugins": PLUGINS, "plugin_config": {"tensorboard": {"write_every_s": value}}}
    with pytest.raises(ConfigError) as raised:
        fit(OneWeightTrial, HP, tmp_path, config=config, max_length=pytorch.Batch(2))
    assert str(raised.value) == f"exp_conf: plugin_config.tensorboard.write_every_s: {expected}"


def test_writer_is_closed_at_the_end_and_files_are_complete(tmp_path: Path) -> None:
    trial = fit(
        OneWeightTrial, HP, tmp_path, config={"plugins": PLUGINS}, max_length=pytorch.Batch(4),
        validation_period=pytorch.Batch(4),
    )
    plugin = run_of(trial.context).plugins.get("tensorboard")
    assert plugin._writer is None
    with pytest.raises(RuntimeError, match="TorchWriter\\(\\) needs a run"):
        TorchWriter()
    assert [step for step, _ in read_scalars(tmp_path / "tensorboard")["validation/validation_loss"]] == [4]


def test_resumed_run_hides_what_an_interrupted_attempt_wrote_after_the_checkpoint(tmp_path: Path) -> None:
    fit(OneWeightTrial, HP, tmp_path, config={"plugins": PLUGINS}, max_length=pytorch.Batch(4),
        validation_period=pytorch.Batch(2), reporting_period=pytorch.Batch(2), checkpoint_policy="none")
    (saved,) = (tmp_path / "checkpoints").iterdir()  # the one at the end (batch 4)
    checkpoint = shutil.copytree(saved, tmp_path / "kept" / saved.name)  # out of retention's reach
    # Two attempts from the same checkpoint: the first stands for one that died after batch 8.
    for _attempt in range(2):
        fit(OneWeightTrial, HP, tmp_path, config={"plugins": PLUGINS}, max_length=pytorch.Batch(8),
            validation_period=pytorch.Batch(2), reporting_period=pytorch.Batch(2),
            latest_checkpoint=str(checkpoint))

    in_tensorboard = read_scalars(tmp_path / "tensorboard")
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 3
    for tag, points in reported_scalars(tmp_path).items():
        assert in_tensorboard[tag] == points, tag
    assert [step for step, _ in in_tensorboard["training/loss"]] == [2, 4, 6, 8]


def test_missing_tensorboard_package_refuses_the_run_with_one_message(tmp_path: Path) -> None:
    config = tmp_path / "experiment.yaml"
    config.write_text(textwrap.dedent(
        """
        entrypoint: tests.support.trials:OneWeightTrial
        hyperparameters: {lr: 0.1, records: 4, global_batch_size: 2}
        searcher: {name: single, metric: validation_loss, max_length: {batches: 4}}
        plugins: {only: [metrics_log, tensorboard]}
        """
    ))
    child = (
        "import sys\n"
        "sys.modules['tensorboard'] = None  # as if the package were not installed\n"
        "from hookdet.cli.commands import main\n"
        f"sys.exit(main(['run', {str(config)!r}, '--model-dir', {str(REPO)!r}, "
        f"'--run-dir', {str(tmp_path / 'run')!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("hookdet: error:")]
    assert len(errors) == 1, result.stderr
    assert "plugin 'tensorboard' needs the tensorboard package" in errors[0]
    assert "pip install tensorboard" in errors[0] and "no:tensorboard" in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ------------------------------------------------------------------ two real processes (gloo)


class GlooContext(DistributedContext):
    """Object collectives over a real ``torch.distributed`` gloo process group."""

    def allgather(self, obj: Any) -> List[Any]:
        gathered: List[Any] = [None] * self.size
        torch.distributed.all_gather_object(gathered, obj)
        return gathered

    def gather(self, obj: Any) -> Any:
        gathered: List[Any] = [None] * self.size if self.rank == 0 else None
        torch.distributed.gather_object(obj, gathered, dst=0)
        return gathered

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        torch.distributed.barrier()


def _train_on_rank(rank: int, port: int, run_dir: str, results: Any) -> None:
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    try:
        distributed = GlooContext(rank=rank, size=2, local_rank=rank, local_size=2, cross_rank=0, cross_size=1)
        exp_conf = {"hyperparameters": HP, "plugins": {"only": ["metrics_log", "tensorboard"]}}
        with pytorch.init(hparams=HP, exp_conf=exp_conf, run_dir=run_dir, distributed=distributed) as context:
            trial = OneWeightTrial(context)
            writer = context.get_tensorboard_writer()
            writer.add_scalar("custom/rank", float(rank), 0)
            pytorch.Trainer(trial, context).fit(
                max_length=pytorch.Batch(4), validation_period=pytorch.Batch(2), reporting_period=pytorch.Batch(2)
            )
        results.put((rank, type(writer).__name__))
        torch.distributed.barrier()  # neither rank tears its connections down under the other
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_only_the_chief_writes(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = torch.multiprocessing.get_context("spawn")
    results = context.SimpleQueue()
    processes = [
        context.Process(target=_train_on_rank, args=(rank, port, str(tmp_path), results)) for rank in (0, 1)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [process.exitcode for process in processes] == [0, 0]
    writers = dict(results.get() for _ in processes)
    assert writers == {0: "SummaryWriter", 1: DiscardingWriter.__name__}

    assert len(list((tmp_path / "tensorboard").iterdir())) == 1
    in_tensorboard = read_scalars(tmp_path / "tensorboard")
    assert in_tensorboard["custom/rank"] == [(0, 0.0)]
    for tag, points in reported_scalars(tmp_path).items():
        assert in_tensorboard[tag] == points, tag
    assert [step for step, _ in in_tensorboard["training/loss"]] == [2, 4]


def test_torch_writer_is_importable_from_determineds_path() -> None:
    from hookdet.plugins.builtin import tensorboard
    from hookdet.tensorboard.metric_writers.pytorch import TorchWriter

    assert TorchWriter is tensorboard.TorchWriter
