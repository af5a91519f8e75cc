"""The ``hookdet`` command: ``run`` an experiment file, list ``plugins``, ``export`` a model.

``hookdet run CONFIG`` with ``resources.slots_per_trial: N`` (or ``--slots N``) re-launches itself
under ``torch.distributed.run`` (torchrun) with N processes (under horovodrun when the experiment
lists the ``horovod`` plugin); torchrun's own options pass through for several nodes. An
entrypoint that is a command (a script, or a Determined launch layer wrapping one) runs as
Determined runs it: see :mod:`hookdet.cli.script_entrypoint`.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from hookdet.errors import HookdetError
from hookdet.trial_api.importing import SpecImportError, import_object
from hookdet.errors import UsageError
from hookdet.distributed.launcher import TORCHRUN_OPTIONS, horovodrun_command, resume_target, torchrun_command
from hookdet.launch import outcome
from hookdet.launch.orphans import LAUNCHER_PID_ENV
from hookdet.launch.outcome import Outcome
from hookdet.runs.files import CONFIG_FILE
from hookdet.cli.run_edges import (LateStop, launched_rank, print_summary, refuse_checkpoints_one_machine_keeps,
                                   refuse_what_cannot_be_resumed, says_what_the_file_holds, take_ctrl_c)

logger = logging.getLogger("hookdet")



#: Where ranks started by ``hookdet run``'s launcher write their exit status (set by the launcher).
RANK_STATUS_DIR_ENV = "HOOKDET_RANK_STATUS_DIR"


def load_trial_class(entrypoint: Optional[str], model_dir: Path, source: str) -> type:
    """Import the ``module:Class`` entrypoint from ``model_dir``; errors name the config file."""
    from hookdet.trial_api.trial import PyTorchTrial

    if not entrypoint or ":" not in entrypoint:
        raise UsageError(f"{source}: entrypoint must be 'module:TrialClass', got {entrypoint!r}")
    if str(model_dir) not in sys.path:
        sys.path.insert(0, str(model_dir))
    try:
        target = import_object(entrypoint)
    except SpecImportError as error:
        raise UsageError(f"{source}: entrypoint {entrypoint!r}: {error} (from {model_dir})") from error
    if not (isinstance(target, type) and issubclass(target, PyTorchTrial)):
        raise UsageError(
            f"{source}: entrypoint {entrypoint!r} is not a PyTorchTrial subclass "
            "(did the trial import PyTorchTrial from hookdet.pytorch?)"
        )
    return target


def command_run(args: argparse.Namespace) -> int:
    """Train the experiment in ``args.config``; return the exit status."""
    from hookdet.config import names_trial_class
    from hookdet.config.overrides import load_with_overrides

    config_path = Path(args.config)
    config = load_with_overrides(config_path, args.config_overrides or [])
    from hookdet.search import cli as search_cli

    if search_cli.is_search(config, args) and launched_rank() is None:
        return search_cli.run_search(args)
    if args.slots is not None:
        if args.slots < 1:
            raise UsageError(f"--slots must be a positive number of processes, got {args.slots}")
        config.resources.slots_per_trial = args.slots
    if config.ignored_fields and says_what_the_file_holds():
        logger.info(
            "%s: cluster-only fields ignored when running locally: %s",
            config_path, ", ".join(config.ignored_fields),
        )
    refuse_what_cannot_be_resumed(args.resume, config)
    if launched_rank() is None:
        refuse_checkpoints_one_machine_keeps(config, args.torchrun, args.run_dir, str(config_path))
    fork_parent = resume_run_dir(args)
    late_stop = LateStop.install()  # each way to train says when it has finished
    if config.entrypoint is not None and not names_trial_class(config.entrypoint):
        from hookdet.cli.script_entrypoint import run_script  # a script or launch-layer command

        return run_script(args, config, config_path, late_stop)
    slots = config.resources.slots_per_trial
    if slots > 1 and launched_rank() is None:
        return _launch(args, config, slots, late_stop)
    return _train_trial_class(args, config, config_path, fork_parent, late_stop)


def _train_trial_class(args: argparse.Namespace, config: Any, config_path: Path, fork_parent: Any,
                       late_stop: LateStop) -> int:
    """Build the ``module:Class`` trial and train it with the model directory as the working
    directory, where Determined's harness runs it (so a trial's relative data paths mean what
    they mean there); the paths given on the command line are made absolute first."""
    from hookdet.trial_api.cluster_info import activated, local_cluster_info
    from hookdet.exit_codes import PREEMPTED_EXIT_CODE, ExitReason
    from hookdet.runs.identity import write_identity
    from hookdet.trial_api.context import run_of
    from hookdet.loop.trainer import Trainer, default_run_dir, fit_arguments, init
    from hookdet.distributed.rank_watch import beating

    model_dir = (Path(args.model_dir) if args.model_dir else config_path.resolve().parent).resolve()
    trial_class = load_trial_class(config.entrypoint, model_dir, str(config_path))
    if "global_batch_size" not in config.hyperparameters:
        raise UsageError(
            f"{config_path}: hyperparameters.global_batch_size is required: a PyTorchTrial's "
            "batches are sized from it (as under Determined)"
        )
    run_dir = Path(args.run_dir or default_run_dir(config)).absolute()
    resume = resume_target(args.resume)
    slots = config.resources.slots_per_trial
    info = local_cluster_info(config, slots=slots, latest_checkpoint=resume, run_dir=run_dir)
    with working_directory(model_dir), activated(info), \
            init(exp_conf=config, run_dir=run_dir, model_dir=model_dir) as context:
        run = run_of(context)
        run.resume_from = resume  # so get_initial_batch() is right in the trial's __init__
        if fork_parent is not None and run.is_chief:
            write_identity(run, parent=fork_parent)
        trial = trial_class(context)
        fit = fit_arguments(config, context)
        if fit["max_length"] is None:
            raise UsageError(f"{config_path}: searcher.max_length is required to train")
        with beating(os.environ.get(RANK_STATUS_DIR_ENV), launched_rank(), lambda: run.state.batches_trained,
                     lambda: {"total": run.max_batches, "epoch_length": run.state.epoch_length}):
            Trainer(trial, context).fit(**fit, latest_checkpoint=resume, test_mode=args.test_mode)
        late_stop.finished = True
        if run.is_chief:
            print_summary(run)
        status = PREEMPTED_EXIT_CODE if run.exit_reason == ExitReason.PREEMPTED else 0
        # Told before the teardown (process group, plugins): a rank that aborts there has finished
        # (one that raises there records its failure over it).
        report_outcome(status)
    return status


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """Run the block in ``path``, then return to where the process was."""
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def resume_run_dir(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """``--resume RUN_DIR`` continues in RUN_DIR itself (one run, one history) unless
    ``--run-dir`` says otherwise; with ``--fork`` it starts a new run directory instead and
    returns the parent to record in it."""
    from hookdet.checkpoints.resolver import read_identity, refuse_mixed_store
    from hookdet.runs.index import is_run_dir

    if not args.resume and args.run_dir and launched_rank() is None and is_run_dir(Path(args.run_dir)):
        raise UsageError(
            f"run directory {args.run_dir} already holds a run{_state_of(Path(args.run_dir))}; continue it "
            f"with --resume {args.run_dir}, or give another --run-dir (one run directory, one history)"
        )
    if args.resume and Path(args.resume).is_dir() and read_identity(args.resume) is None:
        refuse_mixed_store(Path(args.resume))  # before anything is created
    if not args.resume or not (Path(args.resume) / CONFIG_FILE).is_file():
        if args.fork:
            raise UsageError(f"--fork needs --resume RUN_DIR (a run directory), got {args.resume!r}")
        return None
    if args.fork:
        identity = read_identity(args.resume) or {}
        return {"run_dir": str(Path(args.resume).resolve()), "run_id": identity.get("run_id")}
    if args.run_dir is None:
        args.run_dir = args.resume
    return None


def _state_of(run_dir: Path) -> str:
    """`` (running: pid 12 on host h)``, `` (completed)``...: what the run directory's record says."""
    from hookdet.runs.record import read_record

    record = read_record(run_dir) or {}
    state = record.get("state")
    if state == "running":
        return f" (running: pid {record.get('pid')} on host {record.get('host')})"
    return f" ({state})" if state else ""


