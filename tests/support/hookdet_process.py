"""The one way a test runs hookdet in a process of its own: :func:`run` (to its end) and
:func:`start` (to signal, watch or wait on).

By default the process is *warm*: forked from a server that has imported torch and hookdet once
per test worker, the mechanism a search's segments use (:mod:`hookdet.search.warm_start`), so
the tests exercise it too and a run costs what it trains, not ~3 s of interpreter start and torch
import. It runs ``hookdet ARGS`` as ``python -m hookdet ARGS`` would in ``cwd``: its own session
(as ``Popen(start_new_session=True)``), exactly the environment given, ``sys.path`` with ``cwd``
and the environment's ``PYTHONPATH``, its standard output and error captured apart, its exit
status (negative for the signal that killed it).

``cold=True`` starts a new interpreter instead. A test passes it when it is *about* what only a
new interpreter shows — process start-up, a signal that arrives as the process starts, the
installed ``hookdet`` console script (``entry_point=True``), a terminal, a command run through a
``prefix`` (``setpriv ...``) or with a ``preexec_fn`` (cold too) — and says why where it calls.
``HOOKDET_TEST_COLD=1`` makes every run cold (to tell a warm-only failure from a real one).
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    from hookdet.search.warm_pool import WarmPool

REPO = Path(__file__).resolve().parents[2]
#: The installed console script, beside this interpreter.
ENTRY_POINT = Path(sys.executable).with_name("hookdet")

#: What this test worker started and has not seen end: killed when the worker exits (multiprocessing
#: would otherwise wait there for a warm one a failing test left running).
_started: "weakref.WeakSet[Hookdet]" = weakref.WeakSet()


@atexit.register
def _kill_what_is_left() -> None:
    for process in list(_started):
        if process.poll() is None:
            process.kill()


def child_env(env: Optional[Mapping[str, str]] = None, **extra: str) -> Dict[str, str]:
    """The environment a test's hookdet gets: ``env`` (this process's by default) with one
    thread per process (``OMP_NUM_THREADS``: None in ``env`` leaves it unset), the repository
    importable (the tests' trials live in it), no run directory inherited from an enclosing
    ``hookdet run``, and ``extra``."""
    result = dict(os.environ if env is None else env)
    result.setdefault("OMP_NUM_THREADS", "1")
    paths = [str(REPO), *result.get("PYTHONPATH", "").split(os.pathsep)]
    result["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, paths)))
    result.pop("HOOKDET_RUN_DIR", None)
    result.update(extra)
    return {name: value for name, value in result.items() if value is not None}


#: This test worker's warm process: a search's own kind (:class:`hookdet.search.warm_pool.WarmPool`).
_pool: Optional["WarmPool"] = None


def warm_server() -> multiprocessing.context.BaseContext:
    """This test worker's fork server: a search's own, started on first use with what a
    segment preloads."""
    global _pool
    from hookdet.search.warm_pool import WarmPool

    if _pool is None:
        _pool = WarmPool()
    return _pool.server(REPO, None)


class Hookdet:
    """A started ``hookdet``, warm or cold, behind ``Popen``'s face: ``pid``, ``poll``,
    ``wait``, ``send_signal``, ``communicate`` (its whole output, once it ended) and
    ``returncode``. :meth:`kill` ends its whole session."""

    def __init__(self, args: Sequence[str], cwd: Path, env: Dict[str, str], cold: bool, entry_point: bool,
                 prefix: Sequence[str] = (), preexec_fn: Optional[Callable[[], None]] = None,
                 stdout_pipe: bool = False) -> None:
        self.args = list(args)
        self._files = tempfile.TemporaryDirectory(prefix="hookdet-output-")
        self.stdout_path = Path(self._files.name) / "stdout"
        self.stderr_path = Path(self._files.name) / "stderr"
        self.returncode: Optional[int] = None
        self._ended: Optional[Tuple[str, str]] = None
        self.stdout_path.touch()
        self.stderr_path.touch()
        #: With ``stdout_pipe``: the read end of its standard output, which the test reads itself.
        self.stdout: Optional[IO[bytes]] = None
        if (cold or entry_point or prefix or preexec_fn or stdout_pipe
                or os.environ.get("HOOKDET_TEST_COLD", "") not in ("", "0")):
            command = [*prefix, *([str(ENTRY_POINT)] if entry_point else [sys.executable, "-m", "hookdet"])]
            with open(self.stdout_path, "a") as out, open(self.stderr_path, "a") as err:
                self.process: Union[subprocess.Popen, multiprocessing.process.BaseProcess] = subprocess.Popen(
                    [*command, *args], cwd=cwd, env=env, stdout=subprocess.PIPE if stdout_pipe else out, stderr=err,
                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec_fn)
            self.stdout = self.process.stdout
        else:
            self.process = warm_server().Process(
                target=become_hookdet, name="hookdet-test",
                args=(list(args), env, str(cwd), str(self.stdout_path), str(self.stderr_path)))
            self.process.start()
        self.pid: int = self.process.pid
        _started.add(self)

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            if isinstance(self.process, subprocess.Popen):
                self.returncode = self.process.poll()
            elif not self.process.is_alive():
                self.returncode = self.process.exitcode
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit status; ``subprocess.TimeoutExpired`` (the process left running) past ``timeout``."""
        if isinstance(self.process, subprocess.Popen):
            self.returncode = self.process.wait(timeout)
        else:
            self.process.join(timeout)
            if self.poll() is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL to its session (it and whatever it started)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def output(self) -> Tuple[str, str]:
        """What it wrote so far: (standard output, standard error)."""
        if self._ended is not None:
            return self._ended
        return (self.stdout_path.read_text(errors="replace"), self.stderr_path.read_text(errors="replace"))

    def first_line(self, wanted: Callable[[str], bool] = bool, timeout: float = 300) -> str:
        """The first whole line of its standard output that is ``wanted``, waiting for it to be
        written (``AssertionError`` when the process ends or ``timeout`` passes first)."""
        deadline = time.monotonic() + timeout
        while True:
            ended = self.poll() is not None
            out, err = self.output()
            for line in out.splitlines(keepends=True):
                if line.endswith("\n") and wanted(line):
                    return line
            if ended or time.monotonic() > deadline:
                raise AssertionError(f"no such line from hookdet {' '.join(self.args)} (exit status "
                                     f"{self.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
            time.sleep(0.05)

    def communicate(self, timeout: Optional[float] = None) -> Tuple[str, str]:
        """Wait for its end (past ``timeout``: its session killed, ``TimeoutExpired``), then its
        whole output (again when asked again); whatever happens, nothing it started is left
        running."""
        if self._ended is None:
            try:
                self.wait(timeout)
            finally:
                self.kill()
                if self.stdout is not None:
                    self.stdout.close()
            self._ended = self.output()
            self._files.cleanup()
        return self._ended

    def completed(self, timeout: Optional[float] = None) -> subprocess.CompletedProcess:
        out, err = self.communicate(timeout)
        return subprocess.CompletedProcess(["hookdet", *self.args], self.returncode, out, err)


def become_hookdet(argv: Sequence[str], env: Dict[str, str], cwd: str, stdout_path: str, stderr_path: str) -> None:
    """In the child forked from the server: a session of its own, then the segment's way of
    becoming ``python -m hookdet ARGS``."""
    from hookdet.search.warm_start import run_segment

    os.setsid()
    run_segment(list(argv), env, cwd, stdout_path, [], errors_path=stderr_path)


def start(*args: Union[str, Path], cwd: Path = REPO, env: Optional[Mapping[str, str]] = None,
          cold: bool = False, entry_point: bool = False, prefix: Sequence[str] = (),
          preexec_fn: Optional[Callable[[], None]] = None, stdout_pipe: bool = False) -> Hookdet:
    """``hookdet ARGS`` started in ``cwd`` with :func:`child_env` of ``env``; warm unless ``cold``
    (``entry_point``: cold, through the installed console script; ``prefix``: cold, run through
    that command; ``preexec_fn``: cold, called in the child before it runs; ``stdout_pipe``:
    cold, its standard output a pipe the test reads, ``Hookdet.stdout``)."""
    return Hookdet([str(arg) for arg in args], Path(cwd), child_env(env), cold, entry_point, prefix, preexec_fn,
                   stdout_pipe)


def run(*args: Union[str, Path], cwd: Path = REPO, env: Optional[Mapping[str, str]] = None,
        timeout: float = 600, cold: bool = False, entry_point: bool = False) -> subprocess.CompletedProcess:
    """``hookdet ARGS`` run to its end (see :func:`start`): its status and output, as
    ``subprocess.run(..., capture_output=True, text=True)`` gives them."""
    return start(*args, cwd=cwd, env=env, cold=cold, entry_point=entry_point).completed(timeout)
