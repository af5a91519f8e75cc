"""``hookdet run CONFIG`` for a search, and ``hookdet search preview|worker|summary``.

``hookdet run`` hands a config whose ``searcher.name`` is not ``single`` (or ``--resume`` of a
search directory) to :func:`run_search`. The search directory (``--run-dir``, default
``runs/<name>-search-<time>``) holds ``search.json`` (config, store), ``search-state.json``
(the driver's state), ``trial-NNN/`` (one ordinary run directory per trial), ``summary.csv``
and ``searcher-metric.png``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from hookdet.search.report import META_FILE


def add_run_options(run_parser: argparse.ArgumentParser) -> None:
    """``hookdet run``'s search options."""
    run_parser.add_argument("--workers", type=int, help="trials trained at once by a search "
                            "(default: visible GPUs / slots_per_trial, 1 on CPU)")
    run_parser.add_argument("--storage", help="a search's Optuna store: an RDB URL or "
                            "journal:PATH (default: sqlite in the search directory)")


def is_search(config: Any, args: argparse.Namespace) -> bool:
    """Whether ``hookdet run`` should run a search rather than one trial."""
    if args.resume and (Path(args.resume) / META_FILE).exists():
        return True
    return config.searcher.name != "single"


def _usage_error(message: str) -> Exception:
    from hookdet.errors import UsageError

    return UsageError(message)


def load_search(config_path: Path, options: Sequence[str] = ()) -> tuple:
    """(validated config, the file's raw content, search settings, hyperparameter space), with
    ``--config`` ``options`` applied to both the config and the raw content."""
    from hookdet.config import read_experiment_file, with_overrides
    from hookdet.config.overrides import load_with_overrides, loader_overrides
    from hookdet.search.settings import SearchConfigError, read_settings

    config = load_with_overrides(config_path, options)
    raw = read_experiment_file(config_path)
    if options:
        raw = with_overrides(raw, loader_overrides(raw, options)[0], str(config_path))
    try:
        settings = read_settings(raw, str(config_path))
    except SearchConfigError as error:
        raise _usage_error(_with_line(error, config_path, options)) from None
    space = config.hyperparameter_space or dict(config.hyperparameters)
    if settings.name == "grid":
        from hookdet.search.space import missing_counts

        missing = missing_counts(space)
        if missing:
            raise _usage_error(
                f"{config_path}: searcher.name is grid, but hyperparameter(s) {', '.join(missing)} "
                "have no count: a grid needs a count of points for every int, double and log "
                "hyperparameter")
    undecidable = rungs_decided_only_at_the_end(config, settings)
    for warning in settings.warnings + ([undecidable] if undecidable else []):
        print(f"hookdet: warning: {config_path}: searcher: {warning}", file=sys.stderr, flush=True)
    return config, raw, settings, space


def _with_line(error: Any, config_path: Path, options: Sequence[str]) -> str:
    """``error``'s message with the line of the field at fault in ``config_path``, where one
    field is at fault and the file (not a ``--config`` option) gave it."""
    from hookdet.config.reading import line_of_field

    message = str(error)
    prefix = f"{config_path}: "
    dotted = ".".join(error.field or ())
    if not dotted or not message.startswith(prefix) or any(
            option.split("=", 1)[0].strip() == dotted for option in options):
        return message
    line = line_of_field(config_path, error.field)
    return f"{config_path}:{line}: {message[len(prefix):]}" if line else message