def _launch(args: argparse.Namespace, config: Any, slots: int, late_stop: LateStop) -> int:
    """Start ``slots`` ranks of this very command and return their combined exit status.

    torchrun starts them, or horovodrun when the experiment lists the ``horovod`` plugin. The
    launcher runs in its own session and this process passes SIGTERM and SIGINT (SIGHUP as
    SIGTERM) on to it, so a Ctrl-C reaches every rank once and they checkpoint and stop. Each rank
    writes its exit status into a directory made here (``HOOKDET_RANK_STATUS_DIR``), because
    torchrun and horovodrun report only "failed", and kill the other ranks when one exits
    non-zero. The result: the first failing rank's status when one failed, 75 when the ranks were
    preempted, 0 when all completed, the launcher's own status when a rank died without a word.
    """
    from hookdet.distributed.launcher import (combined_exit_status, ending_away_from_rank_0, failure_lines, killed_in,
                                              killed_line, launcher_death_line, read_rank_statuses, run_passing_signals,
                                              this_node)
    from hookdet.plugins.selection import Launch, select_plugins
    from hookdet.loop.trainer import default_run_dir
    from hookdet.distributed.rank_watch import SilenceWatch, silent_after_of
    from hookdet.search.warm_script import launcher_starter

    launcher = select_plugins(config.plugins, Launch(world_size=slots)).launcher
    if launcher == "horovodrun":
        if args.torchrun:
            raise UsageError(
                f"{' '.join(args.torchrun)}: torchrun options do not apply to the horovod plugin; "
                "to train on several machines with horovod, start horovodrun yourself"
            )
        command = horovodrun_command(args.argv, slots)
        local_ranks = slots
    else:
        command, local_ranks = torchrun_command(args.argv, slots, args.torchrun)
    env = dict(os.environ, **{LAUNCHER_PID_ENV: str(os.getpid())})
    if not args.run_dir and "HOOKDET_RUN_DIR" not in env:
        env["HOOKDET_RUN_DIR"] = str(default_run_dir(config))
    with outcome.records_directory("hookdet-ranks-") as status_dir:
        env[RANK_STATUS_DIR_ENV] = str(status_dir)
        logger.info("launching %d processes: %s", local_ranks, " ".join(command))
        launcher_said: List[str] = []
        watch = SilenceWatch(status_dir, silent_after_of(config), lambda line: print(line, file=sys.stderr, flush=True))
        with launcher_view(status_dir, Path(args.run_dir or env["HOOKDET_RUN_DIR"]), config, env) as view:
            def check() -> None:
                watch.check()
                if view is not None:
                    view.poll()
            launcher_status = run_passing_signals(command, env, status_dir, launcher_said, watch=check,
                                                  fork=launcher_starter(command, env, os.getcwd()))
        late_stop.finished = True  # the ranks have ended: what is left is telling how
        statuses = read_rank_statuses(status_dir)
        killed = killed_in(status_dir)
        lines = failure_lines(status_dir, statuses, local_ranks, killed, every_rank_here=local_ranks == slots)
        if not lines and not statuses:  # no rank had a word: what torchrun saw is all there is
            lines = [killed_line(each) for each in killed.values()]
        died = launcher_death_line(launcher, launcher_status, len(statuses))
        for line in lines + ([died] if died and not lines and not launcher_said else []):
            print(line, file=sys.stderr, flush=True)
        outcome.note_chiefs_training(outcome.read_ranks(status_dir))
    status = combined_exit_status(launcher_status, statuses, local_ranks)
    away = ending_away_from_rank_0(this_node(args.torchrun), statuses, status)
    if away:
        print(away, flush=True)
    return status


