"""``hookdet runs / show / compare / plot`` and ``hookdet plugins`` on real runs: completed,
preempted by SIGTERM, failed in the trial, killed with SIGKILL, and resumed with a change."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List

import pytest

from hookdet.runs.metrics import read_reports
from hookdet.cli.commands import main
from hookdet.runs.index import _number
from hookdet.runs.plot import image_size
from tests.support import hookdet_process

REPO = Path(__file__).resolve().parents[1]

EXPERIMENT = """
entrypoint: {entrypoint}
hyperparameters: {{lr: 0.1, records: 8, global_batch_size: 2, train_sleep_s: 0.05, fail_at: 5}}
searcher: {{name: single, metric: validation_loss, max_length: {{batches: {batches}}}}}
min_validation_period: {{batches: 4}}
scheduling_unit: 2
"""


def start(root: Path, name: str, entrypoint: str, batches: int, *extra: str) -> hookdet_process.Hookdet:
    experiment = root / f"{name}.yaml"
    experiment.write_text(textwrap.dedent(EXPERIMENT.format(entrypoint=entrypoint, batches=batches)))
    return hookdet_process.start("run", experiment, "--model-dir", REPO, "--run-dir", root / "runs" / name, *extra,
                                 cwd=root)


def wait_for_reports(run_dir: Path, count: int, process: hookdet_process.Hookdet) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        path = run_dir / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{run_dir}: fewer than {count} reports; {process.poll()}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    slow = "tests.support.progress_trials:SlowTrainingTrial"
    preempted = start(root, "preempted", slow, 400)
    killed = start(root, "killed", slow, 400)
    completed = start(root, "completed", "tests.support.trials:OneWeightTrial", 8)
    failed = start(root, "failed", "tests.support.progress_trials:FailingTrial", 8)
    wait_for_reports(root / "runs" / "preempted", 3, preempted)
    preempted.send_signal(signal.SIGTERM)
    wait_for_reports(root / "runs" / "killed", 3, killed)
    killed.kill()
    assert preempted.wait(timeout=300) == 75, preempted.output()
    killed.wait(timeout=30)
    assert completed.wait(timeout=300) == 0, completed.output()
    assert failed.wait(timeout=300) == 1, failed.output()
    resumed = start(root, "resumed", "tests.support.trials:OneWeightTrial", 8,
                    "--resume", str(root / "runs" / "completed"), "--config", "hyperparameters.lr=0.05",
                    "--config", "searcher.max_length.batches=12")
    assert resumed.wait(timeout=300) == 0, resumed.output()
    return {name: root / "runs" / name for name in ("completed", "preempted", "failed", "killed", "resumed")}


def output_of(capsys: pytest.CaptureFixture, *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


def best(run_dir: Path) -> float:
    return min(r["metrics"]["validation_loss"] for r in read_reports(run_dir) if r["group"] == "validation")


@pytest.mark.slow
def test_runs_lists_each_run_with_its_state(runs: Dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    listing = output_of(capsys, "runs", str(runs["completed"].parent)).splitlines()
    assert listing[0].split() == ["NAME", "STATE", "BATCHES", "BEST", "STARTED", "DIRECTORY"]
    rows = {line.split()[0]: line.split() for line in listing[1:]}
    assert {name: row[1] for name, row in rows.items()} == {
        "completed": "completed", "preempted": "preempted", "failed": "failed", "killed": "killed", "resumed": "completed",
    }
    assert rows["completed"][2] == "8/8" and rows["resumed"][2] == "12/12" and rows["failed"][2] == "5/8"
    for name in ("preempted", "killed"):
        reported = max(r["steps_completed"] for r in read_reports(runs[name]))
        assert int(rows[name][2].split("/")[0]) >= reported >= 4
    assert rows["completed"][3] == f"validation_loss={_number(best(runs['completed']))}"
    assert rows["completed"][-1] == str(runs["completed"])
    assert json.loads((runs["killed"] / "run.json").read_text())["state"] == "running"  # as the file says


@pytest.mark.slow
def test_show_prints_state_config_changes_metrics_and_checkpoints(runs: Dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    shown = output_of(capsys, "show", str(runs["resumed"]))
    assert "  state: completed" in shown and "  batches: 12/12" in shown
    assert f"  resumed from: {runs['completed']}" in shown
    differences = shown.split("config differences from its parent:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert differences == [
        "    hyperparameters.lr: 0.1 -> 0.05",
        '    searcher.max_length.batches: 8 -> 12',
    ]
    records = read_reports(runs["resumed"])
    losses = [r["metrics"]["loss"] for r in records if r["group"] == "training"]
    row = next(line.split() for line in shown.splitlines() if line.split()[:2] == ["training", "loss"])
    assert row[2:] == [str(len(losses)), *(_number(v) for v in (losses[0], losses[-1], min(losses), max(losses)))]
    checkpoint_lines = shown.split("checkpoints (checkpoints):\n", 1)[1].splitlines()
    assert checkpoint_lines and all(line.startswith("  checkpoints/") for line in checkpoint_lines)
    assert checkpoint_lines[-1].split()[1:3] == ["batch", "12"]

    failed = output_of(capsys, "show", str(runs["failed"]))
    assert "  state: failed" in failed and "  error: RuntimeError: deliberate failure at batch 5" in failed
    killed = output_of(capsys, "show", str(runs["killed"]))
    assert "  state: killed" in killed


@pytest.mark.slow
def test_compare_puts_metrics_side_by_side(runs: Dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    table = output_of(capsys, "compare", str(runs["completed"]), str(runs["resumed"]), str(runs["preempted"])).splitlines()
    assert table[0].split() == ["completed", "resumed", "preempted"]
    rows = {" ".join(line.split()[:-3]): line.split()[-3:] for line in table[1:] if line.strip()}
    assert rows["state"] == ["completed", "completed", "preempted"]
    last = [
        _number([r for r in read_reports(runs[name]) if r["group"] == "validation"][-1]["metrics"]["validation_loss"])
        for name in ("completed", "resumed", "preempted")
    ]
    assert rows["validation validation_loss (last)"] == last
    assert rows["best validation_loss"] == [_number(best(runs[name])) for name in ("completed", "resumed", "preempted")]
    assert rows["hyperparameters.lr"] == ["0.1", "0.05", "0.1"]


@pytest.mark.slow
def test_plot_writes_a_png_of_every_metric(runs: Dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from matplotlib import image

    output = tmp_path / "plots" / "metrics.png"
    assert main(["plot", str(runs["completed"]), str(runs["preempted"]), "-o", str(output)]) == 0
    pixels = image.imread(str(output))
    # Panels: validation_loss, and training loss, lr, weight.
    width, height = image_size(4)
    assert pixels.shape[:2] == (height, width) == (600, 1200)
    assert pixels.std() > 0.05 and len({tuple(p) for p in pixels.reshape(-1, pixels.shape[2])[::97]}) > 20


def test_plot_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"group": "training", "steps_completed": 1, "metrics": {"loss": 1.0}}\n')
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"  # what an installation without it sees
        "from hookdet.cli.commands import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run([sys.executable, "-c", code, "plot", str(run_dir), "-o", str(tmp_path / "x.png")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "hookdet: error: hookdet plot needs matplotlib: pip install 'hookdet[plot]'"


def test_show_of_something_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["show", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"hookdet: error: {tmp_path}: not a run directory (no config.json or metrics.jsonl in it)"


def test_plugins_reports_conflicts_only_between_plugins_enabled_together(capsys: pytest.CaptureFixture) -> None:
    output = output_of(capsys, "plugins")
    assert "cannot load" not in output
    entries: Dict[str, List[str]] = {}
    name = ""
    for line in output.splitlines():
        if not line.startswith(" "):
            name = line.split()[0]
            entries[name] = []
        else:
            entries[name].append(line.strip())
    assert "cannot run with: ddp" in entries["horovod"] and "cannot run with: horovod" in entries["ddp"]
    # Precision plugins declare no conflict: a run has one precision by the hook's structure.
    assert not any(line.startswith("cannot run with") for line in entries["apex"] + entries["amp"])
    assert entries["apex"][1].startswith("hooks: ") and "hookdet_make_precision" in entries["apex"][1]
