"""A search's trials in TensorBoard's HParams tab: TensorBoard itself (its server, on 127.0.0.1)
pointed at the search directory lists the searched hyperparameters and the searcher metric, and
one session per trial with its hyperparameter values and its metric."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict

import pytest

from tests.test_searcher_block import GRID, experiment, hookdet
from tests.test_search_run import FIXTURES


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ask(port: int, route: str, body: Dict[str, Any]) -> Dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/data/plugin/hparams/{route}",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tensorboard_shows_every_trial_of_a_search_in_its_hparams_tab(tmp_path: Path) -> None:
    config = experiment(tmp_path, "grid.yaml", GRID)
    ran = hookdet(tmp_path, "run", str(config), "--run-dir", "grid", "--model-dir", str(FIXTURES))
    assert ran.returncode == 0, ran.stderr[-3000:]
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(tmp_path / "grid"),
                               "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, groups = time.monotonic() + 120, []
        while time.monotonic() < deadline:  # until it has read both trials
            try:
                groups = ask(port, "session_groups", {"experimentName": "", "allowedStatuses": [
                    "STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
                    "colParams": [], "startIndex": 0, "sliceSize": 100}).get("sessionGroups", [])
            except OSError:
                groups = []
            if len(groups) == 2:
                break
            time.sleep(0.5)
        infos = ask(port, "experiment", {"experimentName": ""})
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert {info["name"] for info in infos["hparamInfos"]} >= {"optimizer.lr", "global_batch_size"}, infos
    assert [info["name"]["tag"] for info in infos["metricInfos"]] == ["validation/validation_loss"], infos
    assert len(groups) == 2, groups
    assert sorted(group["hparams"]["optimizer.lr"] for group in groups) == [0.01, 0.3]
    summary = {row["trial"]: row for row in csv_rows(tmp_path / "grid" / "summary.csv")}
    for group in groups:  # each trial's searcher metric beside its hyperparameters: its last validation
        (value,) = [value["value"] for value in group["metricValues"] if value["name"]["tag"] == "validation/validation_loss"]
        (row,) = [row for row in summary.values() if float(row["hp.optimizer.lr"]) == group["hparams"]["optimizer.lr"]]
        assert value == pytest.approx(float(row["last"]), rel=1e-6), (group, row)


def csv_rows(path: Path) -> list:
    import csv

    with open(path) as handle:
        return list(csv.DictReader(handle))