def rungs_decided_only_at_the_end(config: Any, settings: Any) -> Optional[str]:
    """Why a staged search (ASHA, a pruner) can stop no trial early, or None: a rung is decided
    at the first validation at or past it, and the trial class validates only at its end (no
    ``min_validation_period``, as a legacy file converted to ``time_metric``/``max_time`` often
    has) or at a period that passes every rung only at the end. A script sets its own period in
    ``Trainer.fit``, so it is not judged here."""
    from hookdet.config import names_trial_class
    from hookdet.search import methods

    if not settings.staged or not settings.max_length or not names_trial_class(config.entrypoint or ""):
        return None
    rungs = [units for bracket in methods.rungs_of(settings.build({})) for units in bracket]
    early = sorted({units for units in rungs if units < settings.max_length})
    period = config.min_validation_period
    if not early:
        return None
    if period is None:
        where = "trials validate only at their end (no min_validation_period)"
    elif period.unit == settings.unit and all(
            -(-units // period.value) * period.value >= settings.max_length for units in early):
        where = f"trials validate every {period} (min_validation_period)"
    else:
        return None
    return (f"no rung can be decided before a trial's end, so no trial stops early: {where}, and a "
            f"rung is decided at the first validation at or past it (rungs at {early} {settings.unit}); "
            f"set min_validation_period to at most {{{settings.unit}: {early[0]}}}")


def _default_workers(slots_per_trial: int) -> int:
    from hookdet.search.worker import visible_gpus

    gpus = len(visible_gpus())
    return max(gpus // max(slots_per_trial, 1), 1)


def has_trials(searcher: str, space: Dict[str, Any]) -> bool:
    """Whether the search can make a trial: all but Determined's grid of no hyperparameter axes
    (for that one, starting the warm process would import torch for nothing)."""
    from hookdet.search.space import grid

    return searcher != "grid" or bool(grid(space))


def run_search(args: argparse.Namespace) -> int:
    """Run (or, with ``--resume SEARCH_DIR``, continue) the search ``args.config`` describes."""
    from hookdet.search import summary
    from hookdet.search.store import LEGACY_STUDY_NAME, Queue

    config_path = Path(args.config).resolve()
    config, raw, settings, space = load_search(config_path, args.config_overrides or ())
    model_dir = Path(args.model_dir).resolve() if args.model_dir else config_path.parent
    slots = config.resources.slots_per_trial
    workers = args.workers if args.workers is not None else _default_workers(slots)
    if settings.max_concurrent_trials > 0:
        workers = min(workers, settings.max_concurrent_trials)
    from hookdet.search.warm_pool import WarmPool

    pool = WarmPool()  # this process's warm process, for its local workers
    if workers > 0 and has_trials(settings.name, space):  # it imports torch while this process
        pool.warm_up(model_dir, raw.get("entrypoint"))  # opens the store and decides
    # up: hookdet run's own handler of a late SIGTERM, the same for a search as for a run
    from hookdet.cli.run_edges import LateStop
    from hookdet.search.driver import Driver

    if not args.resume:
        check_warm_start_source(config, config_path, model_dir)
    search_dir, meta, moved_from = search_directory(args, config, config_path, as_stored(raw))
    lock_search_directory(search_dir)
    from hookdet.search.model_snapshot import snapshot, snapshot_of

    model_dir = snapshot_of(search_dir) or (model_dir if args.resume else snapshot(model_dir, search_dir))
    storage = args.storage or meta["storage"]
    study = meta.get("study", LEGACY_STUDY_NAME)
    meta.update(storage=storage, study=study, searcher=settings.name, metric=settings.metric,
                smaller_is_better=settings.smaller_is_better)
    queue = Queue(storage, study, create=True, smaller_is_better=settings.smaller_is_better)
    # Written once the study exists: whoever finds search.json (a worker, a --resume) finds it.
    (search_dir / META_FILE).write_text(json.dumps(meta, indent=1))
    driver = Driver(search_dir, settings, space, raw, model_dir, queue,
                    config.reproducibility.experiment_seed, pool)
    if args.resume and driver.state_path.exists():
        driver.load(moved_from)
        queue.set_info({"search_dir": str(search_dir)})
        driver.flush()
    else:  # fresh, or killed before its first decision was saved (nothing was queued then)
        queue.set_info({"search_dir": str(search_dir), "slots_per_trial": slots, "finished": False})
        driver.start()
    summary.prefetch_plotting()
    LateStop.install(has_finished=lambda: driver.ended)  # the summary is written whatever comes
    status = driver.run(max(workers, 0), slots, announce=f"hookdet: {settings.name} search in {search_dir} "
                        f"({max(workers, 0)} local workers; store {storage})")
    pool.close()  # no segment runs any more: the warm process would only tear down slowly
    finish(search_dir, driver.state, settings.metric, settings.smaller_is_better)
    trials = driver.state["trials"].values()
    if status == 0 and trials and all(t["state"] == "errored" for t in trials):
        return 1
    return status


def search_directory(args: argparse.Namespace, config: Any, config_path: Path,
                     experiment: Dict[str, Any]) -> tuple:
    """(resolved search directory, its ``search.json`` content, the directory it was in when it
    was copied or moved since, else None): the one ``--resume`` names (checked to hold a search of
    the same experiment), or a new one. A copy's default store is its own ``search.db``."""
    from hookdet.search.store import default_storage, study_name

    if args.resume:
        search_dir = Path(args.resume)
        if not (search_dir / META_FILE).exists():
            raise _usage_error(f"{search_dir} is not a search directory (no {META_FILE} in it)")
        meta = json.loads((search_dir / META_FILE).read_text())
        refuse_another_experiment(search_dir, meta, config_path, experiment)
    else:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", config.name or "experiment").strip("-") or "search"
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        search_dir = Path(args.run_dir) if args.run_dir else Path("runs") / f"{name}-search-{stamp}"
        if (search_dir / META_FILE).exists():
            raise _usage_error(f"{search_dir} already holds a search; continue it with "
                               f"--resume {search_dir}")
        search_dir.mkdir(parents=True, exist_ok=True)
        meta = {"config": str(config_path), "storage": args.storage or default_storage(search_dir),
                "study": study_name(search_dir), "experiment": experiment}
    search_dir = search_dir.resolve()
    moved_from = meta.get("search_dir") if meta.get("search_dir") not in (None, str(search_dir)) else None
    if moved_from and meta["storage"] == default_storage(Path(moved_from)):
        meta["storage"] = default_storage(search_dir)  # a copy's own store, not the original's
    meta["search_dir"] = str(search_dir)
    return search_dir, meta, moved_from


def check_warm_start_source(config: Any, config_path: Path, model_dir: Path) -> None:
    """``searcher.source_checkpoint_uuid`` must name a checkpoint before any trial starts from it
    (Determined refuses the experiment at creation): a checkpoint or run directory (relative to
    the model directory, where trials run), a checkpoint id of this user's index, or one in the
    experiment's checkpoint storage."""
    from hookdet.checkpoints import user_index
    from hookdet.checkpoints.registry import make_storage
    from hookdet.checkpoints.storage import CheckpointNotFoundError, StorageError

    source = config.searcher.source_checkpoint_uuid
    if not source or (model_dir / source).exists() or user_index.lookup(source) is not None:
        return
    where = "the experiment's checkpoint storage (none is set)"
    if "/" not in source and config.checkpoint_storage is not None:
        try:
            storage = make_storage(config.checkpoint_storage, Path.cwd())
            where = storage.describe()
            storage.read_metadata(source)
            return
        except CheckpointNotFoundError:
            pass
        except StorageError as error:
            raise _usage_error(f"{config_path}: searcher.source_checkpoint_uuid {source!r}: {error}") from None
    raise _usage_error(
        f"{config_path}: searcher.source_checkpoint_uuid {source!r} names no checkpoint: not a "
        f"checkpoint or run directory in {model_dir}, and not an id in this user's checkpoint index "
        f"or in {where}")


def as_stored(raw: Dict[str, Any]) -> Dict[str, Any]:
    """The experiment (file content with ``--config`` options applied) as ``search.json`` keeps it."""
    return json.loads(json.dumps(raw, default=str))


def refuse_another_experiment(search_dir: Path, meta: Dict[str, Any], config_path: Path,
                              experiment: Dict[str, Any]) -> None:
    """A search resumes with the experiment it was started with: another file, or other
    ``--config`` options, is refused naming the first field that differs."""
    from hookdet.runs.index import config_differences

    started_with = meta.get("experiment")
    if started_with is None or started_with == experiment:  # a search from before it was kept
        return
    differences = config_differences(started_with, experiment)
    field, before, after = differences[0]
    more = f" (and {len(differences) - 1} more field(s))" if len(differences) > 1 else ""
    raise _usage_error(
        f"cannot resume search {search_dir} with {config_path}: {field} is {json.dumps(after)} here "
        f"but was {json.dumps(before)} when the search started{more}; resume with the experiment "
        f"file and --config options it was started with ({meta.get('config')})")


#: The search directory's lock, held for the driver's life (the kernel drops it at its exit).
_DRIVER_LOCKS: list = []


def lock_search_directory(search_dir: Path) -> None:
    """One driver per search: refuse a second one (a ``--resume`` of a live search) naming the
    live driver."""
    from hookdet.runs.lock import RunDirLock, RunDirLockedError

    lock = RunDirLock(search_dir)
    try:
        lock.acquire()
    except RunDirLockedError:
        raise _usage_error(f"search {search_dir} is running ({lock.holder()}); wait for it to end, "
                           "or add workers to it with: hookdet search worker "
                           f"{search_dir}") from None
    _DRIVER_LOCKS.append(lock)


def finish(search_dir: Path, state: Dict[str, Any], metric: str, smaller_is_better: bool) -> None:
    """Write summary.csv and the plot; print the table."""
    from hookdet.search import summary

    table = summary.rows(state, smaller_is_better, metric)
    summary.write_csv(table, search_dir / "summary.csv")
    summary.plot(state, metric, search_dir / "searcher-metric.png")
    print(summary.format_table(table, metric), flush=True)
    print(summary.best_line(table, state, metric, smaller_is_better), flush=True)
    print(f"summary: {search_dir / 'summary.csv'}", flush=True)


# ---------------------------------------------------------------------------------------------
# hookdet search ...
# ---------------------------------------------------------------------------------------------


def preview(config_path: Path, count: Optional[int] = None, options: Sequence[str] = ()) -> str:
    """What the search would run (with ``--config`` ``options`` applied): brackets and rungs, and
    the initial trials' draws."""
    from hookdet.search import methods
    from hookdet.search.space import MasterRandom

    config, _, settings, space = load_search(config_path, options)
    method = settings.build(space)
    ctx = methods.Context(MasterRandom(config.reproducibility.experiment_seed), space)
    creates = method.initial_trials(ctx)
    length = (f"{settings.max_length} {settings.unit}" if settings.max_length
              else "the length each trial sets itself (e.g. a script's Trainer.fit(max_length=...))")
    trained = f"each trained {settings.max_length} {settings.unit}" if settings.max_length else \
        "each trained to the length it sets"
    lines = [f"{settings.name} search of {config_path.name}: metric {settings.metric} "
             f"({'smaller' if settings.smaller_is_better else 'larger'} is better), "
             f"max length {length}"]
    if isinstance(method, methods.AdaptiveASHASearch):
        for index, bracket in enumerate(method.brackets):
            units = [r["units"] for r in bracket.state["rungs"]]
            lines.append(f"  bracket {index}: {bracket.max_trials} trials, at most "
                         f"{bracket.max_concurrent} at once, rungs at {units} {settings.unit}")
    elif isinstance(method, methods.AsyncHalvingSearch):
        units = [r["units"] for r in method.state["rungs"]]
        lines.append(f"  {method.max_trials} trials, rungs at {units} {settings.unit}")
    elif settings.name == "optuna":
        rungs = f", rungs at {method.rungs} {settings.unit} ({settings.pruner} pruner)" if method.rungs else ""
        lines.append(f"  {method.max_trials} trials, at most {method.max_concurrent} at once, "
                     f"{settings.sampler} sampler{rungs}")
    elif isinstance(method, methods.GridSearch):
        points = len(creates) + len(method.state["remaining"])
        lines.append(f"  {points} grid points, {trained}"
                     + ("" if points else " (no hyperparameters to search: no trial, as in Determined)"))
    else:
        lines.append(f"  {method.max_trials} trials, {trained}")
    lines.append(f"  first {len(creates[:count])} trials created:")
    for number, create in enumerate(creates[:count], 1):
        lines.append(f"    trial {number}: seed {create.seed} hparams {json.dumps(create.hparams)}")
    return "\n".join(lines)


def add_search_command(commands: Any) -> None:
    """``hookdet search``'s subcommands."""
    search = commands.add_parser("search", help="preview a search, or join one as a worker")
    actions = search.add_subparsers(dest="search_command", required=True)
    show = actions.add_parser("preview", help="the trials and rungs a search would run")
    show.add_argument("config")
    show.add_argument("--config", dest="config_overrides", action="append", metavar="KEY=VALUE", default=[],
                      help="set one field of the experiment file, as hookdet run's --config does")
    show.set_defaults(handler=lambda args: _print(preview(Path(args.config), options=args.config_overrides)))
    worker = actions.add_parser("worker", help="train a search's trials from its store")
    worker.add_argument("search_dir", nargs="?", help="the search directory (reads its store)")
    worker.add_argument("--storage", help="the store's URL (instead of a search directory)")
    worker.add_argument("--study", help="with --storage: the search's study, when the store "
                        "holds several searches (search.json names it)")
    worker.add_argument("--index", type=int, default=0, help="this worker's slot on the machine")
    worker.add_argument("--of", type=int, default=1, help="workers on this machine")
    worker.add_argument("--work-dir", type=Path, help="train in this directory, sharing only the store "
                        "and the checkpoint storage (e.g. S3) with the driver and other workers")
    worker.add_argument("--model-dir", type=Path, help="with --work-dir: this machine's copy of the "
                        "model directory (default: the driver's path)")
    worker.set_defaults(handler=command_worker)


def _print(text: str) -> int:
    print(text)
    return 0


def command_worker(args: argparse.Namespace) -> int:
    from hookdet.search.worker import main_worker

    from hookdet.search.store import LEGACY_STUDY_NAME

    storage, study = args.storage, args.study
    if storage is None:
        if not args.search_dir or not (Path(args.search_dir) / META_FILE).exists():
            raise _usage_error("hookdet search worker needs a search directory or --storage URL")
        meta = json.loads((Path(args.search_dir) / META_FILE).read_text())
        storage, study = meta["storage"], meta.get("study", LEGACY_STUDY_NAME)
    if args.model_dir is not None and args.work_dir is None:
        raise _usage_error("hookdet search worker: --model-dir goes with --work-dir")
    return main_worker(storage, args.index, args.of, study, args.work_dir, args.model_dir)
