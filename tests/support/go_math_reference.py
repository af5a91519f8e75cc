"""Go's own ``math.Pow``, ``math.Log`` and ``math.Exp``, computed by Go, for comparing
:mod:`hookdet.search.go_math` with them bit for bit.

:func:`go_math_program` builds ``go_math_reference.go`` once per test session with Debian's
``golang-go``; :func:`go_results` runs it on a batch of calls. ``fma=False`` runs it with
``GODEBUG=cpu.fma=off``: Go's ``Exp`` without fused multiply-adds, as on a CPU without FMA.
Without Go the test fails in CI (``.ci/run`` installs the package) and is skipped elsewhere.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest

SOURCE = Path(__file__).with_name("go_math_reference.go")

Call = Tuple[str, float, Optional[float]]


def bits(value: float) -> str:
    return "%016x" % struct.unpack("<Q", struct.pack("<d", value))[0]


def go_math_program(build_dir: Path) -> Path:
    """The compiled reference program (built into ``build_dir``)."""
    go = shutil.which("go")
    if go is None:
        reason = "needs Go (apt-get install golang-go; .ci/run installs it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason)
    program = build_dir / "go_math_reference"
    env = dict(os.environ, GOCACHE=str(build_dir / "cache"), GOPATH=str(build_dir / "gopath"),
               HOME=str(build_dir), GO111MODULE="off", GOFLAGS="")
    subprocess.run([go, "build", "-o", str(program), str(SOURCE)], check=True, env=env,
                   capture_output=True, timeout=300)
    return program


def go_results(program: Path, calls: Sequence[Call], fma: bool = True) -> List[str]:
    """Go's result of each ``(operation, x, y)`` call, as float64 bits in hex."""
    lines = "".join(f"{op} {bits(x)}" + ("" if y is None else f" {bits(y)}") + "\n"
                    for op, x, y in calls)
    env = dict(os.environ)
    if not fma:
        env["GODEBUG"] = "cpu.fma=off"
    done = subprocess.run([str(program)], input=lines, capture_output=True, text=True, env=env,
                          check=True, timeout=120)
    results = done.stdout.split()
    assert len(results) == len(calls), done.stderr
    return results
