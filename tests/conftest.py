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
    """Slow tests first, and shared out: pytest-xdist's ``worksteal`` hands each of its N workers
    one contiguous share of this order at the start (N equal parts), and an idle worker later
    steals from the end of another's share. So each share here begins with its part of the slow
    tests (every N-th, in collection order) and ends with fast ones: every worker starts on long
    tests at once, and what is stolen at the end is short. Slow-first alone gave one worker every
    slow test, and the last of them ran alone at the end while the others idled."""
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    fast = [item for item in items if item.get_closest_marker("slow") is None]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    items[:] = shared_out(slow, fast, workers)


def shared_out(slow, fast, workers):  # type: ignore[no-untyped-def]
    """``slow`` and ``fast`` in the order described above, for ``workers`` shares of the sizes
    pytest-xdist's ``worksteal`` gives (the first ``len // workers``, the next a half of what
    is left, and so on)."""
    total, sizes = len(slow) + len(fast), []
    left = total
    for remaining in range(workers, 0, -1):
        sizes.append(left // remaining)
        left -= sizes[-1]
    order, fast_left = [], list(fast)
    for index, size in enumerate(sizes):
        share = slow[index::workers][:size]
        take = size - len(share)
        order += share + fast_left[:take]
        fast_left = fast_left[take:]
    placed = {id(item) for item in order}
    return order + [item for item in slow + fast if id(item) not in placed]


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
