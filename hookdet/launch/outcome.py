"""How one process that hookdet started ended, as a record its starter reads: never a line read back.

Every process ends with one :class:`Outcome`, written once, by one writer:

- a ``hookdet`` command writes its own as it ends (``hookdet.cli.commands.main``): its exit
  status, its state, the one line it said of an error and whose error it was, the newest
  checkpoint its training left (:func:`note_training`, told by the training loop);
- a script's ``Trainer.fit`` under ``hookdet run`` writes the script's rank's (the script itself
  is not ``hookdet``: it goes on after training, and its exit status is its own);
- torchrun writes its own (:mod:`hookdet.distributed.torchrun_agent`, :func:`read_launch`), with
  how each rank it saw fail exited, from torch's records: its exit status or the signal that
  killed it, and the rank's own error line from torchrun's error file
  (``TORCHELASTIC_ERROR_FILE``) where the rank left one. A rank that died without a record of
  its own is known from there.

Where it goes: ``rank-<N>.json`` in a launch's records directory for a rank (:func:`rank_path`,
read all at once by :func:`read_ranks`), or the file its starter names in
``HOOKDET_OUTCOME_FILE`` (:data:`OUTCOME_FILE_ENV`: a search's worker names one for each
segment). The file is JSON, replaced whole, so a reader sees the old record or the new one,
never half::

    {"state": "failed", "exit_code": 2, "rank": null, "pid": 4711, "signal": null,
     "error": "search_trial.py is a file; give a checkpoint directory ...", "error_by": "input",
     "checkpoint": null, "batches": null}

docs/process-outcome.md describes the format for other tools.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

#: The file a ``hookdet`` process writes its outcome to, named by whoever starts it.
OUTCOME_FILE_ENV = "HOOKDET_OUTCOME_FILE"

#: The states a process ends in: training's own (``completed``, ``preempted`` with a checkpoint,
#: ``stopped`` by the trial, ``paused`` at a search's rung), ``failed``, and ``killed`` by a signal.
STATES = ("completed", "preempted", "stopped", "paused", "failed", "killed")
#: Whose error a failure was: the trial's or script's code (``user``), input hookdet refused
#: (``input``: a file, a field, a plugin), the machine's (``machine``: a full disk, lost peers),
#: or hookdet's own (``hookdet``: a bug).
ERROR_OWNERS = ("user", "input", "machine", "hookdet")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a process ended (see the module's docstring)."""

    state: str
    #: The status it exits with; None where the writer is not the process's end (a script's
    #: ``Trainer.fit``). A preempted rank exits 0 under torchrun (which would count 75 as a
    #: failure), but its record says 75.
    exit_code: Optional[int] = None
    rank: Optional[int] = None
    pid: Optional[int] = None
    #: The signal that killed it, by name (``SIGKILL``), for a ``killed`` process.
    signal: Optional[str] = None
    #: The one line said of its error (``hookdet: error: ...`` without the prefix), or None.
    error: Optional[str] = None
    error_by: Optional[str] = None
    #: The newest checkpoint its training left (an id), None when it left none.
    checkpoint: Optional[str] = None
    #: The batches trained when it ended, None when it did not train.
    batches: Optional[int] = None


def write(path: Path, outcome: Outcome) -> None:
    """Write ``outcome`` to ``path``, replacing what was there in one step."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(dataclasses.asdict(outcome)), encoding="utf-8")
    os.replace(partial, path)


def read(path: Path) -> Optional[Outcome]:
    """The outcome written to ``path``, or None when none was (the process died without a word,
    or what is there is not a record)."""
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8"))
        return from_dict(found)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def from_dict(found: Dict[str, Any]) -> Outcome:
    """An :class:`Outcome` from its JSON form (fields it does not know are left out)."""
    known = {field.name for field in dataclasses.fields(Outcome)}
    outcome = Outcome(**{name: value for name, value in found.items() if name in known})
    if outcome.state not in STATES or not (outcome.exit_code is None or isinstance(outcome.exit_code, int)):
        raise ValueError(f"not an outcome record: {found!r}")
    return outcome


def rank_path(records_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` of a launch has its outcome."""
    return Path(records_dir) / f"rank-{rank}.json"


#: The file in a launch's records directory where torchrun's own failure is recorded.
LAUNCHER_RECORD = "launcher.json"


@contextlib.contextmanager
def records_directory(prefix: str) -> Iterator[Path]:
    """A launch's records directory for the block, removed after it. Made and removed without a
    finalizer (unlike :class:`tempfile.TemporaryDirectory`): a script forked from the process that
    made it runs the exit functions it inherits, and must not remove it
    (:mod:`hookdet.search.warm_script`)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def read_ranks(records_dir: Path) -> Dict[int, Outcome]:
    """The outcome of every rank of a launch that has one in ``records_dir``, by rank."""
    found = {}
    for path in Path(records_dir).glob("rank-*.json"):
        rank = path.name[len("rank-"):-len(".json")]
        outcome = read(path) if rank.isdigit() else None
        if outcome is not None:
            found[int(rank)] = outcome
    return found


#: Names the records directory of a launch, for torchrun's record (``launcher.json``) in it.
LAUNCH_RECORDS_ENV = "HOOKDET_LAUNCH_RECORDS"


@dataclasses.dataclass(frozen=True)
class LaunchOutcome:
    """How torchrun ended (:mod:`hookdet.distributed.torchrun_agent`, ``launcher.json``): its own
    outcome, and how each rank it saw fail exited (its exit status or signal, its pid, the line
    of its error file), by rank."""

    launcher: Outcome
    failed_ranks: Dict[int, Outcome]

    def killed(self) -> Dict[int, Outcome]:
        """The ranks it saw die of a signal, by rank."""
        return {rank: ended for rank, ended in self.failed_ranks.items() if ended.signal}


def read_launch(records_dir: Path) -> Optional[LaunchOutcome]:
    """torchrun's record in ``records_dir``; None when it wrote none (it ended well, it is not
    torchrun, or it was killed itself)."""
    try:
        found = json.loads((Path(records_dir) / LAUNCHER_RECORD).read_text(encoding="utf-8"))
        ranks = {int(rank): from_dict(ended) for rank, ended in (found.get("ranks") or {}).items()}
        return LaunchOutcome(from_dict(found["launcher"]), ranks)
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclasses.dataclass(frozen=True)
class Training:
    """How this process's training ended, as the training loop tells it (:func:`note_training`)."""

    state: str
    checkpoint: Optional[str]
    batches: int


_training: Optional[Training] = None


def note_training(state: str, checkpoint: Optional[str], batches: int) -> None:
    """Told by the training loop as a run closes: how its training ended, for this process's
    outcome (one process trains one run; the last told is kept)."""
    global _training
    _training = Training(state, checkpoint, batches)


def note_chiefs_training(ranks: Dict[int, Outcome]) -> None:
    """For a process that launched ranks: what rank 0 recorded of its training (``ranks``, by
    :func:`read_ranks`), as this process's own, so its outcome tells what the run left."""
    chief = ranks.get(0)
    if chief is not None and chief.batches is not None:
        note_training(chief.state, chief.checkpoint, chief.batches)


def forget_training() -> None:
    """As a command starts: it has trained nothing yet (a test may run many in one process)."""
    global _training
    _training = None


def training() -> Optional[Training]:
    """How this process's training ended, or None when it trained nothing."""
    return _training
