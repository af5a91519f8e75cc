"""``run.json`` and ``config.json``: what a run directory says about the run that wrote it.

The chief writes them when the run starts (``config.json``: the experiment as it runs;
``run.json``: state ``running``, its pid and host, the start time, what it resumed from) and
``run.json`` again when the run ends (``completed``, ``preempted``, ``stopped`` or ``failed``
with the error, the batches trained, the best searcher metric, the latest checkpoint). Each write
replaces the file atomically. A run killed outright (SIGKILL, power cut) cannot write its end, so
:func:`read_record` checks the pid of a run still marked ``running`` on this host: if that
process is gone, the run reads as ``killed``.

Each start and each end is also appended to ``history.jsonl``, one JSON object a line
(``event``: ``started`` or ``resumed``, then how it ended; ``time``; on a resume, the checkpoint
and the experiment fields that changed since the last start), so the run's story is kept, not
only its last chapter (``hookdet ui`` shows it).

A resume that fails before it trains a batch (a checkpoint that does not fit, a trial that
does not build) changed nothing of the run, so it leaves nothing either: its files are put back
as they were, and the run reads as it did before the attempt.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, Dict, Optional

from hookdet.exit_codes import ExitReason
from hookdet.runs.files import CONFIG_FILE, HISTORY_FILE, IDENTITY_FILE, METRICS_FILE, RUN_RECORD_FILE
from hookdet.runs.resume_report import changed_fields

logger = logging.getLogger("hookdet")


#: How ``Run.exit_reason`` reads as a run's final state.
_STATE_FOR_EXIT_REASON = {
    ExitReason.COMPLETED: "completed",
    ExitReason.PREEMPTED: "preempted",
    ExitReason.STOPPED: "stopped",
    ExitReason.EXITED: "stopped",
    ExitReason.PAUSED: "paused",
}


def final_state(run: Any) -> str:
    """The state a run that ended without an error ends in: ``completed``, ``preempted``,
    ``stopped`` or ``paused``, from its exit reason."""
    return _STATE_FOR_EXIT_REASON.get(run.exit_reason or "", "completed")


def now() -> str:
    """The time as run records write it (ISO 8601, local zone, seconds)."""
    return datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds")


def _write(run_dir: Path, record: Dict[str, Any]) -> None:
    _replace(Path(run_dir) / RUN_RECORD_FILE, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())


def _replace(path: Path, content: bytes) -> None:
    """Write ``path`` whole or not at all."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(content)
    partial.replace(path)


def read_bytes(path: Path) -> Optional[bytes]:
    """The bytes of the record file ``path``, or None when it cannot be read (it is not there)."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def unusable_records(run_dir: Path) -> Optional[str]:
    """Why the run directory's records cannot be written, in one line, or None: each record
    file that exists must be a regular file this process may write (a run directory restored
    from another user, or a record replaced by a folder, is found here, before anything starts)."""
    for name in (RUN_RECORD_FILE, CONFIG_FILE, METRICS_FILE, IDENTITY_FILE):
        path = Path(run_dir) / name
        if not os.path.lexists(path):
            continue
        if not path.is_file():
            kind = "a directory" if path.is_dir() else "not a regular file"
            return f"{path} is {kind}, not the run's {name}; move it away, then run again"
        if not os.access(path, os.W_OK):
            return (f"{path} cannot be written (no permission for user {os.getuid()}); give this "
                    "user write access to the run directory's files, or resume a copy of it")
    return None


def record_start(run: Any) -> None:
    """Write the run's ``config.json`` and mark it running in this process, keeping the records
    it replaces in ``run.prior_records``."""
    run_dir = Path(run.run_dir)
    kept = (RUN_RECORD_FILE, CONFIG_FILE, IDENTITY_FILE, HISTORY_FILE)
    run.prior_records = {name: read_bytes(run_dir / name) for name in kept}
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run.config.to_dict()
    _replace(run_dir / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True).encode())
    previous = read_record(run.run_dir) or {}
    _append_history(run_dir, _start_entry(run, previous, config))
    _write(run.run_dir, {
        "state": "running",
        "pid": os.getpid(),
        "pid_started": process_start(os.getpid()),
        "host": socket.gethostname(),
        "created": previous.get("created") or now(),
        "started": now(),
        "resumed_from": None if run.resume_from is None else str(run.resume_from),
        "searcher_metric": run.config.searcher.metric,
        "smaller_is_better": run.config.searcher.smaller_is_better,
    })


def record_end(run: Any, error: Optional[BaseException]) -> None:
    """Record how ``run`` ended: its exit reason, or ``failed`` with ``error`` (a resume that
    failed before training a batch puts the run's records back instead)."""
    if error is not None and _changed_nothing(run):
        _put_back(run)
        return
    record = read_record(run.run_dir, check_alive=False) or {}
    state = run.state
    if error is not None:
        record["state"] = "failed"
        record["error"] = f"{type(error).__name__}: {error}"
    else:
        record["state"] = final_state(run)
    record.update({
        "ended": now(),
        "resumed_from": None if run.resume_from is None else str(run.resume_from),
        "batches_trained": state.batches_trained,
        "max_batches": run.max_batches,
        "best_validation": state.best_validation,
        "latest_checkpoint": state.latest_checkpoint,
    })
    try:
        _write(run.run_dir, record)
        _append_history(Path(run.run_dir), {
            "event": record["state"], "time": record["ended"], "batches_trained": state.batches_trained,
            **({"error": record["error"]} if error is not None else {}),
        })
    except OSError as problem:  # never hide how the run really ended behind this
        logger.warning("could not record the end of the run in %s: %s", Path(run.run_dir) / RUN_RECORD_FILE, problem)


def record_command(run_dir: Path, config: Any, started: str, status: int, state: str) -> bool:
    """The records of a command ``hookdet run`` ran that wrote none itself (a script that never
    calls hookdet): ``config.json``, ``run.json`` (``state``, its exit ``status``, start and end)
    and its two history lines, so every run leaves a record; nothing when the command wrote its
    own (its ``pytorch.init`` or ``core.init`` did). Whether it wrote them."""
    run_dir = Path(run_dir)
    if (run_dir / RUN_RECORD_FILE).exists():
        return False
    run_dir.mkdir(parents=True, exist_ok=True)
    _replace(run_dir / CONFIG_FILE, json.dumps(config.to_dict(), indent=2, sort_keys=True).encode())
    ended = now()
    _append_history(run_dir, {"event": "started", "time": started, "host": socket.gethostname()})
    _append_history(run_dir, {"event": state, "time": ended, "exit_status": status})
    _write(run_dir, {
        "state": state, "exit_status": status, "host": socket.gethostname(), "created": started, "started": started,
        "ended": ended, "entrypoint": config.entrypoint, "searcher_metric": config.searcher.metric,
        "smaller_is_better": config.searcher.smaller_is_better, "batches_trained": 0,
    })
    return True


def note_fields(run_dir: Path, **fields: Any) -> None:
    """Set ``fields`` in the running run's ``run.json`` (a Core API script's ``progress``,
    ``status`` and ``metadata``), replacing the file atomically; the end keeps them."""
    record = read_record(run_dir, check_alive=False) or {}
    record.update(fields)
    _write(Path(run_dir), record)


def _start_entry(run: Any, previous: Dict[str, Any], config: Dict[str, Any]) -> Dict[str, Any]:
    """The history line of a start: ``resumed`` (with the checkpoint and what changed in the
    experiment since the last start) when the directory held a run, else ``started``."""
    entry: Dict[str, Any] = {"event": "resumed" if previous else "started", "time": now(),
                             "host": socket.gethostname()}
    if run.resume_from is not None:
        entry["resumed_from"] = str(run.resume_from)
    before = (run.prior_records or {}).get(CONFIG_FILE)
    if previous and before:
        try:
            entry["changed"] = changed_fields(json.loads(before), config)
        except ValueError:
            pass
    return entry


def _append_history(run_dir: Path, entry: Dict[str, Any]) -> None:
    """One line on ``history.jsonl``."""
    with open(run_dir / HISTORY_FILE, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry, sort_keys=True) + "\n")


