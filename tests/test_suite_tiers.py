"""The fast tier (``python -m pytest -m "not slow"``, CONTRIBUTING.md) runs at least one test of
every test module, so an edit checked with it has touched every feature's tests; the modules
whose every test needs seconds of processes it cannot share are named here, each with why."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Collects the suite as the README's command does and prints each test's module and whether it
#: is marked slow.
COLLECT = """
import json, sys
import pytest

class Marks:
    def __init__(self):
        self.items = []

    def pytest_collection_finish(self, session):
        self.items = [(item.nodeid.split("::")[0], item.get_closest_marker("slow") is not None)
                      for item in session.items]

marks = Marks()
status = pytest.main(["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"], plugins=[marks])
print(json.dumps({"status": int(status), "items": marks.items}))
"""


#: Test modules with no test in the fast tier, and why each of their tests is slow.
WHOLLY_SLOW = {
    "tests/parity/test_ddp_passthrough.py": "two ranks under torchrun, each a new interpreter",
    "tests/parity/test_parity.py": "each case trains under Determined 0.38.1 and hookdet, apart",
    "tests/parity/test_parity_data.py": "each case trains under Determined 0.38.1 and hookdet, apart",
    "tests/parity/test_parity_distributed.py": "two ranks of Determined and of hookdet under torchrun",
    "tests/parity/test_parity_experiment_file.py": "each case trains under Determined 0.38.1 and hookdet, apart",
    "tests/parity/test_public_surface.py": "dumps Determined's public surface in its own interpreter",
    "tests/test_core_api_hf.py": "trains a Hugging Face Trainer under hookdet run (transformers takes seconds to import)",
    "tests/test_builtin_registry.py": "one table: every plugin trained in a fork of its own",
    "tests/test_checkpoint_index.py": "resumes by id in new interpreters, on purpose",
    "tests/test_ranks_view.py": "two ranks drawing on a terminal",
    "tests/test_search_store_faults.py": "whole searches whose store is damaged mid-way",
    "tests/test_search_vocabulary.py": "whole searches read back by every command",
    "tests/test_tensorboard_hparams.py": "a whole search read by a TensorBoard server",
    "tests/test_ui_browser.py": "a real Chromium over trained runs and a search",
    "tests/test_warm_segments.py": "warm searches compared with cold ones",
}


def test_every_test_module_has_a_test_in_the_fast_tier() -> None:
    done = subprocess.run([sys.executable, "-c", COLLECT], cwd=REPO, capture_output=True, text=True, timeout=600)
    collected = json.loads(done.stdout.strip().splitlines()[-1])
    assert collected["status"] == 0, done.stdout[-3000:] + done.stderr[-3000:]
    modules = {module for module, _ in collected["items"]}
    fast = {module for module, slow in collected["items"] if not slow}
    assert len(modules) > 50, modules
    assert sorted(modules - fast - set(WHOLLY_SLOW)) == []
    assert sorted(set(WHOLLY_SLOW) & fast) == []  # a module that has a fast test is not listed
