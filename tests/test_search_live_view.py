"""A search's live view in a terminal (tested in a pseudo-terminal, as the single run's view
is): the counts by state, the best so far, a row per trial at work with its batch and latest
metric, and the decision lines above it; off a terminal, only the decision lines."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.builtin_plugins.test_progress import open_terminal, read_until_closed, screen_lines
from tests.support import hookdet_process
from tests.test_search_run import FIXTURES, HOOKDET, env

pytest.importorskip("optuna")

SLOW = {"SEARCH_TEST_SECONDS_PER_BATCH": "0.3"}  # trials that stay long enough to be seen at work
SEARCH = ["run", str(FIXTURES / "grid.yaml"), "--run-dir", "grid", "--workers", "2"]


@pytest.mark.slow
def test_a_search_in_a_terminal_shows_its_trials_at_work(tmp_path: Path) -> None:
    controller, terminal = open_terminal(columns=160)
    # cold: its output goes to a terminal
    process = subprocess.Popen([*HOOKDET, *SEARCH], stdin=terminal, stdout=terminal, stderr=terminal, cwd=tmp_path,
                               close_fds=True, env={**env(tmp_path), **SLOW, "COLUMNS": "160"})
    os.close(terminal)
    screen = screen_lines(read_until_closed(controller, timeout=300))
    assert process.wait(timeout=60) == 0, "\n".join(screen[-40:])
    counts = [line for line in screen if re.match(r"^search: (running|queued|completed|stopped|invalid_hp)", line)]
    rows = [line for line in screen if re.match(r"^  trial \d+ +batch \d+ of 8 +(validation_loss \S+ @ \d+|-)$", line)]
    assert any("running 2" in line for line in counts), counts[-5:]  # two workers, two trials at work
    assert rows, screen[-40:]
    assert any(re.search(r" \| best: trial \d+, validation_loss \S+ \(", line) for line in counts), counts[-5:]
    decisions = [line for line in screen if line.startswith("search: trial ")]
    assert len(decisions) >= 4, screen[-40:]


def test_off_a_terminal_a_search_prints_its_decision_lines_only(tmp_path: Path) -> None:
    result = hookdet_process.run(*SEARCH, cwd=tmp_path, env=env(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("search: trial ") for line in lines)
    assert not any(re.match(r"^search: (running|queued)", line) or line.startswith("  trial ") for line in lines)
    assert "\x1b[" not in result.stdout
