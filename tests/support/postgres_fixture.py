"""A real PostgreSQL server on 127.0.0.1 for tests, from Debian's ``postgresql`` package.

:func:`postgres_server` makes a throwaway cluster (``initdb`` into a temporary directory, as the
``postgres`` user when the tests run as root, since PostgreSQL refuses to run as root), starts it
on a free port, makes one database and yields its SQLAlchemy URL; the cluster is stopped and
deleted afterwards. Without the server binaries the test fails in CI (``.ci/run`` installs the
package) and is skipped elsewhere.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, List

import pytest


def _server_binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        reason = "needs Debian's postgresql package (apt-get install postgresql; .ci/run installs it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason)
    return Path(found[-1]).parent


def _as_server_user(command: List[str]) -> List[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def postgres_server(database: str = "search") -> Iterator[str]:
    """A running PostgreSQL cluster with ``database``; yields ``postgresql+psycopg2://...``."""
    binaries = _server_binaries()
    home = Path(tempfile.mkdtemp(prefix="hookdet-pg-"))
    if os.geteuid() == 0:
        shutil.chown(home, "postgres", "postgres")
    data, port = home / "data", _free_port()
    run = lambda *command: subprocess.run(  # noqa: E731
        _as_server_user([str(binaries / command[0]), *command[1:]]), check=True, capture_output=True, timeout=120)
    try:
        run("initdb", "-D", str(data), "-U", "hookdet", "-A", "trust", "--no-sync")
        run("pg_ctl", "-D", str(data), "-w", "-l", str(home / "server.log"), "-o",
            f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        run("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "hookdet", database)
        yield f"postgresql+psycopg2://hookdet@127.0.0.1:{port}/{database}"
    finally:
        subprocess.run(_as_server_user([str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)
