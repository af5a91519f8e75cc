"""Process hygiene for ``hookdet run``'s multi-process launch: no orphans, no launcher noise.

- **No orphans.** torchrun starts each rank in a session of its own, and ``hookdet run`` starts
  torchrun in one too, so no process-group signal reaches them all. Instead each link of the
  chain asks the kernel for a *parent-death signal* (Linux ``prctl(PR_SET_PDEATHSIG)``): torchrun
  gets SIGKILL when ``hookdet run`` dies, and each rank gets SIGKILL when torchrun dies. A
  ``kill -9`` of ``hookdet run`` therefore ends torchrun and every rank within moments. The
  launcher starts each rank with :mod:`hookdet.distributed.rank_entry` as its program (:data:`RANK_ENTRY`), so the request is
  the rank's first act, before torch is imported; a rank that then finds ``hookdet run`` is no
  longer among its ancestors (torchrun died first, and the rank was adopted by init or by a
  *subreaper*, as a desktop ``systemd --user`` session is) exits at once.
- **One voice.** torchrun's own log lines and its tracebacks (``ChildFailedError`` when a rank
  failed, ``SignalException`` when it was told to stop) say nothing the ranks' statuses do not,
  so :func:`filter_launcher_stderr` drops them, turns any other traceback of the launcher's own
  (a bad option, a rendezvous backend it lacks) into one line, and passes every other line
  through unchanged; the launcher then prints one line per failed rank from what the rank
  recorded, or one line naming the launcher when it died itself (:func:`launcher_death_line`).
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from hookdet.errors import UsageError

logger = logging.getLogger("hookdet")

PR_SET_PDEATHSIG = 1

#: The signals a launcher passes on to what it started instead of stopping (SIGHUP as SIGTERM).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_TORCHRUN_LOG = re.compile(r"^\[?[WEIF]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ .*torch/distributed/")
_TORCHRUN_EXCEPTIONS = ("ChildFailedError", "SignalException")
#: The lines of torchrun's failure summary that say which rank ended how.
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
#: The line :func:`filter_launcher_stderr` makes of a rank torchrun saw die of a signal.
KILLED_RANK = re.compile(r"^hookdet: error: rank (\d+) \(pid \d+\) was killed by (\w+)")
#: Signals a rank dies of when it crashes by itself (not stopped by a launcher or a person).
CRASH_SIGNALS = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")
#: The packages the launchers' own frames are in, by which their tracebacks are told from a rank's.
_LAUNCHER_PACKAGES = {"torchrun": "/torch/distributed/", "horovodrun": "/horovod/runner/"}
#: The lines Python prints between chained tracebacks.
_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


def set_parent_death_signal(signum: int = signal.SIGKILL, expected_parent: Optional[int] = None) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux only).

    If the parent is already gone (``os.getppid()`` is no longer ``expected_parent``, or is 1),
    the signal is sent now. Returns whether the request could be made.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    parent = os.getppid()
    if parent == 1 or (expected_parent is not None and parent != expected_parent):
        os.kill(os.getpid(), signum)
    return True


#: The program ``hookdet run`` gives torchrun (or horovodrun) for each rank: this file.
RANK_ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_entry.py")
#: The pid of the ``hookdet run`` that launched the ranks, passed to them in the environment.
LAUNCHER_PID_ENV = "HOOKDET_LAUNCHER_PID"
#: How far up a rank looks for its launcher (torchrun; horovodrun's gloo runner and shell).
_ANCESTRY_DEPTH = 8


def parent_of(pid: int) -> Optional[int]:
    """The parent pid of ``pid`` (from ``/proc``), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def die_with_launcher() -> None:
    """A rank's first act: SIGKILL when its parent dies, and exit now if the ``hookdet run`` that
    launched it (``$HOOKDET_LAUNCHER_PID``) is no longer among its ancestors."""
    set_parent_death_signal(signal.SIGKILL)
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    if not launcher.isdigit() or not sys.platform.startswith("linux"):
        return
    pid: Optional[int] = os.getpid()
    for _ in range(_ANCESTRY_DEPTH):
        pid = parent_of(pid) if pid is not None else None
        if pid is None or pid <= 1:
            break
        if pid == int(launcher):
            return
    os.kill(os.getpid(), signal.SIGKILL)


