"""Storage that cannot hang or silently lose: a real hanging S3 endpoint (a socket on 127.0.0.1
that accepts and never answers), a closed port, a full disk (a real tmpfs) at start and in the
middle of a checkpoint, and SIGHUP.

Issue 19's cases 5, 7 (SIGHUP) and 8 (disk full). Each ends with its exit status and one line
naming the cause, within a bound far below the test's, and the checkpoints already written
stay intact.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import lookup as lookup
from hookdet.checkpoints.s3 import S3_TIMEOUTS, S3Storage
from tests.faults.harness import assert_one_line, checkpoint_metadata, finish, start, wait_until, write_config
from tests.faults.test_bad_input import hookdet, one_line
from tests.support.s3_fixture import s3_server  # noqa: F401  (a fixture)


@contextlib.contextmanager
def silent_endpoint() -> Iterator[str]:
    """An HTTP endpoint on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: List[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        server.close()


def closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("endpoint", ["hangs", "refuses"])
def test_an_s3_endpoint_that_hangs_or_refuses_fails_before_the_first_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture, endpoint: str
) -> None:
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(silent_endpoint()) if endpoint == "hangs" else closed_port()
        storage = {"type": "s3", "bucket": "b", "endpoint_url": url, "access_key": "k", "secret_key": "s"}
        config = write_config(tmp_path / "exp.yaml", checkpoint_storage=storage)
        started = time.monotonic()
        assert hookdet(f"S3 endpoint {endpoint}", "run", str(config), "--run-dir", str(tmp_path / "run")) == 2
        assert time.monotonic() - started < 20  # the probe's 5 s, not 185 s per checkpoint
    one_line(capsys, "checkpoint storage s3://b", url, "unreachable")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no batch was trained


def test_s3_requests_are_bounded_by_botocore_timeouts_and_retries() -> None:
    config = S3Storage(bucket="b", endpoint_url="http://127.0.0.1:9").client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (S3_TIMEOUTS["connect_timeout"], S3_TIMEOUTS["read_timeout"])
    assert config.retries == {"total_max_attempts": S3_TIMEOUTS["max_attempts"], "mode": "standard"}


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real, small tmpfs at ``path`` (needs root); the test is skipped where mounting fails."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_disk_full_at_start_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with tmpfs(tmp_path / "disk", "256k") as disk:
        with contextlib.suppress(OSError):
            with open(disk / "filler", "wb") as filler:
                while True:
                    filler.write(b"\0" * 65536)
        config = write_config(tmp_path / "exp.yaml")
        assert hookdet("disk full at start", "run", str(config), "--run-dir", str(disk / "run")) == 2
        one_line(capsys, str(disk / "run"), "disk full")


