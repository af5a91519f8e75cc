"""``hookdet run``'s multi-process launch: the launcher's command, what it and the ranks say,
told once.

- **No orphans** (:mod:`hookdet.launch.orphans`): torchrun dies with ``hookdet run``, each
  rank with torchrun; each rank runs :mod:`hookdet.distributed.rank_entry` (:data:`RANK_ENTRY`),
  whose first act, before torch is imported, is to ask for that.
- **Outcomes from records, not prose** (:mod:`hookdet.launch.outcome`). Each rank writes its
  outcome (exit status, its one-line error) into the launch's records directory
  (``HOOKDET_RANK_STATUS_DIR``); torchrun runs through :mod:`hookdet.distributed.torchrun_agent`
  (:data:`TORCHRUN_AGENT`), which writes its own beside them, with how each rank it saw fail
  exited, from torch's records. Together they decide what happened and to which rank: one line
  per distinct failure, a rank killed by a signal named with it, the launcher's own failure one
  line (:func:`tell_launcher_failure`, :func:`failure_lines`, :func:`launcher_death_line`).
- **One voice.** torchrun's log lines are dropped from its stderr (:func:`filter_launcher_stderr`),
  and a traceback of horovodrun's own becomes one line; a rank's traceback passes on whole.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from hookdet.errors import UsageError
from hookdet.launch.outcome import LAUNCH_RECORDS_ENV, Outcome, read_launch, read_ranks
from hookdet.launch.start import How, Job, Started, start

logger = logging.getLogger("hookdet")

#: The signals a launcher passes on to what it started instead of stopping (SIGHUP as SIGTERM).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_TORCHRUN_LOG = re.compile(r"^\[?[WEIF]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ .*torch/distributed/")
_TORCHRUN_EXCEPTIONS = ("ChildFailedError", "SignalException")
#: Signals a rank dies of when it crashes by itself (not stopped by a launcher or a person).
CRASH_SIGNALS = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")
#: The packages the launchers' own frames are in, by which their tracebacks are told from a rank's.
_LAUNCHER_PACKAGES = {"torchrun": "/torch/distributed/", "horovodrun": "/horovod/runner/"}
#: The lines Python prints between chained tracebacks.
_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


#: The program ``hookdet run`` gives torchrun (or horovodrun) for each rank: this file.
RANK_ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_entry.py")
#: The program that runs torchrun for ``hookdet run``, writing how it ended (torchrun_agent.py).
TORCHRUN_AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_agent.py")

def filter_launcher_stderr(lines: Iterable[str]) -> Iterator[str]:
    """The lines of a launcher's stderr (its ranks' included) without the launcher's own noise:
    torchrun's log lines, and a traceback of horovodrun's own (every frame in its package), which
    becomes one line naming its last exception when exceptions were chained. (How torchrun's
    ranks ended is not read from here: torchrun, run by :mod:`hookdet.distributed.torchrun_agent`,
    records it as data.) A rank's traceback passes on whole.
    """
    pending: List[str] = []
    deferred: Optional[str] = None  # the launcher's one line, held while a chained one may follow
    for line in lines:
        stripped = line.rstrip("\n")
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


def pump_filtered(source: IO[bytes], sink: IO[str], said: Optional[List[str]] = None) -> threading.Thread:
    """Copy ``source`` (a launcher's stderr) to ``sink`` through the filter, in a thread; the
    launcher's own one-line failures are also appended to ``said``."""

    def pump() -> None:
        lines = (raw.decode(errors="replace") for raw in iter(source.readline, b""))
        for line in filter_launcher_stderr(lines):
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


#: How long a plain command's other processes are waited for once it ended (a script's children
#: still writing their checkpoint), in seconds.
GROUP_EXIT_WAIT_SECONDS = 120
#: How long a rank refusing bad input waits for the other ranks of its machine to record theirs.
SIBLING_REPORT_SECONDS = 30.0


def wait_for_local_ranks(status_dir: Path, timeout: float = SIBLING_REPORT_SECONDS) -> None:
    """Return once every rank on this machine (``$LOCAL_WORLD_SIZE``, or horovodrun's
    ``$HOROVOD_LOCAL_SIZE``) has recorded its exit status in ``status_dir``, or ``timeout``
    seconds have passed."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("HOROVOD_LOCAL_SIZE") or 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(read_ranks(status_dir)) >= local_ranks:
            return
        time.sleep(0.05)


def killed_line(ended: Outcome) -> str:
    """How a rank killed by a signal is told: ``hookdet: error: rank 1 (pid 7) was killed by SIGKILL``."""
    return f"hookdet: error: rank {ended.rank} (pid {ended.pid}) was killed by {ended.signal}"


def killed_in(records_dir: Path) -> Dict[int, Outcome]:
    """The ranks torchrun saw die of a signal (its record in ``records_dir``), by rank."""
    launch = read_launch(records_dir)
    return launch.killed() if launch is not None else {}


def failure_lines(status_dir: Path, statuses: Dict[int, int], local_ranks: int,
                  killed: Optional[Dict[int, Outcome]] = None, every_rank_here: bool = True) -> List[str]:
    """One line per distinct failure: the ranks that said it, and what they said; a rank of
    this machine that ended without a word (no status, no message) is named as having died, by
    the signal that killed it where ``killed`` (:func:`killed_in`) knows it. With
    ``every_rank_here`` false (several machines) which global ranks are this machine's is not
    known, so the silent ones are counted rather than named."""
    killed = killed or {}
    by_message: Dict[str, List[int]] = {}
    for rank, ended in sorted(read_ranks(Path(status_dir)).items()):
        if ended.error:
            by_message.setdefault(ended.error.strip(), []).append(rank)
    lines = []
    for message, ranks in by_message.items():
        who = "rank" if len(ranks) == 1 else "ranks"
        lines.append(f"hookdet: error: {who} {', '.join(map(str, sorted(ranks)))}: {message}")
    # A rank that left its message may be stopped by the launcher before it records its status.
    reported = set(statuses) | {rank for ranks in by_message.values() for rank in ranks}
    if not every_rank_here:
        named = [rank for rank in killed if rank not in reported]
        lines.extend(killed_line(killed[rank]) + "; the other ranks were stopped" for rank in named)
        unnamed = local_ranks - len(reported) - len(named)
        if unnamed > 0 and reported:
            lines.append(f"hookdet: error: {unnamed} of this machine's {local_ranks} ranks ended without "
                         "a status (killed by a signal, or out of memory); the other ranks were stopped")
        return lines
    silent = [rank for rank in range(local_ranks) if rank not in reported]
    if silent and reported:
        lines.extend(killed_line(killed[rank]) + "; the other ranks were stopped" for rank in silent if rank in killed)
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
    command: List[str] = [sys.executable, TORCHRUN_AGENT]
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


def is_python(token: str) -> bool:
    """Whether a command's first word names a Python interpreter (``python``, ``python3``,
    ``/usr/bin/python3.11``): Determined's launch layers and scripts are run by one."""
    return re.fullmatch(r"python(\d(\.\d+)?)?", os.path.basename(token)) is not None