def child_setup_for(launcher_pid: int):  # type: ignore[no-untyped-def]
    """A ``preexec_fn`` for the launcher's child: die with the launcher."""

    def setup() -> None:
        set_parent_death_signal(signal.SIGKILL, expected_parent=launcher_pid)

    return setup


def filter_launcher_stderr(lines: Iterable[str]) -> Iterator[str]:
    """The lines of torchrun's stderr (its ranks' included) without torchrun's own noise.

    A traceback of the launcher's own (every frame in the launcher's package) becomes one line,
    naming its last exception when exceptions were chained; torchrun's ``ChildFailedError`` and
    ``SignalException`` become none (the ranks' statuses tell it), and its failure summary one
    line per rank it saw die of a signal (a crash after the rank's last word, such as an abort
    while its interpreter exits, is told nowhere else). A rank's traceback passes on whole.
    """
    pending: List[str] = []
    deferred: Optional[str] = None  # the launcher's one line, held while a chained one may follow
    in_banner = False
    summary_rank: Optional[str] = None
    for line in lines:
        stripped = line.rstrip("\n")
        if in_banner:
            in_banner = not stripped.startswith("=" * 20)
            rank, ended = _SUMMARY_RANK.match(stripped), _SUMMARY_EXIT.match(stripped)
            summary_rank = rank.group(1) if rank else summary_rank
            if ended and summary_rank is not None and int(ended.group(1)) < 0:
                yield (f"hookdet: error: rank {summary_rank} (pid {ended.group(2)}) was killed by "
                       f"{signal_name(-int(ended.group(1)))}\n")
            continue
        if stripped.startswith("=" * 20):
            in_banner = True
            continue
        if _TORCHRUN_LOG.match(stripped):
            continue
        if pending:
            pending.append(line)
            if stripped and not stripped[0].isspace() and not stripped.startswith("Traceback"):
                launcher = _launcher_of(pending)  # the exception line that ends a traceback
                if launcher is None:
                    yield from pending
                elif not any(name in stripped for name in _TORCHRUN_EXCEPTIONS):
                    deferred = f"hookdet: error: {launcher} failed: {stripped}\n"
                pending = []
            continue
        if stripped.startswith("Traceback (most recent call last):"):
            pending = [line]
            continue
        if deferred is not None and (not stripped or stripped in _CHAINED):
            continue  # between two chained tracebacks of the launcher
        if deferred is not None:
            yield deferred
            deferred = None
        yield line
    if deferred is not None:
        yield deferred
    yield from pending


def _launcher_of(traceback: List[str]) -> Optional[str]:
    """``torchrun`` or ``horovodrun`` when every frame of ``traceback`` is the launcher's own
    (a rank's traceback has the rank's frames: hookdet's, the user's), else None."""
    frames = [line.strip() for line in traceback if line.lstrip().startswith("File ")]
    owners = set()
    for frame in frames:
        if "<frozen runpy>" in frame:
            continue
        owner = next((name for name, folder in _LAUNCHER_PACKAGES.items() if folder in frame), None)
        if owner is None:
            return None
        owners.add(owner)
    return "horovodrun" if "horovodrun" in owners else ("torchrun" if owners else None)


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 70`` for a number no signal has."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def launcher_death_line(launcher: str, status: int, ranks_reported: Optional[int] = None) -> Optional[str]:
    """One line when the launcher itself died of a signal, or failed before any of its ranks
    reported (``ranks_reported``: how many did, None when that is not known); None when the
    ranks' own lines tell it."""
    if status < 0:
        return f"hookdet: error: {launcher} was killed by {signal_name(-status)}; its ranks ended with it"
    if status != 0 and ranks_reported == 0:
        return f"hookdet: error: {launcher} exited with status {status} before any rank reported (see above)"
    return None