@contextlib.contextmanager
def launcher_view(status_dir: Path, run_dir: Path, config: Any, env: Dict[str, str]) -> Iterator[Any]:
    """In a terminal, the launcher's live view of the ranks (:mod:`hookdet.distributed.ranks_view`),
    open for the block, and the ranks told not to draw theirs; elsewhere None."""
    from hookdet.plugins.selection import select_plugins

    if not (sys.stderr.isatty() and select_plugins(config.plugins).shows_progress):
        yield None
        return
    from hookdet.distributed.ranks_view import LAUNCHER_DRAWS_ENV, RanksView

    env[LAUNCHER_DRAWS_ENV] = "1"
    view = RanksView(status_dir, run_dir, config.searcher.metric, sys.stderr)
    view.open()
    try:
        yield view
    finally:
        view.close()


#: The outcome this process wrote, by file: it is written once (again only if the end changed it).
_written: Dict[Path, Outcome] = {}


def report_outcome(status: int, error: Optional[str] = None, error_by: Optional[str] = None) -> int:
    """Record how this process ends (:mod:`hookdet.launch.outcome`): its exit ``status``, its
    state, the one line it said of an ``error`` and whose it was (``error_by``), what its
    training left; for the launcher when it is a rank, and in the file its starter named
    (``HOOKDET_OUTCOME_FILE``) when it is not. Return the status to exit with: 0 for a preempted
    rank (torchrun would count 75 as a failure and kill the other ranks while they exit),
    ``status`` otherwise. A rank refusing bad input waits (a bounded while) for the other ranks
    of its machine to record theirs."""
    from hookdet.exit_codes import BAD_INPUT_EXIT_CODE, PREEMPTED_EXIT_CODE

    status_dir, rank = os.environ.get(RANK_STATUS_DIR_ENV), launched_rank()
    if not status_dir:
        rank = None  # a rank's record goes to its launcher's directory alone
    path = outcome.rank_path(Path(status_dir), rank) if status_dir and rank is not None else (
        Path(os.environ[outcome.OUTCOME_FILE_ENV]) if os.environ.get(outcome.OUTCOME_FILE_ENV) else None)
    ended = process_outcome(status, rank, error, error_by)
    if path is not None and _written.get(path) != ended:  # told before the teardown, the same after it
        outcome.write(path, ended)
        _written[path] = ended
    if not status_dir or rank is None:
        return status
    if status == BAD_INPUT_EXIT_CODE:
        # The other ranks read the same input and are refusing it too: give them the moment to
        # say so before this rank's exit makes torchrun stop them.
        from hookdet.distributed.launcher import wait_for_local_ranks

        wait_for_local_ranks(Path(status_dir))
    return 0 if status == PREEMPTED_EXIT_CODE else status


