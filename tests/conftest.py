"""Prints how many behaviours the parity suite (``tests/parity``) compared, per case and in all;
gives the tests' runs a checkpoint index of their own (``HOOKDET_HOME``).

It lives here, not in ``tests/parity``, because pytest-xdist's controller loads only this level's
conftest: each worker counts its own cases and hands its counts over when it finishes
(``workeroutput``), and the controller prints the sum.
"""
import os
import signal
import tempfile

import pytest

from tests.parity.checks import COMPARED

# Runs started by the tests (and their child processes) index their checkpoints here, not in the
# user's ~/.local/share/hookdet (hookdet.checkpoints.user_index).
os.environ.setdefault("HOOKDET_HOME", tempfile.mkdtemp(prefix="hookdet-home-"))

# A suite started in the background by a non-interactive shell (``pytest &``, nohup, some CI
# runners) inherits SIGINT ignored, and so would every process it starts: Python then installs no
# KeyboardInterrupt handler and the Ctrl-C tests would send a signal nobody hears. A handler here
# (not inherited across exec, unlike "ignored") gives the children the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(session, config, items):  # noqa: ARG001
    """Slow tests first (otherwise in collection order), so that with ``--dist worksteal`` the
    long ones start early and the short ones fill the gaps, instead of one long test finishing
    alone at the end while the other worker idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["parity_compared"] = dict(COMPARED)


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_testnodedown(node, error):  # noqa: ARG001
    for case, count in getattr(node, "workeroutput", {}).get("parity_compared", {}).items():
        COMPARED[case] = COMPARED.get(case, 0) + count


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if not COMPARED:
        return
    terminalreporter.write_sep("-", "Determined parity")
    for case, count in sorted(COMPARED.items()):
        terminalreporter.write_line(f"{case}: {count} behaviours compared")
    terminalreporter.write_line(f"total: {sum(COMPARED.values())} behaviours in {len(COMPARED)} cases")