def test_disk_full_during_a_checkpoint_fails_naming_it_and_keeps_the_previous(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # 0.8 M parameters with Adam: about 9.5 MB a checkpoint; the second does not fit.
    with tmpfs(tmp_path / "disk", "14m") as disk:
        config = write_config(tmp_path / "exp.yaml", {"hidden": 512, "layers": 3})
        assert hookdet("disk full in a checkpoint", "run", str(config), "--run-dir", str(disk / "run")) == 2
        one_line(capsys, "could not be written", "disk full", "earlier checkpoints are intact")
        checkpoints = disk / "run" / "checkpoints"
        (survivor, metadata), = lookup.find_checkpoints(checkpoints)
        assert metadata["steps_completed"] == 4
        fmt.verify(survivor)
        assert not [p for p in checkpoints.iterdir() if p.name.startswith(".")]  # no half-write left


@pytest.mark.slow
def test_sighup_stops_like_sigterm(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = start(["run", str(write_config(tmp_path / "exp.yaml", {"sleep": 0.3})), "--run-dir", str(run_dir)])
    wait_until(lambda: (run_dir / "metrics.jsonl").exists(), process, "training")
    hung_up = time.monotonic()
    process.send_signal(signal.SIGHUP)
    status, stdout, stderr = finish(process, "SIGHUP", since=hung_up)
    assert status == 75, stderr[-3000:]
    assert "received SIGHUP" in stderr and "preempted" in stdout
    stopped = max(m["steps_completed"] for m in checkpoint_metadata(run_dir / "checkpoints"))
    assert 1 <= stopped < 12


def test_disk_full_at_resume_is_one_line_and_keeps_the_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with tmpfs(tmp_path / "disk", "4m") as disk:
        config = write_config(tmp_path / "exp.yaml")
        run_dir = disk / "run"
        assert hookdet("train before the disk fills", "run", str(config), "--run-dir", str(run_dir)) == 0
        before = checkpoint_metadata(run_dir / "checkpoints")
        capsys.readouterr()
        with contextlib.suppress(OSError):
            with open(disk / "filler", "wb") as filler:
                while True:
                    filler.write(b"\0" * 4096)
        status = hookdet("disk full at resume", "run", str(config), "--resume", str(run_dir),
                         "--config", "searcher.max_length.batches=24")
        assert status == 2
        one_line(capsys, "disk full")
        assert checkpoint_metadata(run_dir / "checkpoints") == before
        for metadata in before:
            fmt.verify(run_dir / "checkpoints" / metadata["uuid"])


#: Root without the capabilities that let it write anywhere: permissions then apply to it too.
WITHOUT_OVERRIDE = ("setpriv", "--bounding-set=-dac_override,-dac_read_search",
                    "--inh-caps=-dac_override,-dac_read_search")


@pytest.mark.parametrize("where", ["run directory", "checkpoint storage"])
def test_permission_denied_is_one_line_naming_the_path(tmp_path: Path, where: str) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if where == "run directory":
        config, run_dir, culprit = write_config(tmp_path / "exp.yaml"), locked / "run", locked / "run"
    else:
        culprit = locked / "checkpoints"
        config = write_config(tmp_path / "exp.yaml", checkpoint_storage={"type": "directory", "container_path": str(culprit)})
        run_dir = tmp_path / "run"
    prefix = WITHOUT_OVERRIDE if os.geteuid() == 0 else ()
    status, _, stderr = finish(start(["run", str(config), "--run-dir", str(run_dir)], prefix=prefix),
                               f"permission denied: {where}")
    assert status == 2, stderr[-3000:]
    line = assert_one_line(stderr, str(culprit))
    assert "permission" in line.lower(), line
    assert "batch 1" not in stderr  # refused before training


@pytest.mark.parametrize("fault", ["records of another user", "metrics.jsonl a directory"])
def test_a_run_directory_whose_records_cannot_be_written_is_refused_before_the_resume_starts(
        tmp_path: Path, fault: str) -> None:
    """A run directory restored from another user (its records read-only to this one), or one
    whose metrics.jsonl was replaced by a folder: ``--resume`` says so in one line naming the
    file, before anything starts, and leaves the run's checkpoints as they were."""
    config, run_dir = write_config(tmp_path / "exp.yaml"), tmp_path / "run"
    status, _, stderr = finish(start(["run", str(config), "--run-dir", str(run_dir),
                                      "--config", "searcher.max_length.batches=4"]), "first run")
    assert status == 0, stderr[-3000:]
    before = checkpoint_metadata(run_dir / "checkpoints")
    prefix: tuple = ()
    if fault == "metrics.jsonl a directory":
        (run_dir / "metrics.jsonl").unlink()
        (run_dir / "metrics.jsonl").mkdir()
        culprit = f"{run_dir / 'metrics.jsonl'} is a directory, not the run's metrics.jsonl"
    else:
        for path in run_dir.rglob("*"):
            path.chmod(0o555 if path.is_dir() else 0o444)
        run_dir.chmod(0o555)
        prefix = WITHOUT_OVERRIDE if os.geteuid() == 0 else ()
        culprit = f"{run_dir / 'run.json'} cannot be written (no permission for user {os.getuid()})"
    try:
        status, _, stderr = finish(start(["run", str(config), "--resume", str(run_dir)], prefix=prefix), fault)
    finally:
        for path in [run_dir, *run_dir.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert status == 2, stderr[-3000:]
    assert_one_line(stderr, culprit)
    assert checkpoint_metadata(run_dir / "checkpoints") == before


class SwitchableProxy:
    """A TCP proxy on 127.0.0.1 in front of a real S3 server that, once :meth:`go_silent` is
    called, keeps every connection open and answers nothing: an endpoint that hangs mid-run."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.silent = threading.Event()
        self.closed = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.sockets: List[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def go_silent(self) -> None:
        self.silent.set()

    def close(self) -> None:
        self.closed.set()
        for sock in [self.server, *self.sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.sockets.append(client)
            if self.silent.is_set():
                continue  # accepted, never answered
            upstream = socket.create_connection(self.upstream)
            self.sockets.append(upstream)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while not self.closed.is_set():
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            if not self.silent.is_set():  # once silent, bytes go nowhere and nothing answers
                with contextlib.suppress(OSError):
                    sink.sendall(data)


@pytest.mark.slow
def test_an_s3_endpoint_that_hangs_mid_run_fails_the_next_checkpoint_in_bounded_time(
    tmp_path: Path, s3_server: dict
) -> None:
    proxy = SwitchableProxy(s3_server["endpoint_url"])
    try:
        storage = {"type": "s3", "bucket": s3_server["bucket"], "prefix": "live", "endpoint_url": proxy.url,
                   "access_key": s3_server["access_key"], "secret_key": s3_server["secret_key"]}
        config = write_config(tmp_path / "exp.yaml", {"sleep": 0.2}, checkpoint_storage=storage,
                              searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                                        "max_length": {"batches": 40}})
        direct = S3Storage(bucket=s3_server["bucket"], prefix="live", endpoint_url=s3_server["endpoint_url"],
                           access_key=s3_server["access_key"], secret_key=s3_server["secret_key"])
        process = start(["run", str(config), "--run-dir", str(tmp_path / "run")],
                        env={"HOOKDET_S3_READ_TIMEOUT": "2", "HOOKDET_S3_CONNECT_TIMEOUT": "2",
                             "HOOKDET_S3_MAX_ATTEMPTS": "2"})
        wait_until(lambda: len(direct.list_ids()) >= 1, process, "a first checkpoint in S3", timeout=120)
        proxy.go_silent()
        silenced = time.monotonic()
        status, _, stderr = finish(process, "S3 endpoint hangs mid-run", since=silenced)
        assert status == 2, stderr[-3000:]
        line = assert_one_line(stderr, proxy.url)
        assert "checkpoint" in line, line
        assert time.monotonic() - silenced < 60  # timeouts and retries, not minutes per request
        survivors = direct.list_ids()
        assert survivors  # the checkpoint written before the endpoint hung is still there, whole
        with direct.restore_path(survivors[0]) as restored:
            fmt.verify(Path(restored))
    finally:
        proxy.close()
