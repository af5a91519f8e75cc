"""The docs' table of intended differences and the suite's registry list the same ids."""
from __future__ import annotations

import re
from pathlib import Path

from tests.parity.expected_differences import EXPECTED_DIFFERENCES

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrating-from-determined.md"
HEADING = "## Intended differences, as the parity suite checks them"


def documented_ids() -> list:
    """The first column of the table under HEADING, in order."""
    text = DOC.read_text()
    assert HEADING in text, f"{DOC.name} lost its section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [re.match(r"\| `([^`]+)` \|", row).group(1) for row in rows]


def test_every_documented_difference_is_registered():
    unknown = [name for name in documented_ids() if name not in EXPECTED_DIFFERENCES]
    assert not unknown, f"{DOC.name} lists differences the parity suite does not expect: {unknown}"


def test_every_intended_difference_is_documented():
    documented = set(documented_ids())
    missing = [name for name, difference in EXPECTED_DIFFERENCES.items()
               if difference.kind != "PENDING_OTHER_BRANCH" and name not in documented]
    assert not missing, f"{DOC.name} does not list these expected differences with their reasons: {missing}"


def test_pending_items_are_not_documented_as_intended():
    documented = set(documented_ids())
    pending = {name for name, d in EXPECTED_DIFFERENCES.items() if d.kind == "PENDING_OTHER_BRANCH"}
    assert not documented & pending, "a pending fix is not an intended difference"
    assert len(documented_ids()) == len(documented), "an id is listed twice"


def test_every_difference_names_tests_that_exist():
    """``checked_by`` names ``file::test`` pairs (comma-separated) that are in the suite."""
    here = Path(__file__).parent
    missing = []
    for name, difference in EXPECTED_DIFFERENCES.items():
        for reference in difference.checked_by.split(", "):
            if "::" not in reference:
                continue
            filename, test = reference.split("::")
            if f"def {test}(" not in (here / filename).read_text():
                missing.append(f"{name}: {reference}")
    assert not missing, missing
