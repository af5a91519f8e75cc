"""torchrun as hookdet's launcher runs it: torch's own launcher, with how it ended written down.

torchrun tells how its ranks ended as text (a failure banner, log lines) whose wording changes
between torch versions. hookdet's launcher runs this file instead of ``python -m
torch.distributed.run``: the same launcher (``torch.distributed.run.run`` with torchrun's own
argument parser), but its outcome is written as data to the file ``$HOOKDET_LAUNCH_OUTCOME``
names, from torch's structured records: for a ``ChildFailedError``, each failed rank's exit code
(negative: the signal that killed it), pid and local rank (torch's ``ProcessFailure``); for any
other failure of the launcher itself (a rendezvous error, an option it refuses), the exception's
type and message; for a stop signal torchrun received, that signal. Nothing is printed for them:
hookdet's launcher says each in one line (:func:`hookdet.distributed.launcher.outcome_lines`).

Like :mod:`hookdet.distributed.rank_entry` it is run by its path and imports nothing of hookdet.
"""

if __name__ == "__main__":
    import json
    import os
    import sys

    del sys.path[0]  # this folder: nothing here is meant to be imported by name

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    def record(outcome: dict) -> None:
        path = os.environ.get("HOOKDET_LAUNCH_OUTCOME")
        if path:
            with open(path + ".partial", "w", encoding="utf-8") as handle:
                json.dump(outcome, handle)
            os.replace(path + ".partial", path)

    try:
        run(parse_args(sys.argv[1:]))
    except ChildFailedError as error:
        record({"failures": {str(rank): {"exitcode": failure.exitcode, "pid": failure.pid,
                                         "local_rank": failure.local_rank}
                             for rank, failure in error.failures.items()}})
        sys.exit(1)
    except SignalException as error:  # a stop passed on to the ranks, which tell how they ended
        record({"signal": int(error.sigval)})
        sys.exit(1)
    except Exception as error:  # noqa: BLE001 - the launcher's own failure, told in one line
        record({"launcher_error": f"{type(error).__name__}: {error}"})
        sys.exit(1)
