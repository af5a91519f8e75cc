"""A run of two processes in a terminal: ``hookdet run``'s launcher draws the chief's live view
with a row per rank (``hookdet/distributed/ranks_view.py``), and the ranks print no progress
lines over it. (Off a terminal the chief prints its plain progress lines, as a single process
does: ``tests/faults/test_launcher.py``'s SIGTERM test checks them.)
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.builtin_plugins.test_progress import open_terminal, read_until_closed, screen_lines

REPO = Path(__file__).resolve().parents[1]
HOOKDET = Path(sys.executable).with_name("hookdet")

EXPERIMENT = """
entrypoint: tests.support.progress_trials:SlowTrainingTrial
hyperparameters: {lr: 0.1, records: 16, global_batch_size: 4, train_sleep_s: 0.1}
searcher: {name: single, metric: validation_loss, max_length: {batches: 30}}
min_validation_period: {batches: 10}
resources: {slots_per_trial: 2}
"""


def command(tmp_path: Path) -> list:
    experiment = tmp_path / "two.yaml"
    experiment.write_text(textwrap.dedent(EXPERIMENT))
    return [str(HOOKDET), "run", str(experiment), "--model-dir", str(REPO), "--run-dir", str(tmp_path / "run")]


@pytest.mark.slow
def test_in_a_terminal_the_launcher_draws_the_chiefs_view_and_a_row_per_rank(tmp_path: Path) -> None:
    controller, terminal = open_terminal(columns=120)
    process = subprocess.Popen(command(tmp_path), stdin=terminal, stdout=terminal, stderr=terminal, cwd=tmp_path,
                               close_fds=True, env={**os.environ, "COLUMNS": "120", "OMP_NUM_THREADS": "1"})
    os.close(terminal)
    screen = read_until_closed(controller, timeout=300)
    assert process.wait(timeout=60) == 0, screen
    lines = screen_lines(screen)
    # The chief's bar, as a single process draws it, up to the end.
    bars = [line for line in lines if re.match(r"epoch \d+/\d+ .* \d+/30 batches", line)]
    assert bars and re.search(r" 30/30 batches 100%", bars[-1]), bars[-3:]
    # A row per rank, each rank's own batch from its beats, both reaching the end.
    for rank in (0, 1):
        rows = [line for line in lines if re.match(rf" *rank {rank} .* (\d+)/30 batches$", line)]
        assert rows, lines[-20:]
        counts = [int(re.search(r"(\d+)/30 batches$", row).group(1)) for row in rows]
        assert counts == sorted(counts) and counts[-1] == 30 and len(set(counts)) > 1, counts
    # The latest report's metrics, from the run's metrics.jsonl, under the bar.
    assert any(re.match(r" *training  @ batch 30  loss=", line) for line in lines), lines[-20:]
    assert any(re.match(r"validation  @ batch 30  validation_loss=", line) for line in lines), lines[-20:]
    # The ranks print no progress lines of their own over it.
    assert not [line for line in lines if "training: batch" in line or "validation: batch" in line]
    assert lines[-1].startswith("  latest checkpoint:") or "hookdet: completed after 30 batches" in screen
