"""The fast tier (``python -m pytest -m "not slow"``, CONTRIBUTING.md) runs at least one test of
every test module, so an edit checked with it has touched every feature's tests."""
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


def test_every_test_module_has_a_test_in_the_fast_tier() -> None:
    done = subprocess.run([sys.executable, "-c", COLLECT], cwd=REPO, capture_output=True, text=True, timeout=600)
    collected = json.loads(done.stdout.strip().splitlines()[-1])
    assert collected["status"] == 0, done.stdout[-3000:] + done.stderr[-3000:]
    modules = {module for module, _ in collected["items"]}
    fast = {module for module, slow in collected["items"] if not slow}
    assert len(modules) > 50, modules
    assert sorted(modules - fast) == []
