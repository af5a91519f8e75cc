"""Parity runners forked from a warm server, one server per framework and test worker.

A parity case runs :mod:`tests.parity.runner` under Determined's interpreter and under hookdet's.
Started as a new interpreter, each runner spends its first seconds importing torch,
``torch._dynamo`` (which every optimizer pulls in) and its framework, several times what the case
trains. Instead, each test worker starts one server per framework (this file, run by that
framework's Python) that imports those once and forks a child per runner; the child becomes the
runner as ``python runner.py SPEC OUT`` would in its working directory, with exactly the case's
environment, its own session, its output in the case's log, and its exit status told back.

The server imports nothing of a case (no trial module, no record of a run) and is started with
what every runner shares (``PYTHONHASHSEED=0``, ``OMP_NUM_THREADS=1``, the framework's name), so a
forked runner and a new interpreter compute the same records; ``test_harness`` checks that one
case gives equal records both ways. ``HOOKDET_TEST_COLD=1`` starts every runner as a new
interpreter instead.

The protocol is one JSON line each way: the harness writes ``{"id", "env", "cwd", "log", "argv"}``
to the server's standard input; the server answers ``{"id", "pid"}`` as it forks and
``{"id", "status"}`` (negative: the signal) when that child ends. The server ends when its input
closes, that is when its test worker exits.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any, Dict, Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("runner.py")
#: What every runner imports before its case; the server imports it once (``{framework}``: the
#: framework's own name).
PRELOAD = ("numpy", "torch", "torch.optim", "torch._dynamo", "torch.distributed", "{framework}",
           "{framework}.pytorch")


def cold() -> bool:
    """Whether runners start as new interpreters (``HOOKDET_TEST_COLD=1``)."""
    return os.environ.get("HOOKDET_TEST_COLD", "") not in ("", "0")


class Runner:
    """One runner the server forked, with ``Popen``'s face for the harness: its ``pid`` (once the
    server has told it), ``wait`` and ``returncode``."""

    def __init__(self) -> None:
        self.forked_pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self.started = threading.Event()
        self.ended = threading.Event()

    @property
    def pid(self) -> Optional[int]:
        self.started.wait()
        return self.forked_pid

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit status; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        if not self.ended.wait(timeout):
            raise subprocess.TimeoutExpired(str(RUNNER), timeout or 0)
        assert self.returncode is not None
        return self.returncode


class Server:
    """The test worker's server for one framework's Python, started on first use."""

    def __init__(self, python: str, framework: str) -> None:
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        env.update(PARITY_FRAMEWORK=framework, OMP_NUM_THREADS="1", PYTHONHASHSEED="0",
                   MLFLOW_DISABLE_TELEMETRY="true")
        self.process = subprocess.Popen(
            [python, str(Path(__file__).resolve())], env=env, cwd=str(REPO_ROOT),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        self.runners: Dict[int, Runner] = {}
        self.ids = itertools.count()
        self.lock = threading.Lock()
        threading.Thread(target=self.read_answers, daemon=True).start()

    def start(self, spec: str, out: str, env: Dict[str, str], cwd: str, log: str) -> Runner:
        """Fork a runner of ``spec`` writing ``out``; its output goes to ``log``."""
        runner = Runner()
        with self.lock:
            number = next(self.ids)
            self.runners[number] = runner
            request = {"id": number, "env": env, "cwd": cwd, "log": log, "argv": [str(RUNNER), spec, out]}
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        return runner

    def read_answers(self) -> None:
        for line in self.process.stdout:
            answer = json.loads(line)
            runner = self.runners[answer["id"]]
            if "pid" in answer:
                runner.forked_pid = answer["pid"]
                runner.started.set()
            else:
                runner.returncode = answer["status"]
                runner.ended.set()
        for runner in list(self.runners.values()):  # the server died: nothing it forked is told
            if not runner.ended.is_set():
                runner.returncode = self.process.wait()
                runner.started.set()
                runner.ended.set()


_servers: Dict[str, Server] = {}


def server(python: str, framework: str) -> Server:
    """This test worker's server for ``framework`` under ``python``."""
    if framework not in _servers:
        _servers[framework] = Server(python, framework)
    return _servers[framework]


# ----- the server's side: runs under the framework's own Python -------------------------------

def serve() -> None:
    import importlib
    import sys

    sys.path.insert(0, str(REPO_ROOT))
    framework = os.environ["PARITY_FRAMEWORK"]
    for name in PRELOAD:
        importlib.import_module(name.format(framework=framework))
    answers = threading.Lock()

    def answer(message: Dict[str, Any]) -> None:
        with answers:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    def wait_for(number: int, pid: int) -> None:
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        answer({"id": number, "status": status})

    for line in sys.stdin:
        request = json.loads(line)
        with answers:  # no answer half-written into the child's copy of the output buffer
            pid = os.fork()
        if pid == 0:
            become_runner(request)  # never returns
        answer({"id": request["id"], "pid": pid})
        threading.Thread(target=wait_for, args=(request["id"], pid), daemon=True).start()


def become_runner(request: Dict[str, Any]) -> None:
    """In the forked child: the runner's session, environment, directory and output; then
    :func:`tests.parity.runner.main`, ended as its interpreter would end."""
    import atexit
    import sys
    import traceback

    status = 1
    try:
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        for target, source in ((0, null), (1, log), (2, log)):
            os.dup2(source, target)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = list(request["argv"])
        from tests.parity import runner

        status = runner.main(*sys.argv[1:])
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, then exit 1
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # a forked child ends with os._exit, which skips them
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


if __name__ == "__main__":
    serve()