def pump_filtered(source: IO[bytes], sink: IO[str], said: Optional[List[str]] = None,
                  killed: Optional[List[str]] = None) -> threading.Thread:
    """Copy ``source`` (torchrun's stderr) to ``sink`` through the filter, in a thread; the
    launcher's own one-line failures are also appended to ``said``. The lines naming a rank
    killed by a signal go to ``killed`` instead of ``sink`` (read them with
    :func:`killed_ranks`): the caller tells them, knowing whether the rank had finished."""

    def pump() -> None:
        lines = (raw.decode(errors="replace") for raw in iter(source.readline, b""))
        for line in filter_launcher_stderr(lines):
            if killed is not None and KILLED_RANK.match(line):
                killed.append(line.rstrip("\n"))
                continue
            sink.write(line)
            sink.flush()
            if said is not None and line.startswith("hookdet: error: "):
                said.append(line)
        source.close()

    thread = threading.Thread(target=pump, name="hookdet-launcher-stderr", daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------------------------------------
# What each rank says, said once
# ---------------------------------------------------------------------------------------------


#: How long a rank refusing bad input waits for the other ranks of its machine to record theirs.
SIBLING_REPORT_SECONDS = 30.0


def wait_for_local_ranks(status_dir: Path, timeout: float = SIBLING_REPORT_SECONDS) -> None:
    """Return once every rank on this machine (``$LOCAL_WORLD_SIZE``, or horovodrun's
    ``$HOROVOD_LOCAL_SIZE``) has recorded its exit status in ``status_dir``, or ``timeout``
    seconds have passed."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("HOROVOD_LOCAL_SIZE") or 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reported = [path for path in status_dir.glob("rank-*") if path.name[len("rank-"):].isdigit()]
        if len(reported) >= local_ranks:
            return
        time.sleep(0.05)


def record_rank_message(status_dir: str, rank: int, message: str) -> None:
    """A rank under the launcher leaves its one-line error for the launcher to print."""
    path = Path(status_dir) / f"rank-{rank}.message"
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(message, encoding="utf-8")
    partial.replace(path)


def killed_ranks(said: Iterable[str]) -> Dict[int, Tuple[str, str]]:
    """The ranks ``said`` names as killed by a signal: rank -> (the signal's name, the line)."""
    killed = {}
    for line in said:
        match = KILLED_RANK.match(line)
        if match:
            killed[int(match.group(1))] = (match.group(2), line)
    return killed


def failure_lines(status_dir: Path, statuses: Dict[int, int], local_ranks: int,
                  killed: Optional[Dict[int, Tuple[str, str]]] = None, every_rank_here: bool = True) -> List[str]:
    """One line per distinct failure: the ranks that said it, and what they said; a rank of
    this machine that ended without a word (no status, no message) is named as having died, by
    the signal that killed it where ``killed`` (:func:`killed_ranks`) knows it. With
    ``every_rank_here`` false (several machines) which global ranks are this machine's is not
    known, so the silent ones are counted rather than named."""
    killed = killed or {}
    by_message: Dict[str, List[int]] = {}
    for path in sorted(Path(status_dir).glob("rank-*.message")):
        rank = path.name[len("rank-"):-len(".message")]
        if rank.isdigit():
            by_message.setdefault(path.read_text(encoding="utf-8").strip(), []).append(int(rank))
    lines = []
    for message, ranks in by_message.items():
        who = "rank" if len(ranks) == 1 else "ranks"
        lines.append(f"hookdet: error: {who} {', '.join(map(str, sorted(ranks)))}: {message}")
    # A rank that left its message may be stopped by the launcher before it records its status.
    reported = set(statuses) | {rank for ranks in by_message.values() for rank in ranks}
    if not every_rank_here:
        named = [rank for rank in killed if rank not in reported]
        lines.extend(killed[rank][1] + "; the other ranks were stopped" for rank in named)
        unnamed = local_ranks - len(reported) - len(named)
        if unnamed > 0 and reported:
            lines.append(f"hookdet: error: {unnamed} of this machine's {local_ranks} ranks ended without "
                         "a status (killed by a signal, or out of memory); the other ranks were stopped")
        return lines
    silent = [rank for rank in range(local_ranks) if rank not in reported]
    if silent and reported:
        lines.extend(killed[rank][1] + "; the other ranks were stopped" for rank in silent if rank in killed)
        unknown = [rank for rank in silent if rank not in killed]
        if unknown:
            who = "rank" if len(unknown) == 1 else "ranks"
            lines.append(
                f"hookdet: error: {who} {', '.join(map(str, unknown))} ended without a status "
                "(killed by a signal, or out of memory); the other ranks were stopped"
            )
    return lines


@contextlib.contextmanager
def stop_signals_passed_on(send: Callable[[int], None], to_whom: str) -> Iterator[None]:
    """While the block runs, SIGTERM, SIGINT and SIGHUP received here go to ``send`` (SIGHUP as
    SIGTERM) instead of stopping this process: a launcher hands them to what it started, which
    checkpoints and stops. Installed on the main thread only; the previous handlers come back."""

    def pass_on(signum: int, frame: Any) -> None:
        logger.warning("received %s: passing it on to %s", signal.Signals(signum).name, to_whom)
        send(signal.SIGTERM if signum == signal.SIGHUP else signum)

    previous: Dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, pass_on)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# ---------------------------------------------------------------------------------------------
# The launch commands
# ---------------------------------------------------------------------------------------------

#: torchrun options ``hookdet run`` passes through, for several nodes.
TORCHRUN_OPTIONS = (
    "--nnodes",
    "--node-rank",
    "--rdzv-endpoint",
    "--rdzv-backend",
    "--rdzv-id",
    "--master-addr",
    "--master-port",
    "--max-restarts",
    "--monitor-interval",
)


def this_node(torchrun_options: Sequence[str]) -> Tuple[int, int]:
    """(this machine's node rank, the number of machines) from ``hookdet run``'s torchrun
    options: (0, 1) on one machine."""
    values = dict(option.split("=", 1) for option in torchrun_options)
    nnodes, node_rank = values.get("--nnodes", "1"), values.get("--node-rank", "0")
    return (int(node_rank) if node_rank.isdigit() else 0), (int(nnodes) if nnodes.isdigit() else 1)


def torchrun_command(
    argv: Sequence[str], slots: int, torchrun_options: Sequence[str]
) -> "tuple[List[str], int]":
    """The torchrun command line that runs ``hookdet run`` with ``slots`` ranks in all, and how
    many of them it starts on this machine.

    One machine: ``--standalone`` (a private rendezvous on a free port). Several machines: the
    torchrun options given (``--nnodes``, ``--node-rank``, ``--rdzv-endpoint``, ...) pass through
    and ``slots_per_trial`` is split evenly across the ``--nnodes`` machines.
    """
    values = dict(option.split("=", 1) for option in torchrun_options)
    per_node = slots
    if "--nnodes" in values:
        nnodes = values["--nnodes"]
        if not nnodes.isdigit() or int(nnodes) < 1:
            raise UsageError(f"--nnodes must be a positive number of machines, got {nnodes!r}")
        if slots % int(nnodes):
            raise UsageError(
                f"slots_per_trial {slots} cannot be split evenly across --nnodes={nnodes} machines"
            )
        per_node = slots // int(nnodes)
    command: List[str] = [sys.executable, "-m", "torch.distributed.run"]
    rendezvous = ("--nnodes", "--rdzv-endpoint", "--rdzv-backend", "--master-addr", "--master-port")
    if not any(option in values for option in rendezvous):
        command.append("--standalone")
    command += [f"--nproc-per-node={per_node}", *torchrun_options, RANK_ENTRY, *argv]
    return command, per_node


def horovodrun_command(argv: Sequence[str], slots: int) -> List[str]:
    """The horovodrun command line (gloo, this machine) that runs ``hookdet run`` on ``slots`` ranks."""
    return [
        sys.executable, "-m", "horovod.runner.launch", "-np", str(slots), "-H", f"localhost:{slots}",
        "--gloo", sys.executable, RANK_ENTRY, *argv,
    ]


def resume_target(resume: Optional[str]) -> Optional[str]:
    """``--resume``'s argument as the trial or script sees it from the model directory: a path
    that exists here made absolute, anything else (a checkpoint id) as it is."""
    if resume is None:
        return None
    return str(Path(resume).resolve()) if Path(resume).exists() else resume


# ---------------------------------------------------------------------------------------------
# Running the launcher and reading what the ranks recorded
# ---------------------------------------------------------------------------------------------


def run_passing_signals(command: Sequence[str], env: Dict[str, str], said: List[str],
                        killed: Optional[List[str]] = None, watch: Optional[Callable[[], None]] = None) -> int:
    """Run ``command`` in its own session, passing this process's stop signals on; its status.
    The launcher's own failures, each one line, are appended to ``said``; the lines naming ranks
    killed by a signal to ``killed``. ``watch`` is called every few seconds while it runs."""
    process = subprocess.Popen(
        list(command), env=env, start_new_session=True, stderr=subprocess.PIPE,
        preexec_fn=child_setup_for(os.getpid()),  # it dies with this process, even by SIGKILL
    )
    pump = pump_filtered(process.stderr, sys.stderr, said, killed)

    def send(signum: int) -> None:
        if process.poll() is None:
            process.send_signal(signum)

    try:
        with stop_signals_passed_on(send, "the ranks"):
            status = wait_watching(process, watch)
        pump.join(timeout=5)
        return status
    finally:
        if process.poll() is None:  # this process is dying of something else: take the ranks along
            process.kill()
            process.wait()


def wait_watching(process: subprocess.Popen, watch: Optional[Callable[[], None]], every: float = 2.0) -> int:
    """``process.wait()``, calling ``watch`` every ``every`` seconds until it ends."""
    while True:
        try:
            return process.wait(timeout=every if watch else None)
        except subprocess.TimeoutExpired:
            watch()  # type: ignore[misc]


def read_rank_statuses(status_dir: Path) -> Dict[int, int]:
    """The exit status each rank recorded in ``status_dir``, by rank."""
    statuses = {}
    for path in status_dir.glob("rank-*"):
        if path.name[len("rank-"):].isdigit():
            statuses[int(path.name[len("rank-"):])] = int(path.read_text())
    return statuses


def ending_away_from_rank_0(node: Tuple[int, int], statuses: Dict[int, int], status: int) -> Optional[str]:
    """The line a machine of a multi-node run ends with when rank 0 (which reports the run) is
    on another machine and this one's ranks ended well; else None."""
    from hookdet.exit_codes import PREEMPTED_EXIT_CODE

    if node[1] == 1 or 0 in statuses or status not in (0, PREEMPTED_EXIT_CODE):
        return None
    how = "completed" if status == 0 else "stopped with the run's checkpoint (preempted)"
    ranks = ("rank " if len(statuses) == 1 else "ranks ") + ", ".join(map(str, sorted(statuses)))
    return (f"hookdet: {ranks} {how} on this machine (node {node[0]} of {node[1]}); the run is "
            "recorded by rank 0, in its machine's run directory")


def combined_exit_status(
    launcher_status: int, rank_statuses: Dict[int, int], local_ranks: int
) -> int:
    """``hookdet run``'s exit status after a launch: the first failing rank's status when one failed, 75 when
    the ranks were preempted, 0 when all completed, the launcher's own when a rank died without a word."""
    from hookdet.exit_codes import PREEMPTED_EXIT_CODE

    if len(rank_statuses) < local_ranks:
        return 128 - launcher_status if launcher_status < 0 else launcher_status or 1
    in_rank_order = [status for _, status in sorted(rank_statuses.items())]
    failed = [status for status in in_rank_order if status not in (0, PREEMPTED_EXIT_CODE)]
    if failed:
        return failed[0]
    return PREEMPTED_EXIT_CODE if PREEMPTED_EXIT_CODE in in_rank_order else 0
