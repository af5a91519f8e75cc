"""The edges of a ``hookdet run``: Ctrl-C from its first moment, what is said and refused before
anything is made, and what happens as the run ends (what it prints, and a SIGTERM that arrives
then)."""
from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from hookdet.launch.orphans import LAUNCHER_PID_ENV
from hookdet.errors import UsageError

logger = logging.getLogger("hookdet")


def take_ctrl_c() -> None:
    """Make Ctrl-C (SIGINT) stop ``hookdet`` from its first moment, even where the shell that
    started it asked for it to be ignored (a job started with ``&`` by a script): hookdet turns
    SIGINT into a checkpoint and a stop once a run is built (and passes it on to what it
    launches), so ignoring it until then, and launching what would ignore it too, stopped a run
    only at some moments. A handler, unlike "ignored", is not inherited across exec."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def says_what_the_file_holds() -> bool:
    """Whether this process tells the user about the experiment file (the fields it ignores):
    the process the user started does, not the ranks hookdet's launcher starts after it has
    said so; under a launcher the user started (torchrun on each node), rank 0 does."""
    rank = launched_rank()
    return rank is None or (rank == 0 and LAUNCHER_PID_ENV not in os.environ)


def launched_rank() -> Optional[int]:
    """This process's global rank when a launcher (torchrun, horovodrun) started it, else None."""
    for name in ("RANK", "HOROVOD_RANK", "LOCAL_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return None


def refuse_checkpoints_one_machine_keeps(config: Any, torchrun_options: Any, run_dir: Optional[str], source: str) -> None:
    """A run on several machines whose checkpoints would go to each machine's own disk (the
    default storage, ``<run dir>/checkpoints``, with no ``--run-dir`` naming a shared folder) is
    refused: only rank 0's machine would hold them, and the others could not resume."""
    from hookdet.distributed.launcher import this_node

    storage = config.checkpoint_storage
    _, machines = this_node(torchrun_options)
    if machines > 1 and run_dir is None and getattr(storage, "type", "default") == "default":
        raise UsageError(
            f"{source}: a run on {machines} machines needs checkpoints every machine can read, or only "
            "rank 0's machine could resume: set checkpoint_storage to type shared_fs (host_path on a "
            "shared filesystem) or an object store (s3, gcs, azure), or give --run-dir on a shared filesystem")


def refuse_what_cannot_be_resumed(resume: Optional[str], config: Any) -> None:
    """``--resume X`` that names nothing, refused before anything is made: not a path here (from
    the directory the command was typed in), not a checkpoint id of this user's index, and with
    no shared checkpoint storage that could hold it (a new run's own is empty)."""
    if resume is None or Path(resume).exists():
        return
    here = Path.cwd()
    if "/" in resume or "\\" in resume or resume.startswith("."):
        raise UsageError(f"cannot resume from {resume}: no such run directory or checkpoint directory (from {here})")
    from hookdet.checkpoints import user_index

    deleted = user_index.deletion(resume)
    if deleted is not None:
        raise UsageError(user_index.why_gone(resume, deleted))
    if user_index.lookup(resume) is None and config.checkpoint_storage is None:
        raise UsageError(
            f"cannot resume from {resume!r}: no run directory or checkpoint directory of that name "
            f"in {here}, and no checkpoint with that id in this user's checkpoint index")


class LateStop:
    """``hookdet run``'s own SIGTERM handler, beneath the handler of whatever trains (the
    preemption plugin's, the search driver's, or the one passing signals on to a script or to
    the ranks' launcher; each restores it as training ends): a SIGTERM once training has finished changes
    nothing, so the process exits with the run's status (0 for a completed run, as ``run.json``
    says; 0 for a finished search, its summary written) instead of dying of the signal in its
    last moments; one before training ends the process as SIGTERM does. Training has finished
    once ``finished`` is set, or once ``has_finished`` says so (asked as the signal comes)."""

    def __init__(self, has_finished: Callable[[], bool] = lambda: False) -> None:
        self.finished = False
        self.has_finished = has_finished

    @classmethod
    def install(cls, has_finished: Callable[[], bool] = lambda: False) -> "LateStop":
        handler = cls(has_finished)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)
        return handler

    def __call__(self, signum: int, frame: Any) -> None:
        if self.finished or self.has_finished():
            logger.info("received SIGTERM after training ended: exiting as the run ended")
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def print_summary(run: Any) -> None:
    """What a trial class's run prints as it ends (see :func:`hookdet.runs.record.ending_lines`)."""
    from hookdet.runs.record import ending_lines

    state = run.state
    latest = (run.storage.location(state.latest_checkpoint)
              if state.latest_checkpoint and run.storage is not None else None)
    print(ending_lines(run.exit_reason or "finished", state.batches_trained, run.config.searcher.metric,
                       state.best_validation, run.run_dir, latest), flush=True)
