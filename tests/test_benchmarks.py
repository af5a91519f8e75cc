"""The overhead benchmark's harness runs, and hookdet trains bit for bit like the raw loop.

The smoke test runs the README's command on a tiny configuration (one round, a few steps, no
peers) exactly as a user would: a subprocess per mode, the orchestrator comparing final weights.
Both workloads run because the CNN has dropout: its weights match only if hookdet leaves the
global RNG exactly where the raw loop does (same init, same data order, no stray draws).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OVERHEAD = REPO / "benchmarks" / "overhead.py"


def _run(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(OVERHEAD), "--rounds", "1", "--steps", "12", "--warmup", "2",
         "--no-prime", "--json", str(tmp_path / "result.json"), *arguments],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )


@pytest.mark.slow
def test_hookdet_final_weights_equal_the_raw_loop_bitwise(tmp_path: Path) -> None:
    done = _run(tmp_path, "--modes", "raw,hookdet", "--workloads", "mlp,cnn")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "result.json").read_text())
    for workload in ("mlp", "cnn"):
        hookdet = report["summary"][workload]["hookdet"]
        assert hookdet["weights_equal_raw"] is True, (workload, hookdet["max_abs_diff_raw"])
        for key in ("per_step_s", "per_step_cpu_s", "fit_s", "startup_s", "max_rss_kib"):
            assert hookdet[key] > 0 and hookdet[key + "_ratio"] > 0, key
    results = report["results"]
    assert sorted((r["workload"], r["mode"]) for r in results) == [
        ("cnn", "hookdet"), ("cnn", "raw"), ("mlp", "hookdet"), ("mlp", "raw"),
    ]
    assert all(r["steps"] == 12 and r["torch_threads"] == 1 for r in results)
    # hookdet ran its defaults (no plugins: list in the experiment file)
    plugins = next(r["plugins"] for r in results if r["mode"] == "hookdet")
    assert {"checkpoint", "metrics_log", "callbacks"} <= set(plugins)
    assert "| mlp | hookdet |" in done.stdout and "bitwise" in done.stdout


def test_a_peer_that_cannot_run_is_skipped_with_a_message(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-venv" / "bin" / "python"
    done = _run(
        tmp_path, "--modes", "raw,lightning", "--workloads", "mlp",
        "--python", f"lightning={missing}", "--venvs", str(tmp_path / "none"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipping lightning" in done.stdout
    report = json.loads((tmp_path / "result.json").read_text())
    assert list(report["summary"]["mlp"]) == ["raw"]
