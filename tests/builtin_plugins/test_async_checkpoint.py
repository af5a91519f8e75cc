"""Checkpoints written in the background: consistent snapshots, hooks when the write is done,
waits, failures, the synchronous option, and older (sha256) checkpoints.

Real runs in this process with tiny trials; the storages that are slow or fail are the real
:class:`LocalStorage` with a delay or a fault (disk full) injected where a real one would hit it.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from unittest import mock
from typing import Any, Dict, Iterator, List, Optional

import pytest
import torch

from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import lookup as lookup
from hookdet import pytorch
from hookdet.config import ConfigError
from hookdet.checkpoints.local import LocalStorage
from tests.support.resume_trials import RegressionTrial, run_spec
from tests.support.states import assert_states_equal

HPARAMS = {"records": 32, "global_batch_size": 8, "lr": 0.05, "shuffle": True, "dropout": 0.2}


class InjectedStorage(LocalStorage):
    """A local directory whose writes take ``delay`` seconds longer, and whose write number
    ``fail_at`` (1-based) runs out of disk after its files are written, before publication."""

    def __init__(self, root: Path, delay: float = 0.0, fail_at: Optional[int] = None) -> None:
        super().__init__(root)
        self.delay, self.fail_at = delay, fail_at
        self.stored: List[str] = []

    @contextlib.contextmanager
    def store_path(self, storage_id: str) -> Iterator[Path]:
        self.stored.append(storage_id)
        with super().store_path(storage_id) as directory:
            yield directory
            time.sleep(self.delay)
            if len(self.stored) == self.fail_at:
                raise OSError(errno.ENOSPC, "No space left on device")


class CheckpointEvents(pytorch.PyTorchCallback):
    """Records each checkpoint hook with the batch it belongs to, and what the directory held
    when ``on_checkpoint_write_end`` ran; adds a file there."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.events: List[tuple] = []
        self.write_end_dirs: List[Dict[str, Any]] = []

    def on_checkpoint_save_start(self, checkpoint: Dict[str, Any]) -> None:
        self.events.append(("save_start", checkpoint["trial_state"]["batches_trained"]))

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        directory = Path(checkpoint_dir)
        metadata = fmt.verify(directory)  # complete and intact while the hook runs
        self.events.append(("write_end", metadata["steps_completed"]))
        self.write_end_dirs.append({"dir": directory, "hidden": directory.name.startswith(".")})
        (directory / "labels.txt").write_text(f"written at batch {metadata['steps_completed']}\n")

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        self.events.append(("upload_end", uuid))

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        self.events.append(("end", checkpoint_dir))


class EventTrial(RegressionTrial):
    def build_callbacks(self) -> Dict[str, pytorch.PyTorchCallback]:
        self.checkpoint_events = CheckpointEvents(self.context)
        return {**super().build_callbacks(), "events": self.checkpoint_events}


def fit(
    tmp_path: Path,
    storage: Optional[LocalStorage] = None,
    asynchronous: bool = True,
    batches: int = 6,
    checkpoint_period: int = 1,
    trial_class: type = RegressionTrial,
) -> Any:
    exp_conf = {
        "hyperparameters": HPARAMS,
        "plugins": {"only": ["callbacks", "checkpoint"]},
        "plugin_config": {"checkpoint": {"async": asynchronous}},
        "checkpoint_storage": {"type": "directory", "container_path": str(tmp_path / "ckpt"),
                               "save_trial_latest": 100},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": batches}},
        "reproducibility": {"experiment_seed": 5},
    }
    from hookdet.loop import trainer as trainer_module

    # The run's storage: the slow (or failing) local storage given, where its factory would make one.
    made = contextlib.nullcontext() if storage is None else \
        mock.patch.object(trainer_module, "make_storage", lambda config, run_dir: storage)
    with made, pytorch.init(hparams=HPARAMS, exp_conf=exp_conf, run_dir=tmp_path / "run") as context:
        trial = trial_class(context)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(batches),
            validation_period=pytorch.Batch(100),
            checkpoint_period=pytorch.Batch(checkpoint_period),
            checkpoint_policy="none",
        )
    return trial


