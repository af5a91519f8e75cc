"""The commands that read what runs and searches recorded: ``export``, ``runs``, ``show``,
``compare``, ``plot`` and ``logs``. A search directory stands for its trials (or, for
``export``, its best trial)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, List

from hookdet.errors import UsageError


def add_reading_commands(commands: Any) -> None:
    """Add the reading commands to the ``hookdet`` parser's subcommands."""
    export = commands.add_parser("export", help="write a checkpoint's model weights for plain PyTorch")
    export.add_argument("checkpoint", help="a checkpoint or run directory")
    export.add_argument("output", help="the .pt file to write")
    export.add_argument("--model-index", type=int, default=0, help="which wrapped model (default 0)")
    export.set_defaults(handler=command_export)

    runs = commands.add_parser("runs", help="list the runs in a folder: state, batches, best metric")
    runs.add_argument("directory", nargs="?", default="runs", help="where to look (default: ./runs)")
    show = commands.add_parser("show", help="one run: state, config changes, metrics, checkpoints")
    show.add_argument("run", help="a run directory (or its name under ./runs), or a search directory")
    compare = commands.add_parser("compare", help="two or more runs' metrics side by side")
    compare.add_argument("runs", nargs="+", metavar="RUN", help="run directories (a search directory: its trials)")
    plot = commands.add_parser("plot", help="a PNG of the metrics of one or more runs (hookdet[plot])")
    plot.add_argument("runs", nargs="+", metavar="RUN", help="run directories (a search directory: its trials)")
    plot.add_argument("-o", "--output", required=True, help="the PNG file to write")
    plot.add_argument("--log", action="store_true", help="values on a log scale")
    for command in (runs, show, compare, plot):
        command.set_defaults(handler=command_runs)
    logs = commands.add_parser("logs", help="what a run's processes printed, as det trial logs showed it")
    logs.add_argument("run", help="a run directory (or its name under ./runs)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the run ends")
    logs.add_argument("--rank", type=int, help="only this rank's lines")
    logs.set_defaults(handler=command_logs)


def command_export(args: argparse.Namespace) -> int:
    """Write a bare ``model.state_dict()`` from a checkpoint."""
    from hookdet.checkpoints.api import export_model_state
    from hookdet.search import report

    checkpoint = args.checkpoint
    if report.is_search_dir(Path(checkpoint)):  # a search stands for its best trial
        try:
            run_dir, which = report.best_trial(Path(checkpoint))
        except report.SearchReadError as error:
            raise UsageError(str(error)) from None
        print(which)
        checkpoint = str(run_dir)
    path = export_model_state(checkpoint, args.output, args.model_index)
    print(f"wrote model {args.model_index}'s state_dict to {path}")
    return 0


def command_runs(args: argparse.Namespace) -> int:
    """``runs``, ``show``, ``compare`` and ``plot``: see :mod:`hookdet.runs.index`; a search
    directory is read by :mod:`hookdet.search.report`."""
    from hookdet.runs import index as run_index
    from hookdet.search import report

    try:
        if args.command == "runs":
            groups = {folder: report.runs_group(folder) for folder in report.find_searches(Path(args.directory))}
            print(run_index.list_runs(Path(args.directory), groups))
        elif args.command == "show":
            shown = Path(args.run)
            if report.is_search_dir(shown):
                print(report.show_search(shown))
            else:
                run_dir = run_index.resolve_run(args.run)
                print(run_index.show_run(run_dir, report.trial_states([run_dir]).get(run_dir.resolve())))
        elif args.command == "compare":
            run_dirs = _runs_named(args.runs)
            print(run_index.compare_runs(run_dirs, report.trial_states(run_dirs)))
        else:
            _plot(args.runs, Path(args.output), args.log)
            print(f"wrote {args.output}")
    except (run_index.RunNotFoundError, report.SearchReadError) as error:
        raise UsageError(str(error)) from None
    return 0


def _runs_named(given: List[str]) -> List[Path]:
    """The run directories the user named: a search directory stands for its trials."""
    from hookdet.runs import index as run_index
    from hookdet.search import report

    paths: List[Path] = []
    for name in given:
        paths += report.trial_dirs(Path(name)) if report.is_search_dir(Path(name)) else [run_index.resolve_run(name)]
    return paths


def _plot(given: List[str], output: Path, log_scale: bool) -> None:
    """Every metric of the runs named (a search directory: of each of its trials), a panel each."""
    from hookdet.runs.plot import PlotUnavailableError, plot_runs

    try:
        plot_runs(_runs_named(given), output, log_scale)
    except PlotUnavailableError as error:
        raise UsageError(str(error)) from None


def command_logs(args: argparse.Namespace) -> int:
    """Print the run's log lines (every rank's, by time), and with ``--follow`` new ones until
    the run ends."""
    from hookdet.runs import index as run_index
    from hookdet.runs import logs as run_logs

    try:
        run_dir = run_index.resolve_run(args.run)
    except run_index.RunNotFoundError as error:
        raise UsageError(str(error)) from None
    if not run_logs.log_files(run_dir, args.rank):
        raise UsageError(f"{run_dir} has no logs" + (f" of rank {args.rank}" if args.rank is not None else "") +
                         " (runs before hookdet kept logs, or one with no:run_log, have none)")
    for line in (run_logs.follow(run_dir, args.rank) if args.follow else run_logs.read_lines(run_dir, args.rank)):
        print(line, flush=args.follow)
    return 0
