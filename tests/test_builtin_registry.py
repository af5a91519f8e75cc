"""Every built-in is replaceable, as a table: each built-in plugin, and each third-party stand-in
installed with pip (``tests/fixtures/hookdet-replacements``), through the same rows (Composer's
registry tests are the model): it loads alone; ``no:<it>`` still trains; an unknown option is
refused naming the experiment file and line; its ``state_dict`` round-trips; its
``hookdet_unconfigure`` may run twice. Each plugin's rows run in a child process of their own
(``tests/support/registry_rows.py``) that sees the pip-installed package's entry points.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

from hookdet.plugins.manager import installed_plugins
from tests.support.packages import pip_install

REPO = Path(__file__).resolve().parents[1]
REPLACEMENTS = REPO / "tests" / "fixtures" / "hookdet-replacements"
STAND_INS = ("csv_writer", "bf16_autocast", "line_progress")  # (its flat_storage is a storage type, not a plugin)


def builtin_names():
    return sorted(name for name, target in installed_plugins().items() if target.startswith("hookdet.plugins.builtin."))


def format_table(table: Dict[str, Dict[str, str]]) -> str:
    rows = list(next(iter(table.values())))
    width = max(len(name) for name in table) + 2
    lines = ["plugin".ljust(width) + " | ".join(rows)]
    for name, results in table.items():
        cells = [results[label].split(":")[0].ljust(len(label)) for label in rows]
        lines.append(name.ljust(width) + " | ".join(cells))
    return "\n".join(lines)


@pytest.mark.slow
def test_every_builtin_and_a_pip_installed_stand_in_pass_the_same_rows(tmp_path: Path) -> None:
    site = pip_install(REPLACEMENTS, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "required.json").write_text(json.dumps({}))
    names = builtin_names()
    assert len(names) == 13, names
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), XDG_CACHE_HOME=str(tmp_path / "cache"),
               OMP_NUM_THREADS="1")
    # Each plugin in a process of its own (forked from one that imported torch once): nothing one
    # leaves behind reaches the next.
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.registry_rows", str(work), *names, *STAND_INS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    table: Dict[str, Dict[str, str]] = json.loads(result.stdout.strip().splitlines()[-1])
    print("\n" + format_table(table))
    failures = {f"{name}: {label}": outcome for name, results in table.items()
                for label, outcome in results.items() if outcome.startswith("FAIL")}
    assert failures == {}
    horovod_missing = importlib.util.find_spec("horovod") is None
    for name, results in table.items():
        assert results["loads alone"] == results["no:X trains"] == results["unknown option at file:line"] == "ok", name
        for label, outcome in results.items():  # "n/a" only for what the plugin does not have
            if outcome.startswith("n/a"):
                allowed = ("n/a: keeps no state", "n/a: no hookdet_unconfigure")
                assert outcome in allowed or (name == "horovod" and horovod_missing), (name, label, outcome)
    # the stateful built-ins do round-trip, and the ones that clean up may clean up twice
    assert {name for name, results in table.items() if results["state_dict round-trips"] == "ok"} >= {"checkpoint", "amp", "apex"}
    assert {name for name, results in table.items() if results["unconfigure twice"] == "ok"} >= {
        "preemption", "tensorboard", "progress", "ddp", "profiler", "hook_timing"}
