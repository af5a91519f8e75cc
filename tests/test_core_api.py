"""``det.core.init()`` in this process: each context's calls, their records, every bad input.

A Core API script run bare gets a run directory of its own, as ``pytorch.init()`` gives one;
these tests drive the contexts there and read what they left with the readers every other run
is read with (``read_reports``, ``read_record``, TensorBoard's own reader). Under ``hookdet
run`` the same contexts run in the script's process: tests/test_core_api_tutorials.py.
"""
from __future__ import annotations

import json
import os
import signal
import warnings
from pathlib import Path

import pytest

import hookdet as det
from hookdet.checkpoints import format as fmt
from hookdet.errors import INVALID_HP_EXIT_CODE
from hookdet.runs.metrics import read_reports
from hookdet.runs.record import read_history, read_record


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own working directory (a bare run makes ``runs/<name>-<time>`` there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HOOKDET_CLUSTER_INFO", raising=False)
    return tmp_path


def the_run(in_tmp: Path) -> Path:
    (run_dir,) = (in_tmp / "runs").iterdir()
    return run_dir


def test_reports_go_to_the_run_records_and_tensorboard(in_tmp: Path) -> None:
    with det.core.init() as core_context:
        core_context.train.report_training_metrics(steps_completed=10, metrics={"loss": 0.5})
        core_context.train.report_validation_metrics(steps_completed=10, metrics={"validation_loss": 0.25})
        core_context.train.report_metrics("inference", steps_completed=10, metrics={"latency": 3})
        core_context.train.report_progress(0.5)
        core_context.train.set_status("evaluating")
        assert core_context.train.set_metadata({"note": "first"}) == {"note": "first"}
        assert core_context.train.get_metadata() == {"note": "first"}
        assert core_context.train.get_experiment_best_validation() == 0.25
        tensorboard = core_context.train.get_tensorboard_path()
    run_dir = the_run(in_tmp)
    assert tensorboard == run_dir / "tensorboard"
    assert [(r["group"], r["steps_completed"], r["metrics"]) for r in read_reports(run_dir)] == [
        ("training", 10, {"loss": 0.5}), ("validation", 10, {"validation_loss": 0.25}),
        ("inference", 10, {"latency": 3})]
    record = read_record(run_dir)
    assert (record["state"], record["batches_trained"], record["best_validation"]) == ("completed", 10, 0.25)
    assert (record["progress"], record["status"], record["metadata"]) == (0.5, "evaluating", {"note": "first"})
    assert [entry["event"] for entry in read_history(run_dir)] == ["started", "completed"]
    assert (run_dir / "logs" / "rank-0.log").is_file()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tensorboard))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"training/loss", "validation/validation_loss"} <= tags, tags
    assert [event.value for event in accumulator.Scalars("training/loss")] == [0.5]


def test_tensorboard_mode_manual_writes_no_tensorboard_file(in_tmp: Path) -> None:
    with det.core.init(tensorboard_mode=det.core.TensorboardMode.MANUAL) as core_context:
        core_context.train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
    tensorboard = the_run(in_tmp) / "tensorboard"
    assert not tensorboard.exists() or not list(tensorboard.iterdir())


@pytest.mark.parametrize("call, message", [
    (lambda c: c.train.report_progress(1.5), "Progress should be between 0 and 1, not 1.5"),
    (lambda c: c.train.report_progress(-0.1), "Progress should be between 0 and 1"),
    (lambda c: c.train.report_validation_metrics(steps_completed=1, metrics={"loss": None}),
     "Validation metric 'loss' returned an invalid scalar value: None"),
    (lambda c: c.train.report_metrics("a.b", steps_completed=1, metrics={}), "without '.'"),
    (lambda c: c.train.report_training_metrics(steps_completed=-1, metrics={}), "whole number of batches"),
    (lambda c: c.train.report_training_metrics(steps_completed=1, metrics={"x": {1, 2}}), "cannot be written as JSON"),
])
def test_bad_reports_are_refused_by_name(in_tmp: Path, call, message: str) -> None:
    with pytest.raises((ValueError, TypeError, RuntimeError)) as raised:
        with det.core.init() as core_context:
            core_context.train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
            call(core_context)
    assert message in str(raised.value)
    assert read_record(the_run(in_tmp))["state"] == "failed"