def process_outcome(status: int, rank: Optional[int], error: Optional[str], error_by: Optional[str]) -> Outcome:
    """This process's outcome record, ending with ``status``."""
    from hookdet.exit_codes import PREEMPTED_EXIT_CODE

    trained = outcome.training()
    if error is not None or status not in (0, PREEMPTED_EXIT_CODE):
        state = "failed"
    elif status == PREEMPTED_EXIT_CODE:
        state = "preempted"
    else:
        state = trained.state if trained is not None and trained.state != "failed" else "completed"
    return Outcome(
        state=state, exit_code=status, rank=rank, pid=os.getpid(),
        signal="SIGINT" if status == 128 + signal.SIGINT else None, error=error, error_by=error_by,
        checkpoint=trained.checkpoint if trained is not None else None,
        batches=trained.batches if trained is not None else None)


def command_plugins(args: argparse.Namespace) -> int:
    """List installed plugins, where each comes from, and the hooks each implements."""
    from hookdet.plugins.manager import DEFAULT_PLUGINS, PluginManager, installed_plugins

    for name, target in sorted(installed_plugins().items()):
        conflicts = ""
        try:  # each plugin alone: a conflict is only real between plugins enabled together
            manager = PluginManager()
            plugin = manager.register(name, import_object(target))
            hooks = ", ".join(manager.hooks_of(plugin)) or "(none)"
            if getattr(plugin, "conflicts_with", ()):
                conflicts = f"\n  cannot run with: {', '.join(plugin.conflicts_with)}"
        except Exception as error:  # an unloadable plugin is listed, not fatal
            hooks = f"cannot load: {error}"
        default = " (default)" if name in DEFAULT_PLUGINS else ""
        print(f"{name}{default}\n  from: {target}\n  hooks: {hooks}{conflicts}{_options_listing(target)}")
    return 0