def states_by_step(checkpoints: Path) -> Dict[int, Dict[str, Any]]:
    """Every checkpoint's state, by batches trained, without what names the checkpoint itself."""
    found = {}
    for directory, metadata in lookup.find_checkpoints(checkpoints):
        state = fmt.load_state(directory)
        for key in ("latest_checkpoint",):
            state["trial_state"].pop(key)
        state["plugins"].pop("checkpoint")  # the retention list names earlier checkpoints' uuids
        found[metadata["steps_completed"]] = state
    return found


def assert_equal(expected: Any, actual: Any, where: str = "state") -> None:
    """Bit for bit, keys in the same order too."""
    assert_states_equal(expected, actual, where, ordered=True)


# ---------------------------------------------------------------------------------------------
# Consistency: training goes on while the write runs
# ---------------------------------------------------------------------------------------------


def test_background_checkpoints_equal_synchronous_ones_bit_for_bit(tmp_path: Path) -> None:
    """Every write takes 50 ms longer than training a batch, so each snapshot is serialised
    while the next batches update the weights, the optimizer state and the RNG in place; the
    files still hold exactly the state at their batch, as the synchronous writes do."""
    slow = InjectedStorage(tmp_path / "async" / "ckpt", delay=0.05)
    fit(tmp_path / "async", storage=slow, asynchronous=True)
    fit(tmp_path / "sync", asynchronous=False)
    background, synchronous = states_by_step(tmp_path / "async" / "ckpt"), states_by_step(tmp_path / "sync" / "ckpt")
    assert sorted(background) == sorted(synchronous) == [1, 2, 3, 4, 5, 6]
    for step in synchronous:
        assert_equal(synchronous[step], background[step], f"checkpoint at batch {step}")


def test_the_snapshot_keeps_shared_storage_and_parameters() -> None:
    """Views of one storage stay views of one copy (as torch.save saw them), and the copy is
    independent of the originals."""
    from hookdet.checkpoints.writer import HostSnapshot

    base = torch.arange(10.0)
    parameter = torch.nn.Parameter(torch.ones(3))
    state = {"a": base, "view": base[2:5], "same": [base], "p": parameter, "t": (1, "x", None)}
    snapshot = HostSnapshot()
    for _ in range(2):  # the second snapshot reuses the first one's buffers
        copied, event = snapshot.take(state)
        assert event is None
        assert copied["a"] is copied["same"][0] and copied["a"].data_ptr() != base.data_ptr()
        assert copied["view"].untyped_storage().data_ptr() == copied["a"].untyped_storage().data_ptr()
        assert type(copied["p"]) is torch.nn.Parameter and copied["t"] == (1, "x", None)
        base.add_(1)
        assert torch.equal(copied["view"], base[2:5] - 1)


# ---------------------------------------------------------------------------------------------
# Hooks fire when the write has finished, on a directory that exists
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_completion_hooks_follow_the_write_on_the_published_directory(tmp_path: Path, asynchronous: bool) -> None:
    slow = InjectedStorage(tmp_path / "ckpt", delay=0.05)
    trial = fit(tmp_path, storage=slow, asynchronous=asynchronous, batches=4, checkpoint_period=2, trial_class=EventTrial)
    events = trial.checkpoint_events
    checkpoints = {metadata["steps_completed"]: path for path, metadata in lookup.find_checkpoints(tmp_path / "ckpt")}
    assert sorted(checkpoints) == [2, 4]
    expected: List[tuple] = []
    for step in (2, 4):
        directory = checkpoints[step]
        # Determined's order: a callback's on_checkpoint_end comes with its on_checkpoint_write_end.
        expected += [("save_start", step), ("end", str(directory)), ("write_end", step), ("upload_end", directory.name)]
    assert events.events == expected
    # The hook got the published directory, which is still there, its file sealed in the manifest.
    assert [entry["dir"] for entry in events.write_end_dirs] == [checkpoints[2], checkpoints[4]]
    assert not any(entry["hidden"] for entry in events.write_end_dirs)
    for step, directory in checkpoints.items():
        metadata = fmt.verify(directory)
        assert "labels.txt" in metadata["files"]
        assert (directory / "labels.txt").read_text() == f"written at batch {step}\n"
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")]


def test_the_next_checkpoint_waits_for_the_write_in_flight_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    slow = InjectedStorage(tmp_path / "ckpt", delay=0.4)
    with caplog.at_level(logging.INFO, logger="hookdet"):
        fit(tmp_path, storage=slow, batches=3)
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for checkpoint")]
    assert any(message.endswith("before the next checkpoint") for message in waits), waits
    assert waits[-1].endswith("before the run ends")  # the final checkpoint, written when training stopped
    assert [m["steps_completed"] for _, m in lookup.find_checkpoints(tmp_path / "ckpt")] == [1, 2, 3]
    for directory, _ in lookup.find_checkpoints(tmp_path / "ckpt"):
        fmt.verify(directory)