def test_a_checkpoint_holds_the_script_files_sealed_and_its_metadata_exactly(in_tmp: Path) -> None:
    with det.core.init() as core_context:
        with core_context.checkpoint.store_path({"steps_completed": 7, "note": "mine"}) as (path, storage_id):
            (path / "state.txt").write_text("seven")
            (path / "sub").mkdir()
            (path / "sub" / "weights.bin").write_bytes(b"\x00\x01")
        assert core_context.checkpoint.get_metadata(storage_id) == {"steps_completed": 7, "note": "mine"}
        with core_context.checkpoint.restore_path(storage_id) as restored:
            assert (restored / "state.txt").read_text() == "seven"
            assert (restored / "sub" / "weights.bin").read_bytes() == b"\x00\x01"
            sealed = fmt.read_metadata(restored)
        downloaded = in_tmp / "downloaded"
        core_context.checkpoint.download(storage_id, downloaded, selector=lambda name: name.startswith("sub/"))
        assert sorted(p.relative_to(downloaded).as_posix() for p in downloaded.rglob("*") if p.is_file()) == [
            "sub/weights.bin"]
    assert set(sealed["files"]) == {"state.txt", "sub/weights.bin"}
    assert sealed["user_metadata"] == ["note", "steps_completed"] and sealed["uuid"] == storage_id
    record = read_record(the_run(in_tmp))
    assert record["latest_checkpoint"] == storage_id


def test_upload_stores_the_selected_files_of_a_directory(in_tmp: Path) -> None:
    source = in_tmp / "mine"
    (source / "keep").mkdir(parents=True)
    (source / "keep" / "a").write_text("a")
    (source / "skip").write_text("b")
    with det.core.init() as core_context:
        storage_id = core_context.checkpoint.upload(source, {"steps_completed": 1},
                                                    selector=lambda name: name.startswith("keep/"))
        with core_context.checkpoint.restore_path(storage_id) as restored:
            assert sorted(p.name for p in restored.rglob("*") if p.is_file()) == ["a", "metadata.json"]
        core_context.checkpoint.delete(storage_id)
        with pytest.raises(fmt.CheckpointError, match=f"no checkpoint '{storage_id}'"):
            core_context.checkpoint.get_metadata(storage_id)


def test_a_damaged_checkpoint_is_refused_when_restored(in_tmp: Path) -> None:
    with det.core.init() as core_context:
        with core_context.checkpoint.store_path({"steps_completed": 1}) as (path, storage_id):
            (path / "state").write_text("intact")
        location = Path(core_context._run.storage.location(storage_id))
        (location / "state").write_text("broken")
        with pytest.raises(fmt.CheckpointError, match="state"):
            with core_context.checkpoint.restore_path(storage_id):
                pass


@pytest.mark.parametrize("metadata, message", [
    ({}, "requires a 'steps_completed' item, which has not been provided"),
    ({"steps_completed": 1, "files": 3}, "metadata key(s) 'files' are hookdet's own"),
    ({"steps_completed": "1"}, "'steps_completed' must be a whole number of batches"),
])
def test_bad_checkpoint_metadata_is_refused_before_anything_is_written(in_tmp: Path, metadata, message) -> None:
    with det.core.init() as core_context:
        with pytest.raises(ValueError) as raised:
            with core_context.checkpoint.store_path(metadata):
                pytest.fail("the block must not run")
        assert message in str(raised.value)
    checkpoints = the_run(in_tmp) / "checkpoints"
    assert not checkpoints.exists() or not list(checkpoints.iterdir())


def test_an_unknown_checkpoint_says_where_it_looked(in_tmp: Path) -> None:
    with det.core.init() as core_context:
        with pytest.raises(fmt.CheckpointError) as raised:
            with core_context.checkpoint.restore_path("no-such-id"):
                pass
    assert "'no-such-id'" in str(raised.value) and "checkpoint index" in str(raised.value)


