"""A plugin from another package: pip-installed, found by entry-point name, configured from YAML.

The sample package (``tests/fixtures/hookdet-sample-plugin``) is installed with pip into a
temporary directory that only the child processes put on ``sys.path``, so nothing stays installed
in the environment the other tests run in.
"""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Dict

import pytest

from hookdet.runs.metrics import read_reports
from hookdet.plugins.manager import installed_plugins
from tests.support import hookdet_process
from tests.support.packages import pip_install

REPO = Path(__file__).resolve().parents[1]
SAMPLE_PACKAGE = REPO / "tests" / "fixtures" / "hookdet-sample-plugin"


@pytest.fixture(scope="module")
def sample_environment(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    """Environment variables under which the sample plugin is installed (and hookdet is not touched)."""
    root = tmp_path_factory.mktemp("third_party")
    site = pip_install(SAMPLE_PACKAGE, root)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    env["XDG_CACHE_HOME"] = str(root / "cache")  # stevedore caches entry-point scans there
    return env


def test_hookdet_plugins_lists_it(sample_environment: Dict[str, str]) -> None:
    listed = hookdet_process.run("plugins", env=sample_environment)
    assert listed.returncode == 0, listed.stderr
    listing = listed.stdout
    entry = listing[listing.index("sample\n"):].split("\n")[:3]
    assert entry == [
        "sample",
        "  from: hookdet_sample:SamplePlugin",
        "  hooks: hookdet_report_metrics, hookdet_train_batch_end, hookdet_unconfigure",
    ]
    assert "sample" not in installed_plugins(), "the sample plugin leaked into the test environment"


@pytest.mark.slow
def test_a_yaml_plugins_list_loads_it_by_name_with_its_options(
    sample_environment: Dict[str, str], tmp_path: Path
) -> None:
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(textwrap.dedent(
        """
        entrypoint: tests.support.trials:OneWeightTrial
        hyperparameters: {lr: 0.1, records: 8, global_batch_size: 2}
        searcher: {name: single, metric: validation_loss, max_length: {batches: 10}}
        min_validation_period: {batches: 5}
        scheduling_unit: 5
        plugins: {only: [metrics_log, sample]}
        plugin_config:
          sample: {greeting: bonjour}
        """
    ))
    run_dir = tmp_path / "run"
    result = hookdet_process.run("run", experiment, "--model-dir", REPO, "--run-dir", run_dir, env=sample_environment,
                                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    recorded = json.loads((run_dir / "sample_plugin.json").read_text())
    expected_reports = [[r["group"], r["steps_completed"]] for r in read_reports(run_dir)]
    assert recorded == {"greeting": "bonjour", "batches": 10, "reports": expected_reports}
    assert len(expected_reports) == 4
