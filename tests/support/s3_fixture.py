"""A real S3-compatible server on loopback for tests: moto in server mode.

Use it from any test module with ``from tests.support.s3_fixture import s3_server`` (pytest finds the
fixture by the imported name), or re-export it from a ``conftest.py``. The module is plain
Python so it imports the same way from either place.

One moto server starts the first time a test asks for it and serves the rest of the test
process; each test gets its own fresh bucket, so tests never see each other's objects. The
server speaks real HTTP on 127.0.0.1, so subprocesses started by a test can reach it too.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import Any, List, Tuple

import pytest

S3_TEST_ACCESS_KEY = "hookdet-test-access-key"
S3_TEST_SECRET_KEY = "hookdet-test-secret-key"
S3_TEST_REGION = "us-east-1"

#: The system's temporary folder, read before any test points ``tempfile`` elsewhere.
_SYSTEM_TMP = tempfile.gettempdir()

_server_lock = threading.Lock()
_running_server: Any = None
_running_endpoint_url: str | None = None


def moto_endpoint_url() -> str:
    """Start the shared moto server on a free loopback port if needed; return its URL."""
    global _running_server, _running_endpoint_url
    with _server_lock:
        if _running_endpoint_url is None:
            # moto's request recorder (which tests may switch on) writes where this says, read
            # once when moto is imported; by default it would write into the working directory.
            recordings = tempfile.mkdtemp(prefix="hookdet-moto-", dir=_SYSTEM_TMP)
            os.environ.setdefault("MOTO_RECORDER_FILEPATH", os.path.join(recordings, "recording"))
            from moto.server import ThreadedMotoServer

            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            host, port = server.get_host_and_port()
            _running_server = server
            _running_endpoint_url = f"http://{host}:{port}"
            atexit.register(server.stop)
        return _running_endpoint_url


@functools.cache
def s3_admin_client(endpoint_url: str) -> Any:
    """A boto3 client with the test credentials, built once: building one takes ~0.2 s."""
    import boto3

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=S3_TEST_ACCESS_KEY,
        aws_secret_access_key=S3_TEST_SECRET_KEY,
        region_name=S3_TEST_REGION,
    )


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A fresh, empty bucket on a real S3-compatible server at 127.0.0.1.

    Yields ``{"endpoint_url", "bucket", "access_key", "secret_key", "region"}``. Dummy AWS
    credentials and region are also set in the environment (and so inherited by subprocesses),
    and the user's own AWS config files are hidden, so nothing can reach real AWS.
    """
    pytest.importorskip("boto3", reason="S3 tests need boto3 (pip install hookdet[test])")
    endpoint_url = moto_endpoint_url()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_TEST_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_TEST_SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", S3_TEST_REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)

    bucket = f"hookdet-test-{uuid.uuid4().hex[:16]}"
    client = s3_admin_client(endpoint_url)
    client.create_bucket(Bucket=bucket)
    yield {
        "endpoint_url": endpoint_url,
        "bucket": bucket,
        "access_key": S3_TEST_ACCESS_KEY,
        "secret_key": S3_TEST_SECRET_KEY,
        "region": S3_TEST_REGION,
    }
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket):
        for item in page.get("Contents", ()):
            client.delete_object(Bucket=bucket, Key=item["Key"])
    client.delete_bucket(Bucket=bucket)


@contextlib.contextmanager
def recording(endpoint_url: str) -> Iterator[List[Tuple[str, str]]]:
    """The (method, URL) of every request the S3 server answers inside the block (moto's own
    recorder, on the server)."""
    import requests

    made: List[Tuple[str, str]] = []
    requests.post(f"{endpoint_url}/moto-api/recorder/reset-recording", timeout=10)
    requests.post(f"{endpoint_url}/moto-api/recorder/start-recording", timeout=10)
    try:
        yield made
    finally:
        requests.post(f"{endpoint_url}/moto-api/recorder/stop-recording", timeout=10)
        lines = requests.get(f"{endpoint_url}/moto-api/recorder/download-recording", timeout=60).text
        made.extend((entry["method"], entry["url"]) for entry in map(json.loads, lines.splitlines()))
