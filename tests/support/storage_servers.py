"""Real storage servers on loopback for the storage tests, beside ``s3_fixture`` (moto's S3):

- ``gcs_server``: gcp-storage-emulator (PyPI), Google Cloud Storage's JSON API, in memory; the
  google-cloud-storage client reaches it through ``STORAGE_EMULATOR_HOST``.
- ``azure_server``: Azurite (npm), Microsoft's own Blob Storage emulator, as a child process
  (``.ci/run`` installs it under ``.tools/azurite``).
- ``flatfs_installed``: ``tests/fixtures/hookdet-flatfs``, a storage type of another package,
  installed by pip into a folder this test process (and its children) put on ``sys.path``.

One server of each kind per test process; each test gets a fresh bucket or container. Imported
by name from a test module, as ``s3_fixture``'s fixture is.
"""
from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from hookdet.launch.orphans import child_setup_for
from tests.support.packages import pip_install

REPO = Path(__file__).resolve().parents[2]
AZURITE = REPO / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
#: Azurite's well-known development account (published by Microsoft; it guards nothing).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

#: The system's temporary folder, read before any test points ``tempfile`` elsewhere.
SYSTEM_TMP = tempfile.gettempdir()

_lock = threading.Lock()
_started: Dict[str, Any] = {}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, process: Any = None, timeout: float = 60) -> None:
    """Until something accepts connections on ``port`` (or ``process`` died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}) before it listened")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on 127.0.0.1:{port} within {timeout} s")


def gcs_endpoint() -> str:
    with _lock:
        if "gcs" not in _started:
            from gcp_storage_emulator.server import create_server

            port = free_port()
            server = create_server("127.0.0.1", port, in_memory=True)
            server.start()
            atexit.register(server.stop)
            wait_for_port(port)
            _started["gcs"] = f"http://127.0.0.1:{port}"
        return _started["gcs"]


@pytest.fixture
def gcs_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Dict[str, str]]:
    """A fresh bucket on a Google Cloud Storage emulator at 127.0.0.1; the environment points
    the client library (here and in child processes) at it."""
    pytest.importorskip("google.cloud.storage", reason="GCS tests need google-cloud-storage (hookdet[test])")
    endpoint = gcs_endpoint()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "hookdet-tests")
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    bucket = f"hookdet-{uuid.uuid4().hex[:12]}"
    storage.Client(project="hookdet-tests", credentials=AnonymousCredentials()).create_bucket(bucket)
    yield {"endpoint": endpoint, "bucket": bucket}


def azure_connection_string(port: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
    )


def azure_port() -> int:
    with _lock:
        if "azure" not in _started:
            if not AZURITE.exists():
                raise RuntimeError(
                    f"Azurite is not installed at {AZURITE}: "
                    "npm install --prefix .tools/azurite azurite@3 (as .ci/run does)"
                )
            port = free_port()
            location = tempfile.mkdtemp(prefix="hookdet-azurite-", dir=SYSTEM_TMP)
            process = subprocess.Popen(
                [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", location,
                 "--skipApiVersionCheck", "--silent", "--loose"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=child_setup_for(os.getpid()),  # it ends with this process, however that ends
            )
            atexit.register(process.kill)
            atexit.register(shutil.rmtree, location, True)
            wait_for_port(port, process)
            _started["azure"] = port
        return _started["azure"]


@pytest.fixture
def azure_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Dict[str, str]]:
    """A fresh container on Azurite at 127.0.0.1, with its connection string (also set as
    ``AZURE_STORAGE_CONNECTION_STRING`` for child processes)."""
    pytest.importorskip("azure.storage.blob", reason="Azure tests need azure-storage-blob (hookdet[test])")
    from azure.storage.blob import BlobServiceClient

    connection_string = azure_connection_string(azure_port())
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection_string)
    container = f"hookdet-{uuid.uuid4().hex[:12]}"
    BlobServiceClient.from_connection_string(connection_string).create_container(container)
    yield {"connection_string": connection_string, "container": container}


@pytest.fixture(scope="session")
def flatfs_installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``hookdet-flatfs`` installed by pip into a folder put on ``sys.path`` and ``PYTHONPATH``
    (so child processes find its entry point too); the folder."""
    site = pip_install(REPO / "tests" / "fixtures" / "hookdet-flatfs", tmp_path_factory.mktemp("flatfs"))
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    from stevedore import ExtensionManager

    from hookdet.checkpoints.registry import GROUP, storage_class

    # stevedore reads a group's entry points once per process; this process installed one since.
    ExtensionManager.ENTRY_POINT_CACHE.pop(GROUP, None)
    storage_class.cache_clear()
    return site