# ---------------------------------------------------------------------------------------------
# A failed write fails the run, naming the checkpoint, and leaves nothing that looks complete
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_a_failed_write_fails_the_run_naming_the_checkpoint_and_the_cause(tmp_path: Path, asynchronous: bool) -> None:
    full = InjectedStorage(tmp_path / "ckpt", fail_at=2)
    with pytest.raises(fmt.CheckpointError) as raised:
        fit(tmp_path, storage=full, asynchronous=asynchronous, batches=6)
    failed = full.stored[1]
    message = str(raised.value)
    assert failed in message and "No space left on device" in message
    if asynchronous:
        assert message.startswith(f"checkpoint {failed} could not be written: OSError")
    # Only the first checkpoint exists, intact; the failed one left no trace.
    assert [path.name for path in (tmp_path / "ckpt").iterdir()] == [full.stored[0]]
    assert fmt.verify(tmp_path / "ckpt" / full.stored[0])["steps_completed"] == 1


# ---------------------------------------------------------------------------------------------
# The option, and checkpoints of the older format
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        ({"async": "yes"}, "exp_conf: plugin_config.checkpoint.async: expected true or false; got 'yes'"),
        ({"asynchronous": True}, "exp_conf: plugin_config.checkpoint.asynchronous: unknown option 'asynchronous'; known options: async"),
    ],
)
def test_the_async_option_is_checked(tmp_path: Path, options: Dict[str, Any], message: str) -> None:
    """The option is declared (``CheckpointPlugin.Options``): checked when the experiment is read."""
    exp_conf = {"plugins": {"only": ["checkpoint"]}, "plugin_config": {"checkpoint": options}}
    with pytest.raises(ConfigError) as error:
        with pytorch.init(exp_conf=exp_conf, run_dir=tmp_path):
            pass
    assert str(error.value) == message


def rewrite_as_format_3(directory: Path) -> None:
    """Rewrite a checkpoint's metadata as hookdet wrote it before XXH3: a sha256 per 64 MiB
    slice of every file, format_version 3."""
    metadata = json.loads((directory / fmt.METADATA_FILE).read_text())
    for relative, entry in metadata["files"].items():
        content = (directory / relative).read_bytes()
        slices = [content[i : i + fmt.CHUNK_BYTES] for i in range(0, len(content), fmt.CHUNK_BYTES)] or [b""]
        metadata["files"][relative] = {"size": len(content), "sha256": [hashlib.sha256(s).hexdigest() for s in slices]}
    metadata["format_version"] = 3
    metadata.pop(fmt.METADATA_DIGEST_KEY)
    canonical = json.dumps(metadata, sort_keys=True, separators=(",", ":"), allow_nan=True)
    metadata[fmt.METADATA_DIGEST_KEY] = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    (directory / fmt.METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True))


def test_a_checkpoint_of_the_sha256_format_resumes_exactly(tmp_path: Path) -> None:
    spec = {"trial": "tests.support.resume_trials:RegressionTrial", "hparams": HPARAMS, "max_batches": 8,
            "validation_period": 4, "reporting_period": 2, "checkpoint_period": 3}
    run_spec({**spec, "run_dir": str(tmp_path / "first"), "max_batches": 3})
    (original,) = [path for path, _ in lookup.find_checkpoints(tmp_path / "first" / "checkpoints")]
    old = tmp_path / "old" / original.name
    shutil.copytree(original, old)
    rewrite_as_format_3(old)
    assert "sha256" in fmt.verify(old)["files"][fmt.STATE_FILE]
    from_new = run_spec({**spec, "run_dir": str(tmp_path / "a"), "resume": str(original)})
    from_old = run_spec({**spec, "run_dir": str(tmp_path / "b"), "resume": str(old)})
    assert from_old["startup"] == from_new["startup"] and from_old["batches_trained"] == 8
    assert_equal(from_new["models"], from_old["models"])
    assert_equal(from_new["optimizers"], from_old["optimizers"])
    assert from_new["batch_metrics"] == from_old["batch_metrics"]
