"""How one ``hookdet`` process ended, as a record its starter reads: never a line read back.

A ``hookdet`` command writes one :class:`Outcome` as it ends (``hookdet.cli.commands.main``, the
one writer): its exit status, the rank it was (under ``hookdet run``'s launcher), and the one
line it said of an error (``hookdet: error: ...`` without its prefix), or none. Where it goes:

- a rank under the launcher: ``rank-<N>.json`` in the launch's status directory
  (``HOOKDET_RANK_STATUS_DIR``): the launcher reads every rank's (:func:`read_ranks`) to tell
  which ranks failed and why, once for all of them; a rank that wrote none died without a word;
- any ``hookdet`` whose starter names a file in ``HOOKDET_OUTCOME_FILE``: that file. A search's
  worker names one for each segment and reads why ``hookdet run`` refused it from there.

The file is JSON, replaced whole (a reader sees the old record or the new one, never half)::

    {"exit_code": 2, "rank": null, "error": "search_trial.py is a file; give a checkpoint directory ..."}

``exit_code`` is the status the process exits with (but a preempted rank exits 0 under torchrun,
which would count 75 as a failure: its record says 75). docs/process-outcome.md describes the
format for other tools.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Dict, Optional

#: The file a ``hookdet`` process writes its outcome to, named by whoever starts it.
OUTCOME_FILE_ENV = "HOOKDET_OUTCOME_FILE"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a ``hookdet`` process ended (see the module's docstring)."""

    exit_code: int
    rank: Optional[int] = None
    error: Optional[str] = None


def write(path: Path, outcome: Outcome) -> None:
    """Write ``outcome`` to ``path``, replacing what was there in one step."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(dataclasses.asdict(outcome)), encoding="utf-8")
    os.replace(partial, path)


def read(path: Path) -> Optional[Outcome]:
    """The outcome written to ``path``, or None when none was (the process died without a word)."""
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8"))
        return Outcome(exit_code=int(found["exit_code"]), rank=found.get("rank"), error=found.get("error"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def rank_path(status_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` of a launch writes its outcome."""
    return Path(status_dir) / f"rank-{rank}.json"


def read_ranks(status_dir: Path) -> Dict[int, Outcome]:
    """The outcome every rank of a launch wrote in ``status_dir``, by rank."""
    found = {}
    for path in Path(status_dir).glob("rank-*.json"):
        rank = path.name[len("rank-"):-len(".json")]
        outcome = read(path) if rank.isdigit() else None
        if outcome is not None:
            found[int(rank)] = outcome
    return found
