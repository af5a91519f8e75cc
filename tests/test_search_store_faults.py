"""A search's store under faults, through ``hookdet run``: the store deleted or overwritten while
trials train ends the search in one line naming it (its trial processes stopped, nothing left
running); a journal store whose last record was torn by a killed writer resumes without it."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.support import hookdet_process
from tests.test_search_run import FIXTURES, env, not_warnings, summary
from tests.test_searcher_block import GRID, experiment

pytest.importorskip("optuna")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault", ["deleted", "overwritten"])
def test_a_store_lost_mid_search_ends_it_in_one_line(tmp_path: Path, fault: str) -> None:
    config = experiment(tmp_path, "grid.yaml", {**GRID, "max_length": {"batches": 40},
                                                "max_concurrent_trials": 1})
    slow = dict(env(tmp_path), SEARCH_TEST_SECONDS_PER_BATCH="0.1")
    driver = hookdet_process.start("run", config, "--run-dir", "search", "--model-dir", FIXTURES, cwd=tmp_path, env=slow)
    trials_log = tmp_path / "trials.log"
    deadline = time.time() + 120
    while not trials_log.exists() and time.time() < deadline and driver.poll() is None:
        time.sleep(0.05)  # the first trial is training
    trial_pid = json.loads(trials_log.read_text().splitlines()[0])["pid"]
    store = tmp_path / "search" / "search.db"
    if fault == "deleted":
        store.unlink()
    else:
        store.write_bytes(b"this is not a database" * 100)
    out, err = driver.communicate(timeout=300)
    lines = not_warnings(err)
    assert driver.returncode == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith(f"hookdet: error: search store sqlite:///{store.resolve()} is lost or damaged (")
    assert lines[0].endswith("the search stopped: its trials keep their checkpoints, and hookdet run "
                             "--resume continues it once the store is back")
    assert not alive(trial_pid)  # no trial process left behind


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_torn_last_journal_record_is_dropped_and_the_search_resumes(tmp_path: Path) -> None:
    """A journal store whose writer was killed mid-record: ``--resume`` drops the torn record
    with one warning and the search ends as the same search without the tear."""
    config = experiment(tmp_path, "grid.yaml", {**GRID, "max_concurrent_trials": 1})
    journal = tmp_path / "store.log"
    first = hookdet_process.run("run", config, "--run-dir", "search", "--model-dir", FIXTURES, "--storage",
                                f"journal:{journal}", cwd=tmp_path, env=env(tmp_path), timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    expected = summary(tmp_path / "search")
    whole = journal.read_bytes()
    with open(journal, "ab") as handle:
        handle.write(b'{"op_code": 5, "worker_id": "torn", "trial_id": 0, "user_at')
    resumed = hookdet_process.run("run", config, "--resume", "search", "--model-dir", FIXTURES, "--storage",
                                  f"journal:{journal}", cwd=tmp_path, env=env(tmp_path), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    assert f"search store {journal}: dropped a torn last record" in resumed.stderr
    assert journal.read_bytes().startswith(whole) and not journal.read_bytes().endswith(b"user_at")
    assert summary(tmp_path / "search") == expected
