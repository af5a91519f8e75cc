"""``hookdet run`` on an experiment file whose entrypoint is a command, not a trial class.

Determined runs every entrypoint that is not ``module:Class`` as a command in the model
directory: a script (``python3 train.py --epochs 1``) or a launch layer wrapping one
(``python3 -m determined.launch.torch_distributed python3 train.py``, ``...launch.horovod``). The
script finds out that it runs "on the cluster" through ``det.get_cluster_info()`` and takes its
hyperparameters, seed and checkpoint to continue from there. hookdet does the same locally:

- the run directory is made first and the run's :class:`~hookdet.trial_api.cluster_info.ClusterInfo`
  (hyperparameters, trial id and seed, ``--resume``'s checkpoint as ``latest_checkpoint``) is
  written into it; ``$HOOKDET_CLUSTER_INFO`` points the script's ``hookdet.get_cluster_info()``
  at it, and ``pytorch.init()`` there takes the experiment file, seed and run directory from it;
- a plain command runs as it is (through ``sh -c`` when it uses the shell), with this Python's
  ``bin`` first on ``PATH`` so ``python3`` is the interpreter hookdet runs in;
- Determined's launch layers are replaced by the launchers they wrap: ``torch_distributed`` by
  torchrun (``--no-python``, ``resources.slots_per_trial`` processes, its ``TORCH_OVERRIDES``
  and ``hookdet run``'s torchrun options passed on), ``horovod`` by horovodrun;
- SIGTERM/SIGINT (SIGHUP as SIGTERM) are passed on: to every process of a plain command's group,
  to the launcher (which passes them to the ranks) otherwise. A script whose training stopped for
  the signal with a checkpoint makes ``hookdet run`` exit 75, as a trial class does; the ranks'
  ``Trainer.fit`` records how it ended (:func:`hookdet.trial_api.cluster_info.record_outcome`),
  torchrun how each rank it saw fail exited (:mod:`hookdet.launch.outcome`).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hookdet.exit_codes import PREEMPTED_EXIT_CODE
from hookdet.trial_api import cluster_info
from hookdet.launch import outcome
from hookdet.cli.command_output import CommandOutput
from hookdet.launch.outcome import Outcome, read_launch
from hookdet.errors import UsageError
from hookdet.runs import record as run_record
from hookdet.distributed.store_collectives import CHIEF_PORT_ENV, free_port
from hookdet.distributed.launcher import (
    CRASH_SIGNALS, RANK_ENTRY, is_python, killed_line, launcher_death_line, resume_target, run_passing_signals,
    signal_name, this_node, torchrun_command,
)

logger = logging.getLogger("hookdet")

#: Determined's launch layers (``python3 -m determined.launch.<name>``) and what replaces each.
LAUNCH_LAYERS = ("torch_distributed", "horovod", "deepspeed")
#: Each launch layer by its role (a launch layer's module name, not a plugin's).
TORCH_LAYER, HOROVOD_LAYER, DEEPSPEED_LAYER = LAUNCH_LAYERS


#: Characters that make a command need a shell (``&&``, pipes, redirections, variables, globs).
_SHELL_SYNTAX = re.compile(r"[|&;<>()$`*?\[\]{}~\n\\]")


class EntrypointError(UsageError):
    """An entrypoint hookdet cannot run; the message names the experiment file."""


def split_launch_layer(tokens: Sequence[str]) -> Tuple[Optional[str], List[str], List[str]]:
    """``(layer, overrides, script)`` of a ``python3 -m determined.launch.<layer> ...`` command,
    or ``(None, [], tokens)`` when the command is not wrapped in a launch layer.

    As Determined's launchers read their arguments: options before a ``--`` are overrides for
    the launcher underneath (torchrun, horovodrun); the rest is the script.
    """
    tokens = list(tokens)
    if not (tokens and is_python(tokens[0]) and len(tokens) >= 3 and tokens[1] == "-m"):
        return None, [], tokens
    module = tokens[2]
    if not module.startswith("determined.launch."):
        return None, [], tokens
    layer = module[len("determined.launch."):]
    rest = tokens[3:]
    overrides: List[str] = []
    if "--" in rest:
        split = rest.index("--")
        overrides, rest = rest[:split], rest[split + 1:]
    rest = [token for token in rest if token != "--autohorovod"]
    return layer, overrides, rest


def script_command(
    entrypoint: str, slots: int, torchrun_options: Sequence[str], source: str
) -> Tuple[List[str], bool, Dict[str, str]]:
    """The command that runs ``entrypoint`` with ``slots`` processes, whether it is a launcher
    (signals go to it alone, not its process group), and the environment it adds."""
    tokens = shlex.split(entrypoint)
    layer, overrides, script = split_launch_layer(tokens)
    if layer is None:  # one process, whatever the slots: it starts its workers itself, or is refused there
        command = ["sh", "-c", entrypoint] if _SHELL_SYNTAX.search(entrypoint) else tokens
        return command, False, {}
    if layer not in LAUNCH_LAYERS:
        raise EntrypointError(
            f"{source}: entrypoint {entrypoint!r}: unknown launch layer 'determined.launch.{layer}' "
            f"(hookdet runs {', '.join('determined.launch.' + name for name in LAUNCH_LAYERS[:2])})"
        )
    if layer == DEEPSPEED_LAYER:
        raise EntrypointError(
            f"{source}: entrypoint {entrypoint!r}: DeepSpeed trials are not supported by hookdet "
            "(it runs PyTorchTrial); use determined.launch.torch_distributed"
        )
    if not script:
        raise EntrypointError(f"{source}: entrypoint {entrypoint!r}: the launch layer wraps no script")
    if layer == HOROVOD_LAYER:
        return horovod_command(script, overrides, slots, source), True, {"USE_HOROVOD": "1"}
    command, _ = torchrun_command([], slots, torchrun_options)
    command = command[: command.index(RANK_ENTRY)]  # torchrun and its options, without hookdet's rank
    return [*command, *overrides, "--no-python", *script], True, {"USE_TORCH_DISTRIBUTED": "True"}


def horovod_command(script: Sequence[str], overrides: Sequence[str], slots: int, source: str) -> List[str]:
    """horovodrun (gloo, this machine) running ``script`` on ``slots`` ranks."""
    try:
        import horovod.runner  # noqa: F401
    except ImportError as error:
        raise EntrypointError(
            f"{source}: the entrypoint uses determined.launch.horovod, which needs Horovod "
            f"(scripts/build_horovod.sh builds it against the installed torch): {error}"
        ) from None
    return [
        sys.executable, "-m", "horovod.runner.launch", "-np", str(slots), "-H", f"localhost:{slots}",
        "--gloo", *overrides, *script,
    ]


def run_script(args: argparse.Namespace, config: Any, config_path: Path, late_stop: Any) -> int:
    """``hookdet run`` for a command entrypoint; returns the exit status (75 after preemption).
    What the script reads through ``det.get_cluster_info()`` and what its ranks say of how they
    ended go through a directory of this launch's own, removed at its end: the run directory
    holds only what the run wrote (on a machine of a multi-node run whose ranks do not include
    rank 0, nothing is made). A plain command's output is shown and kept as the run's log where
    it writes none itself (:mod:`hookdet.cli.command_output`). ``late_stop``
    (:class:`hookdet.cli.run_edges.LateStop`) is told when the command has ended."""
    from hookdet.loop.trainer import default_run_dir

    source = str(config_path)
    slots = config.resources.slots_per_trial
    command, is_launcher, extra_env = script_command(config.entrypoint, slots, args.torchrun, source)
    model_dir = Path(args.model_dir) if args.model_dir else config_path.resolve().parent
    check_script_exists(config.entrypoint, model_dir, source)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(config)
    node = this_node(args.torchrun)
    latest_checkpoint, fetched = newest_checkpoint(resume_target(args.resume))
    info = cluster_info.local_cluster_info(
        config, slots=slots, latest_checkpoint=latest_checkpoint, run_dir=run_dir, test_mode=args.test_mode, node=node,
    )
    started = run_record.now()
    with outcome.records_directory("hookdet-cluster-info-") as info_dir:
        env = dict(os.environ, **extra_env, **fetched)
        env.setdefault(CHIEF_PORT_ENV, str(free_port()))  # for workers the script starts itself
        env.pop(outcome.OUTCOME_FILE_ENV, None)  # this process's record, not the command's
        env[cluster_info.CLUSTER_INFO_ENV] = str(cluster_info.write_cluster_info(info, info_dir / "cluster.json"))
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        where = f"node {node[0]} of {node[1]}; run directory {run_dir} if rank 0 is on this machine" if node[1] > 1 \
            else f"run directory {run_dir}"
        logger.info("running %s in %s (%s)", shlex.join(command), model_dir, where)
        said: List[str] = []
        from hookdet.search.warm_script import launcher_starter, warm_starter

        fork = (launcher_starter if is_launcher else warm_starter)(command, env, str(model_dir))
        with contextlib.ExitStack() as stack:
            output = None if is_launcher else stack.enter_context(CommandOutput(info_dir / "output"))
            status = run_passing_signals(command, env, info_dir, said, cwd=model_dir, to_group=not is_launcher,
                                         fork=fork, output=output)
        late_stop.finished = True  # the command has ended: a SIGTERM from now on changes nothing
        died = launcher_death_line(_launcher_name(command), status) if is_launcher else None
        if died is not None and not said:
            print(died, file=sys.stderr, flush=True)
        trained = outcome.read_ranks(info_dir)
        failed = read_launch(info_dir)
        ranks = slots // node[1] if is_launcher else 1
        outcome.note_chiefs_training(trained)
        status = tell_failed_ranks(status, trained, ranks, failed.failed_ranks if failed is not None else {})
        final = exit_status(status, trained, ranks, is_launcher)
        ending = ending_of(run_dir, config.searcher.metric, status, final, node)
        if node[1] == 1:  # on several machines, rank 0's (wherever the rendezvous put it) keeps the record
            run_record.record_command(run_dir, config, started, final, command_state(status, final))
            if output is not None:
                output.keep_in(run_dir)
    print(ending, flush=True)
    return final


def ending_of(run_dir: Path, metric: str, status: int, final: int, node: Tuple[int, int]) -> str:
    """The lines a script's run ends with: a trial class's (from the run's records) where the
    script trained with hookdet's Trainer and ended well, else how the command ended."""
    ended = recorded_ending(run_dir, metric) if final in (0, PREEMPTED_EXIT_CODE) else None
    if ended is not None:
        return ended
    if node[1] > 1 and not run_dir.exists():
        return (f"hookdet: entrypoint {how_it_ended(status, final)} on this machine (node {node[0]} of "
                f"{node[1]}); the run is recorded by rank 0, in its machine's run directory")
    return f"hookdet: entrypoint {how_it_ended(status, final)}\n  run directory: {run_dir.resolve()}"


def recorded_ending(run_dir: Path, metric: str) -> Optional[str]:
    """The lines a trial class's run ends with, for a script's run, from the run directory's
    records (its ``run.json``, written by the script's ``Trainer.fit``), or None when the
    script wrote none."""
    from hookdet.checkpoints.resolver import read_identity, storage_of
    from hookdet.runs.record import ending_lines, read_record

    record = read_record(run_dir, check_alive=False)
    if not record or record.get("state") in (None, "running"):
        return None
    latest = record.get("latest_checkpoint")
    identity = read_identity(run_dir)
    if latest and identity is not None:
        try:
            latest = storage_of(identity, None).location(latest)
        except Exception:  # noqa: BLE001 - the id is still worth printing
            pass
    return ending_lines(record["state"], int(record.get("batches_trained") or 0), metric,
                        record.get("best_validation"), run_dir, latest)


def command_state(status: int, final: int) -> str:
    """The state of a run whose command recorded nothing itself: ``completed`` (exit 0),
    ``preempted`` (75), ``killed`` (by a signal), else ``failed``."""
    if final == 0:
        return "completed"
    if final == PREEMPTED_EXIT_CODE:
        return "preempted"
    return "killed" if status < 0 else "failed"


def newest_checkpoint(target: Optional[str]) -> Tuple[Optional[str], Dict[str, str]]:
    """``--resume``'s target as the script's ``info.latest_checkpoint``: a run directory as the
    storage id of its newest intact checkpoint (what a cluster hands a script), anything else
    (a checkpoint directory or id) as it is; and the environment that hands the script the
    download made to verify it (an object store's), so the script does not fetch it again."""
    from hookdet.checkpoints import format as fmt
    from hookdet.checkpoints.object_store import ObjectStorage
    from hookdet.checkpoints.resolver import locate_for_resume, read_identity

    if target is None or not Path(target).is_dir() or read_identity(target) is None \
            or (Path(target) / fmt.METADATA_FILE).is_file():
        return target, {}
    found = locate_for_resume(Path(target), None)
    if isinstance(found, tuple):
        storage, storage_id = found
        return storage_id, storage.hand_over(storage_id) if isinstance(storage, ObjectStorage) else {}
    return str(fmt.read_metadata(found).get("uuid") or found.name), {}


def how_it_ended(status: int, final: int) -> str:
    """``exited with status 1``, ``stopped with a checkpoint (preempted): exit status 75``...:
    what the command's ``status`` was, ending with the ``final`` status ``hookdet run`` returns."""

    if final == PREEMPTED_EXIT_CODE and status != PREEMPTED_EXIT_CODE:
        return f"stopped with a checkpoint (preempted): exit status {final}"
    if status == -signal.SIGINT:  # Ctrl-C before the script's Trainer could turn it into a stop
        return f"interrupted (Ctrl-C) before it could checkpoint: exit status {final}"
    if status < 0:
        return f"killed by {signal_name(-status)}: exit status {final}"
    return f"exited with status {final}"


def check_script_exists(entrypoint: str, model_dir: Path, source: str) -> None:
    """Refuse ``python3 SCRIPT ...`` (launch layer or not) when SCRIPT is not in the model
    directory: one line, before a launcher starts ranks that would each fail on it."""
    if _SHELL_SYNTAX.search(entrypoint):
        return  # the shell decides what runs
    _, _, script = split_launch_layer(shlex.split(entrypoint))
    if len(script) < 2 or not is_python(script[0]) or script[1].startswith("-"):
        return
    if not (model_dir / script[1]).is_file():
        raise EntrypointError(
            f"{source}: entrypoint {entrypoint!r}: no script {script[1]} in the model directory {model_dir}"
        )


def tell_failed_ranks(status: int, trained: Dict[int, Outcome], ranks: int, failed: Dict[int, Outcome]) -> int:
    """Print the ranks torchrun saw fail (``failed``, as it recorded them), and return the
    launch's status: 0 when they only crashed after training (:func:`crashed_after_training`, a
    warning each), else ``status``: an error line each, for a rank killed by a signal (but the
    SIGTERM/SIGINT of the launcher stopping the others) and for a rank whose own error line
    torchrun's error file holds (a script that uses torch's ``@record``). ``trained``: the ranks'
    records of how their training ended."""
    killed = {rank: ended for rank, ended in failed.items() if ended.signal}
    if crashed_after_training(trained, ranks, killed):
        for each in killed.values():
            if each.signal in CRASH_SIGNALS:
                print(f"hookdet: warning: rank {each.rank} (pid {each.pid}) was killed by {each.signal} after its "
                      "training ended (a crash as it exited); the run's training and checkpoints are complete",
                      file=sys.stderr, flush=True)
        return 0
    for rank, each in sorted(failed.items()):
        if status != 0 and each.signal is not None and each.signal not in ("SIGTERM", "SIGINT"):
            print(killed_line(each), file=sys.stderr, flush=True)
        elif each.signal is None and each.error:
            print(f"hookdet: error: rank {rank} (pid {each.pid}) failed: {each.error} (torchrun's error file)",
                  file=sys.stderr, flush=True)
    return status


def crashed_after_training(trained: Dict[int, Outcome], ranks: int, killed: Dict[int, Outcome]) -> bool:
    """Whether every rank's training ended (each recorded its outcome) and the only failures are
    ranks that crashed by themselves afterwards (an abort in the process group's teardown as the
    interpreter exits): the run is then complete, as ``hookdet run``'s own ranks are once they
    recorded their status. The launcher may have stopped the other ranks as they exited too."""
    names = [each.signal for each in killed.values()]
    return (len(trained) >= ranks and any(name in CRASH_SIGNALS for name in names)
            and all(name in CRASH_SIGNALS or name in ("SIGTERM", "SIGKILL") for name in names))


def exit_status(status: int, trained: Dict[int, Outcome], ranks: int, is_launcher: bool) -> int:
    """``hookdet run``'s status: 75 when training stopped for a signal with a checkpoint on every
    rank (torchrun itself reports a failure after passing a signal on, so a launcher's status
    does not count then), else the command's status (128 + N for a death by signal N)."""

    preempted = len(trained) >= ranks and "preempted" in [each.state for each in trained.values()]
    if preempted and (status == 0 or is_launcher):
        return PREEMPTED_EXIT_CODE
    return 128 - status if status < 0 else status


def _launcher_name(command: Sequence[str]) -> str:
    return "horovodrun" if "horovod.runner.launch" in command else "torchrun"
