"""torchrun as hookdet's launcher runs it: torch's own launcher, with how it ended written down.

torchrun tells how its ranks ended as text (a failure banner, log lines) whose wording changes
between torch versions. hookdet's launcher runs this file instead of ``python -m
torch.distributed.run``: the same launcher (``torch.distributed.run.run`` with torchrun's own
argument parser), but how it ended is written as an outcome record
(:mod:`hookdet.launch.outcome`, ``launcher.json`` in the directory ``$HOOKDET_LAUNCH_RECORDS``
names) from torch's structured records: its own state (a rendezvous error or an option it
refuses, as the exception's type and message; a stop signal it passed on), and for a
``ChildFailedError`` how each failed rank exited (torch's ``ProcessFailure``: its exit code,
negative for the signal that killed it, its pid), with the line of the rank's error file
(``TORCHELASTIC_ERROR_FILE``, written by torch's ``@record``) where the rank left one. Nothing is
printed for them: hookdet's launcher says each in one line.

When the ranks are hookdet's, torchrun forks them from this process instead of starting each
as a new interpreter (:mod:`hookdet.distributed.forked_ranks`). Like
:mod:`hookdet.distributed.rank_entry` it is run by its path; of hookdet it imports that module
alone, and the ranks' modules only as it forks them. The record's fields are those of
:class:`hookdet.launch.outcome.Outcome`.
"""

if __name__ == "__main__":
    import json
    import os
    import signal
    import sys

    # the checkout (or site-packages) that holds hookdet, not this folder: import hookdet, not its modules
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from hookdet.distributed.forked_ranks import fork_hookdet_ranks

    fork_hookdet_ranks()

    def record(launcher: dict, ranks: dict) -> None:
        folder = os.environ.get("HOOKDET_LAUNCH_RECORDS")
        if folder:
            path = os.path.join(folder, "launcher.json")
            with open(path + ".partial", "w", encoding="utf-8") as handle:
                json.dump({"launcher": dict(launcher, pid=os.getpid()), "ranks": ranks}, handle)
            os.replace(path + ".partial", path)

    def error_file_line(failure) -> "str | None":
        """The rank's own line from its error file (torch's ``@record``), None without one."""
        if not os.path.isfile(failure.error_file):
            return None
        message = failure.message
        return (message.get("message") if isinstance(message, dict) else message) or None

    def signal_name(signum: int) -> str:
        try:
            return signal.Signals(signum).name
        except ValueError:
            return f"signal {signum}"

    def exited(rank: int, failure) -> dict:
        """How a failed rank exited, as an outcome record's fields (the exit code and pid as
        torch recorded them; the signal named here, not in torch's words)."""
        killed = failure.exitcode < 0
        return {"state": "killed" if killed else "failed", "exit_code": failure.exitcode, "rank": rank,
                "pid": failure.pid, "signal": signal_name(-failure.exitcode) if killed else None,
                "error": error_file_line(failure), "error_by": None}

    try:
        torchrun.run(torchrun.parse_args(sys.argv[1:]))
    except ChildFailedError as error:
        record({"state": "failed", "exit_code": 1},
               {str(rank): exited(rank, failure) for rank, failure in error.failures.items()})
        sys.exit(1)
    except SignalException as error:  # a stop passed on to the ranks, which tell how they ended
        record({"state": "killed", "exit_code": 1, "signal": signal_name(int(error.sigval))}, {})
        sys.exit(1)
    except Exception as error:  # noqa: BLE001 - the launcher's own failure, told in one line
        record({"state": "failed", "exit_code": 1, "error": f"{type(error).__name__}: {error}",
                "error_by": "input"}, {})
        sys.exit(1)