def _options_listing(target: str) -> str:
    """The ``plugin_config`` options a plugin declares, one line each with its default; or that
    it takes none, or that it checks its options itself (it declares none)."""
    import inspect

    from hookdet.plugins.options import declared_options, option_fields

    try:
        plugin = import_object(target)
        options_type = declared_options(plugin)
    except Exception:  # noqa: BLE001 - the hooks line already says why it cannot load
        return ""
    if options_type is None:
        takes_options = inspect.isclass(plugin) and "options" in inspect.signature(plugin).parameters
        return "\n  options: " + ("not declared (the plugin checks its own)" if takes_options else "none")
    lines = [
        f"\n    {field.name}: {field.type} = {field.default}" + (f"  # {field.description}" if field.description else "")
        for field in option_fields(options_type)
    ]
    return "\n  options:" + "".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``hookdet`` argument parser."""
    parser = argparse.ArgumentParser(prog="hookdet", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"hookdet {version_string()}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="train the trial an experiment file describes")
    run.add_argument("config", help="the experiment file (Determined's YAML)")
    run.add_argument("--resume", metavar="CHECKPOINT", help="a checkpoint or run directory to continue from")
    run.add_argument("--fork", action="store_true", help="with --resume RUN_DIR: continue in a new run directory that records its parent")
    run.add_argument("--model-dir", help="where the entrypoint module lives (default: the config's folder)")
    run.add_argument("--run-dir", help="where metrics, checkpoints and TensorBoard files go")
    run.add_argument("--slots", type=int, help="processes to train with (overrides resources.slots_per_trial)")
    run.add_argument("--test-mode", action="store_true", help="train one batch, validate one, checkpoint")
    run.add_argument(
        "--config", dest="config_overrides", action="append", metavar="KEY=VALUE",
        help="set one field of the experiment file (dotted path, YAML value; repeatable), "
        "e.g. --config hyperparameters.lr=0.01",
    )
    for option in TORCHRUN_OPTIONS:
        run.add_argument(option, dest=f"torchrun_{option[2:].replace('-', '_')}", help=argparse.SUPPRESS)
    run.set_defaults(handler=command_run)
    from hookdet.search.cli import add_run_options, add_search_command

    add_run_options(run)
    add_search_command(commands)

    plugins = commands.add_parser("plugins", help="list installed plugins and their hooks")
    plugins.set_defaults(handler=command_plugins)

    from hookdet.cli.reading import add_reading_commands

    add_reading_commands(commands)
    from hookdet.ui.command import add_ui_command

    add_ui_command(commands)
    return parser


@functools.lru_cache(maxsize=None)
def version_string() -> str:
    """hookdet's installed version (read once a process: the warm process reads it for every
    segment it forks, see :mod:`hookdet.search.warm_ready`)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hookdet")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``hookdet`` console script."""
    take_ctrl_c()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    args.torchrun = [
        f"{option}={getattr(args, 'torchrun_' + option[2:].replace('-', '_'))}"
        for option in TORCHRUN_OPTIONS
        if getattr(args, "torchrun_" + option[2:].replace("-", "_"), None) is not None
    ] if args.command == "run" else []
    logging.basicConfig(level=logging.INFO, format="%(asctime)s hookdet %(levelname)s %(message)s")
    from hookdet.errors import InvalidHP
    from hookdet.exit_codes import BAD_INPUT_EXIT_CODE, INVALID_HP_EXIT_CODE

    error_line: Optional[str] = None
    error_by: Optional[str] = None
    outcome.forget_training()
    _written.clear()
    try:
        status = args.handler(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
    except InvalidHP as error:
        print(f"hookdet: the trial raised InvalidHP: {error}", file=sys.stderr)
        status, error_line, error_by = INVALID_HP_EXIT_CODE, f"the trial raised InvalidHP: {error}", "user"
    except HookdetError as error:
        status, error_line, error_by = _say_error(str(error), BAD_INPUT_EXIT_CODE, "input")
    except BrokenPipeError:  # the reader went away (``hookdet plugins | head``): stop quietly
        return _stop_writing_to_a_closed_pipe()
    except KeyboardInterrupt:  # Ctrl-C where no plugin turns it into a checkpoint and a stop
        status, error_line, error_by = _say_error(
            "interrupted (Ctrl-C); nothing since the last checkpoint was saved", 128 + signal.SIGINT, "user")
    except Exception as error:
        status, error_line, error_by = _report_failure(error)
    return report_outcome(status, error_line, error_by)


def _stop_writing_to_a_closed_pipe() -> int:
    """Point stdout at /dev/null (so the interpreter's final flush cannot fail again) and return
    128 + SIGPIPE, the status a Unix tool killed by the broken pipe has."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _report_failure(error: Exception) -> Tuple[int, str, str]:
    """Report an error that is not hookdet's one-line kind; the exit status, the line said and
    whose error it was (see :mod:`hookdet.cli.failure_report`). A hookdet bug is raised again,
    whole, once its outcome is recorded."""
    from hookdet.cli import failure_report
    from hookdet.checkpoints.os_errors import environment_fault

    fault = environment_fault(error) if isinstance(error, OSError) else None
    if fault is not None:  # the machine's fault (disk full, no permission): one line
        return _say_error(fault, 2, "machine")
    lost = failure_report.peer_loss(error)
    if lost is not None:
        return _say_error(f"lost contact with the other ranks ({type(error).__name__}: {lost})", 1, "machine")
    trimmed = failure_report.user_traceback(error)
    if trimmed is None:
        report_outcome(*_say_error(f"hookdet failed: {failure_report.one_line(error)} (a bug: please report the "
                                   "traceback below)", 1, "hookdet"))
        raise error
    sys.stderr.write(trimmed)
    return _say_error(f"the trial raised {failure_report.one_line(error)} (traceback above)", 1, "user")


def _say_error(message: str, status: int, by: str) -> Tuple[int, str, str]:
    """Print ``hookdet: error: message`` (but a rank under the launcher, whose outcome record
    carries it to the launcher, which prints it once for all ranks); ``(status, message, by)``."""
    if not (os.environ.get(RANK_STATUS_DIR_ENV) and launched_rank() is not None):
        print(f"hookdet: error: {message}", file=sys.stderr)
    return status, message, by