def read_history(run_dir: Path) -> list:
    """The run's history lines, in order ([] when it has none; a torn line is skipped)."""
    entries = []
    try:
        with open(Path(run_dir) / HISTORY_FILE, encoding="utf-8") as handle:
            for line in handle:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    entries.append(entry)
    except OSError:
        pass
    return entries


def trained(run: Any) -> bool:
    """Whether ``run`` trained at least one batch in this process."""
    return run.first_batch is not None and run.state.batches_trained > run.first_batch


def _changed_nothing(run: Any) -> bool:
    """Whether ``run`` continued a run that was there before and failed before training a batch."""
    prior = run.prior_records or {}
    return prior.get(RUN_RECORD_FILE) is not None and not trained(run)


def _put_back(run: Any) -> None:
    for name, content in (run.prior_records or {}).items():
        path = Path(run.run_dir) / name
        try:
            if content is None:
                path.unlink(missing_ok=True)
            else:
                _replace(path, content)
        except OSError as problem:
            logger.warning("could not put %s back as it was: %s", path, problem)
    logger.info("the resume failed before training a batch: %s is left as it was", run.run_dir)


def forget_attempt(run_dir: Path) -> None:
    """Remove the records of an attempt that left no checkpoint (its run id stays), so the
    directory holds no run and the next attempt starts it afresh (a search restarts a trial
    killed before its first checkpoint this way)."""
    for name in (RUN_RECORD_FILE, CONFIG_FILE, METRICS_FILE, HISTORY_FILE):
        (Path(run_dir) / name).unlink(missing_ok=True)


def read_record(run_dir: Any, check_alive: bool = True) -> Optional[Dict[str, Any]]:
    """The run's record, None if it has none (or an unreadable one). A ``running`` run whose
    process no longer exists on this host reads as ``killed``."""
    try:
        record = json.loads((Path(run_dir) / RUN_RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    if check_alive and record.get("state") == "running" and record.get("host") == socket.gethostname():
        pid = record.get("pid")
        if not _process_exists(pid) or process_start(pid) != record.get("pid_started"):
            record["state"] = "killed"
    return record


def _process_exists(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return _is_not_a_zombie(pid)


def _is_not_a_zombie(pid: int) -> bool:
    """A killed child not yet reaped by its parent still has a pid; on Linux its state is Z."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return status.rsplit(")", 1)[-1].split()[0] != "Z"


def process_start(pid: Any) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot, Linux), so a reused pid is told
    apart from the run's own; None where unknown."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        return int(status.rsplit(")", 1)[-1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def ending_lines(how: str, batches: int, metric: str, best: Optional[float], run_dir: Path,
                 latest_checkpoint: Optional[str]) -> str:
    """What ``hookdet run`` prints when a run ends (a trial class or a script alike): how it
    ended after how many batches, its best searcher metric, its run directory and latest
    checkpoint."""
    lines = [f"hookdet: {how} after {batches} batches",
             f"  best {metric}: {'none' if best is None else f'{best:.6g}'}",
             f"  run directory: {Path(run_dir).resolve()}"]
    if latest_checkpoint:
        lines.append(f"  latest checkpoint: {latest_checkpoint}")
    return "\n".join(lines)
