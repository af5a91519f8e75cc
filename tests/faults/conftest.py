"""The fault corpus reports its figures at the end of the session."""
from __future__ import annotations

from typing import Any

from tests.faults.harness import EXIT_TIMES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if EXIT_TIMES:
        case, seconds = max(EXIT_TIMES, key=lambda item: item[1])
        terminalreporter.write_line(
            f"fault corpus: {len(EXIT_TIMES)} hookdet runs; longest time to exit {seconds:.1f} s ({case})"
        )
