"""Where the suite's CPU goes: a pytest plugin that writes each test's CPU seconds, and a summary.

The suite's wall time on the 2-core machine follows its CPU (both cores stay busy), and most of
that CPU is spent in processes the tests start (``hookdet run``, torchrun's ranks, servers), not
in pytest's workers. This plugin charges each test the CPU of its worker and of every process
below the worker in the process tree, measured from ``/proc`` before and after the test: user
and system time of each live descendant, plus what the ones already waited for left in their
parents' children totals. A process that left the tree (re-parented to init) is not counted.

    SUITE_CPU_DIR=/tmp/suite-cpu python -m pytest -p scripts.suite_cpu --durations=25
    python scripts/suite_cpu.py /tmp/suite-cpu        # the totals, by module and by test

Each worker writes ``cpu-<worker>.tsv`` lines: CPU seconds, wall seconds, the test's node id.
"""
from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

TICKS = os.sysconf("SC_CLK_TCK")


def process_table() -> Dict[int, List[Tuple[int, float]]]:
    """Each parent pid's children: (pid, CPU seconds of the child and its waited-for children)."""
    children: Dict[int, List[Tuple[int, float]]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # ended while the table was read
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        children[int(fields[1])].append((int(entry), sum(int(f) for f in fields[11:15]) / TICKS))
    return children


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every process below it."""
    table = process_table()
    own = [cpu for children in table.values() for pid, cpu in children if pid == root]
    total, below = sum(own), [root]
    while below:
        for pid, cpu in table.get(below.pop(), []):
            total += cpu
            below.append(pid)
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: object) -> Iterator[None]:  # noqa: ARG001
    folder = os.environ.get("SUITE_CPU_DIR")
    if not folder:
        yield
        return
    cpu, wall = tree_cpu(os.getpid()), time.monotonic()
    yield
    cpu, wall = tree_cpu(os.getpid()) - cpu, time.monotonic() - wall
    Path(folder).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(folder) / f"cpu-{worker}.tsv", "a", encoding="utf-8") as out:
        out.write(f"{cpu:.2f}\t{wall:.2f}\t{item.nodeid}\n")


def summary(folder: Path, top: int = 25) -> str:
    """The CPU and wall totals, CPU by module, and the ``top`` tests by CPU."""
    rows = [line.split("\t") for path in sorted(folder.glob("cpu-*.tsv"))
            for line in path.read_text(encoding="utf-8").splitlines() if line]
    by_module: Dict[str, float] = defaultdict(float)
    for cpu, _, nodeid in rows:
        by_module[nodeid.split("::")[0]] += float(cpu)
    lines = [f"{len(rows)} tests: {sum(float(r[0]) for r in rows):.0f} s CPU, {sum(float(r[1]) for r in rows):.0f} s wall"]
    lines += ["", "CPU s by module:"] + [f"{cpu:8.1f}  {module}" for module, cpu in
                                          sorted(by_module.items(), key=lambda kv: -kv[1])[:top]]
    lines += ["", "CPU s, wall s by test:"] + [f"{float(cpu):8.1f} {float(wall):8.1f}  {nodeid}" for cpu, wall, nodeid in
                                                sorted(rows, key=lambda r: -float(r[0]))[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