def test_retention_keeps_the_latest_and_the_best_of_the_run(in_tmp: Path) -> None:
    storage = {"type": "directory", "container_path": str(in_tmp / "store"), "save_trial_latest": 1,
               "save_trial_best": 1}
    ids = {}
    with det.core.init(checkpoint_storage=storage) as core_context:
        for steps, loss in ((1, 0.5), (2, 0.1), (3, 0.9), (4, 0.7)):
            core_context.train.report_validation_metrics(steps_completed=steps, metrics={"validation_loss": loss})
            with core_context.checkpoint.store_path({"steps_completed": steps}) as (path, ids[steps]):
                (path / "state").write_text(str(steps))
    assert sorted(p.name for p in (in_tmp / "store").iterdir()) == sorted([ids[2], ids[4]])


def test_should_preempt_turns_true_after_sigterm_and_the_run_is_preempted(in_tmp: Path) -> None:
    with det.core.init() as core_context:
        assert core_context.preempt.should_preempt() is False
        os.kill(os.getpid(), signal.SIGTERM)
        assert core_context.preempt.should_preempt() is True
    assert read_record(the_run(in_tmp))["state"] == "preempted"
    with pytest.raises(RuntimeError, match="after the core.init\\(\\) block ended"):
        core_context.preempt.should_preempt()


