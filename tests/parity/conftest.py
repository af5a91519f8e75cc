"""Prints how many behaviours the parity suite compared, per case and in all."""
from tests.parity.checks import COMPARED


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if not COMPARED:
        return
    terminalreporter.write_sep("-", "Determined parity")
    for case, count in sorted(COMPARED.items()):
        terminalreporter.write_line(f"{case}: {count} behaviours compared")
    terminalreporter.write_line(f"total: {sum(COMPARED.values())} behaviours in {len(COMPARED)} cases")