def resume_target(resume: Optional[str]) -> Optional[str]:
    """``--resume``'s argument as the trial or script sees it from the model directory: a path
    that exists here made absolute, anything else (a checkpoint id) as it is."""
    if resume is None:
        return None
    return str(Path(resume).resolve()) if Path(resume).exists() else resume


# ---------------------------------------------------------------------------------------------
# Running the launcher and reading what the ranks recorded
# ---------------------------------------------------------------------------------------------


def run_passing_signals(command: Sequence[str], env: Dict[str, str], records_dir: Path, said: List[str],
                        watch: Optional[Callable[[], None]] = None, cwd: Optional[Path] = None, to_group: bool = False,
                        fork: Optional[Callable[[Job], Any]] = None, output: Optional[Any] = None) -> int:
    """Run ``command`` (:func:`hookdet.launch.start.start`), passing this process's stop signals
    on; its status. ``watch`` is called every few seconds while it runs.

    A launcher (torchrun, horovodrun; the default, ``How.LAUNCHER``): signals go to it alone, it
    dies with this process (even by SIGKILL), its stderr goes through
    :func:`filter_launcher_stderr`, and torchrun's record of how it ended goes into
    ``records_dir`` (:mod:`hookdet.distributed.torchrun_agent`): its own failure becomes one
    line, printed and appended to ``said``; the ranks it saw die are the callers' to tell
    (:func:`killed_in`). ``to_group`` (a plain command, a ``sh -c`` one: ``How.SCRIPT``): signals
    go to its whole process group, its stderr is this process's, and the call returns only when
    every process of the group is gone, so a script still writing its checkpoint is waited for
    even when the shell above it has died. ``fork`` forks either from this process instead of
    starting a new one (in a warm search segment: :mod:`hookdet.search.warm_script`);
    ``output`` (a :class:`~hookdet.cli.command_output.CommandOutput`) takes its output.
    """
    env = dict(env, **{LAUNCH_RECORDS_ENV: str(records_dir)})
    job = Job(list(command), env, str(cwd or os.getcwd()), fork=fork,
              stdio=output.child_ends() if to_group and output is not None else None)
    process = start(job, How.SCRIPT if to_group else How.LAUNCHER)
    if output is not None:
        output.started()
    pump = None if to_group else pump_filtered(process.stderr, sys.stderr, said)
    send = process.signal_group if to_group else process.send_signal
    try:
        with stop_signals_passed_on(send, "the entrypoint" if to_group else "the ranks"):
            status = wait_watching(process, watch)
            deadline = time.monotonic() + GROUP_EXIT_WAIT_SECONDS
            while to_group and group_alive(process.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        if pump is not None:
            pump.join(timeout=5)
        tell_launcher_failure(records_dir, said)
        return status
    finally:
        if process.poll() is None:  # this process is dying of something else: take them along
            send(signal.SIGKILL)
            process.wait()


def tell_launcher_failure(records_dir: Path, said: List[str]) -> None:
    """torchrun's own failure, as it recorded it in ``records_dir``: a line printed and added to
    ``said``; nothing when it recorded none (it ended well, or it is not torchrun)."""
    launch = read_launch(records_dir)
    if launch is not None and launch.launcher.error:
        line = f"hookdet: error: torchrun failed: {launch.launcher.error}"
        said.append(line)
        print(line, file=sys.stderr, flush=True)


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is still there."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_watching(process: Started, watch: Optional[Callable[[], None]], every: float = 2.0) -> int:
    """The process's exit status once it ends, calling ``watch`` every ``every`` seconds until then."""
    while True:
        status = process.wait(timeout=every if watch else None)
        if status is not None:
            return status
        watch()  # type: ignore[misc]


def read_rank_statuses(status_dir: Path) -> Dict[int, int]:
    """The exit status each rank recorded in ``status_dir`` (its outcome), by rank."""
    return {rank: ended.exit_code for rank, ended in read_ranks(Path(status_dir)).items()}


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