def test_invalid_hp_ends_the_trial_as_invalid(in_tmp: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        with det.core.init():
            raise det.InvalidHP("lr too large")
    assert exited.value.code == INVALID_HP_EXIT_CODE
    record = read_record(the_run(in_tmp))
    assert (record["state"], record["early_exit"]) == ("stopped", "EXITED_REASON_INVALID_HP")


def test_a_failure_inside_the_block_is_recorded_with_the_error(in_tmp: Path) -> None:
    with pytest.raises(KeyError):
        with det.core.init() as core_context:
            core_context.train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
            raise KeyError("oops")
    record = read_record(the_run(in_tmp))
    assert record["state"] == "failed" and "KeyError" in record["error"]


def test_searcher_operations_are_determineds_deprecated_single_operation(in_tmp: Path, monkeypatch) -> None:
    with det.core.init() as core_context:
        with pytest.raises(ValueError, match="does not have the searcher.max_length set"):
            list(core_context.searcher.operations())
    from hookdet.core.searcher import SearcherContext, Unit, searcher_context

    searcher = searcher_context({"searcher": {"max_length": {"epochs": 3}}}, det.core.DummyDistributedContext(),
                                core_context.train)
    assert isinstance(searcher, SearcherContext) and searcher.get_configured_units() == Unit.EPOCHS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        operations = []
        for operation in searcher.operations():
            operations.append(operation.length)
            operation.report_completed(0.1)
    assert operations == [3]
    assert any(issubclass(w.category, FutureWarning) and "deprecated in Determined 0.38.0" in str(w.message)
               for w in caught)


def test_checkpoint_storage_argument_shapes() -> None:
    from hookdet.core.context import storage_block

    assert storage_block("s3://bucket/some/prefix") == {"type": "s3", "bucket": "bucket", "prefix": "some/prefix"}
    assert storage_block("gs://bucket") == {"type": "gcs", "bucket": "bucket"}
    assert storage_block("/data/ckpts") == {"type": "directory", "container_path": "/data/ckpts"}
    with pytest.raises(TypeError, match="checkpoint_storage must be a string, dictionary, or None"):
        storage_block(3)


def test_metadata_of_a_run_reads_back_as_json(in_tmp: Path) -> None:
    with det.core.init() as core_context:
        with pytest.raises(TypeError, match="set_metadata takes a dict"):
            core_context.train.set_metadata(["a"])
    assert json.loads((the_run(in_tmp) / "run.json").read_text())["state"] == "completed"


def test_a_context_a_script_builds_for_its_workers_has_working_collectives() -> None:
    """Two workers (threads here; processes in the tutorial's stage 4) with contexts they built
    themselves, no process group: allgather, gather, broadcast, their _local forms, barrier."""
    import threading

    from hookdet.distributed.store_collectives import free_port

    port = free_port()
    results = {}

    def worker(rank: int) -> None:
        context = det.core.DistributedContext(rank=rank, size=2, local_rank=rank, local_size=2, cross_rank=0,
                                              cross_size=1, chief_ip="127.0.0.1", pub_port=port)
        got = (context.allgather(rank * 10), context.gather(f"r{rank}"), context.broadcast(f"from {rank}"),
               context.allgather_local(rank), context.broadcast_local(rank + 5), context.any_rank(rank == 1))
        context.barrier()
        context.close()
        results[rank] = got

    threads = [threading.Thread(target=worker, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results[0] == ([0, 10], ["r0", "r1"], "from 0", [0, 1], 5, True)
    assert results[1] == ([0, 10], None, "from 0", [0, 1], 5, True)


def test_the_one_process_context_and_the_tensorflow_constructor_are_determineds() -> None:
    from hookdet.errors import UsageError

    alone = det.core.DummyDistributedContext()
    assert (alone.get_rank(), alone.get_size(), alone.allgather(stuff=3), alone.broadcast(stuff="x")) == (0, 1, [3], "x")
    with pytest.raises(UsageError, match=r"from_tf_config\(\) builds a TensorFlow strategy; hookdet runs PyTorch"):
        det.core.DistributedContext.from_tf_config()


def test_the_experimental_context_records_the_checkpoints_the_run_used(in_tmp: Path) -> None:
    class ModelVersion:  # the SDK's shape: a version names its checkpoint
        checkpoint = type("Checkpoint", (), {"uuid": "c-2"})()

    with det.core.init() as core_context:
        core_context.experimental.report_task_using_checkpoint(type("Checkpoint", (), {"uuid": "c-1"})())
        core_context.experimental.report_task_using_model_version(ModelVersion())
        core_context.experimental.report_task_using_checkpoint("c-1")
    assert read_record(the_run(in_tmp))["used_checkpoints"] == ["c-1", "c-2"]


def test_a_context_across_machines_needs_the_chief_address() -> None:
    with pytest.raises(AssertionError, match="chief_ip parameter is required"):
        det.core.DistributedContext(rank=0, size=4, local_rank=0, local_size=2, cross_rank=0, cross_size=2)


@pytest.mark.parametrize("api", ["core", "trainer"])
def test_several_slots_in_one_process_without_a_context_are_refused(in_tmp: Path, api: str) -> None:
    from hookdet.config import parse_experiment_config
    from hookdet.errors import UsageError
    from hookdet.trial_api import cluster_info

    config = parse_experiment_config({"resources": {"slots_per_trial": 2}}, source="test")
    info = cluster_info.local_cluster_info(config, slots=2, run_dir=in_tmp / "run")
    with cluster_info.activated(info), pytest.raises(UsageError) as refused:
        if api == "core":
            det.core.init()
        else:
            with det.pytorch.init():
                pass
    assert "you must provide a valid DistributedContext for a multi-slot task: the trial has 2 slots" in str(
        refused.value)
    assert not (in_tmp / "run").exists()


def test_sharded_stores_refuse_files_and_metadata_two_ranks_disagree_on() -> None:
    from hookdet.core.checkpoint import _shard_problem

    assert _shard_problem([({"a": b"1"}, {"steps_completed": 1}), ({"b": b"2"}, {})]) is None
    problem = _shard_problem([({"a": b"1"}, {"steps_completed": 1, "k": 1}), ({"a": b"2"}, {"k": 2})])
    assert problem == ("refusing to store a sharded checkpoint with conflicts: a written by ranks [0, 1]; "
                       "metadata 'k' given different values by ranks [0, 1]")
    assert "requires a 'steps_completed' item" in _shard_problem([({"a": b"1"}, {}), ({}, {})])


def test_wrap_rank_marks_every_line_with_the_rank() -> None:
    import io

    from hookdet.launch.wrap_rank import prefix_lines

    target = io.BytesIO()
    prefix_lines(io.BytesIO(b"one\ntwo\rthree"), target, b"[rank=3] ")
    assert target.getvalue() == b"[rank=3] one\n[rank=3] two\n[rank=3] three\n"


def test_a_script_that_never_asks_is_interrupted_after_the_grace_period(in_tmp: Path, monkeypatch) -> None:
    """SIGTERM, then a loop that never calls should_preempt(): interrupted after the grace period,
    the checkpoint being stored then discarded whole, the run preempted at its latest checkpoint."""
    import time

    monkeypatch.setenv("HOOKDET_STOP_GRACE_S", "0.3")
    stored = []
    with pytest.raises(SystemExit) as exited:
        with det.core.init() as core_context:
            with core_context.checkpoint.store_path({"steps_completed": 1}) as (path, storage_id):
                (path / "state").write_text("1")
            stored.append(storage_id)
            os.kill(os.getpid(), signal.SIGTERM)
            with core_context.checkpoint.store_path({"steps_completed": 2}) as (path, _):
                (path / "state").write_text("half")
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # a script busy elsewhere, never asking
                    time.sleep(0.01)
    assert exited.value.code == 75
    record = read_record(the_run(in_tmp))
    assert (record["state"], record["latest_checkpoint"]) == ("preempted", stored[0])
    assert sorted(p.name for p in (the_run(in_tmp) / "checkpoints").iterdir()) == stored


def test_a_search_stops_a_core_api_trial_through_should_preempt(in_tmp: Path, monkeypatch) -> None:
    """The stop file a search's worker makes when the searcher stops the trial at a rung: the
    next should_preempt() is true and the trial ends stopped (not preempted: nothing to resume)."""
    stop = in_tmp / "stop-file"
    monkeypatch.setenv("HOOKDET_SEARCH_STOP_FILE", str(stop))
    with det.core.init() as core_context:
        core_context.train.report_validation_metrics(steps_completed=5, metrics={"validation_loss": 1.0})
        assert core_context.preempt.should_preempt() is False
        stop.touch()
        assert core_context.preempt.should_preempt() is True
    assert read_record(the_run(in_tmp))["state"] == "stopped"


def test_a_unitless_max_length_is_the_core_api_searchers_length(in_tmp: Path) -> None:
    """Determined's documented input for the Core API searcher, ``searcher.max_length: 100``: accepted
    for a command entrypoint (a trial class's is refused, naming the units), one operation of 100."""
    from hookdet.config import ConfigError, parse_experiment_config
    from hookdet.trial_api import cluster_info

    searcher = {"name": "single", "metric": "x", "max_length": 100}
    with pytest.raises(ConfigError, match="a bare number has no unit"):
        parse_experiment_config({"entrypoint": "model_def:Trial", "searcher": searcher}, source="t.yaml")
    config = parse_experiment_config({"entrypoint": "python3 train.py", "searcher": searcher}, source="t.yaml")
    assert config.to_dict()["searcher"]["max_length"] == 100  # written back as the file has it
    info = cluster_info.local_cluster_info(config, slots=1, run_dir=in_tmp / "run")
    with cluster_info.activated(info), det.core.init() as core_context, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert core_context.searcher.get_configured_units() is None
        lengths = []
        for operation in core_context.searcher.operations():
            lengths.append(operation.length)
            operation.report_completed(1.0)
    assert lengths == [100]


def test_the_progress_line_shows_a_core_api_scripts_own_progress_and_status(in_tmp: Path, caplog) -> None:
    import logging

    with caplog.at_level(logging.INFO, logger="hookdet"), det.core.init() as core_context:
        core_context.train.report_progress(0.25)
        core_context.train.set_status("warming up")
        core_context.train.report_training_metrics(steps_completed=5, metrics={"loss": 0.5})
    assert any(record.getMessage().startswith("training: batch 5 (25%), warming up") for record in caplog.records), [
        record.getMessage() for record in caplog.records]
