"""The ``hookdet`` command: ``run`` an experiment file, list ``plugins``, ``export`` a model.

``hookdet run CONFIG`` with ``resources.slots_per_trial: N`` (or ``--slots N``) re-launches itself
under ``torch.distributed.run`` (torchrun) with N processes; torchrun's own options pass through
for several nodes.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence

logger = logging.getLogger("hookdet")

#: torchrun options ``hookdet run`` passes through, for several nodes.
TORCHRUN_OPTIONS = (
    "--nnodes",
    "--node-rank",
    "--rdzv-endpoint",
    "--rdzv-backend",
    "--rdzv-id",
    "--master-addr",
    "--master-port",
    "--max-restarts",
    "--monitor-interval",
)


class UsageError(Exception):
    """A command-line or entrypoint problem; printed as one line."""


def load_trial_class(entrypoint: Optional[str], model_dir: Path, source: str) -> type:
    """Import the ``module:Class`` entrypoint from ``model_dir``; errors name the config file."""
    from hookdet.trial import PyTorchTrial

    if not entrypoint or ":" not in entrypoint:
        raise UsageError(f"{source}: entrypoint must be 'module:TrialClass', got {entrypoint!r}")
    module_name, _, class_name = entrypoint.partition(":")
    if str(model_dir) not in sys.path:
        sys.path.insert(0, str(model_dir))
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise UsageError(
            f"{source}: entrypoint {entrypoint!r}: cannot import module {module_name!r} from "
            f"{model_dir}: {type(error).__name__}: {error}"
        ) from error
    target: Any = module
    for part in class_name.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise UsageError(
                f"{source}: entrypoint {entrypoint!r}: module {module_name!r} has no {class_name!r}"
            )
    if not (isinstance(target, type) and issubclass(target, PyTorchTrial)):
        raise UsageError(
            f"{source}: entrypoint {entrypoint!r} is not a PyTorchTrial subclass "
            "(did the trial import PyTorchTrial from hookdet.pytorch?)"
        )
    return target


def command_run(args: argparse.Namespace) -> int:
    """Train the experiment in ``args.config``; return the exit status."""
    from hookdet.builtin_plugins.preemption import PREEMPTED_EXIT_CODE
    from hookdet.config import load_experiment_config
    from hookdet.trainer import Trainer, fit_arguments, init

    config_path = Path(args.config)
    config = load_experiment_config(config_path)
    if args.slots is not None:
        config.resources.slots_per_trial = args.slots
    if config.ignored_fields:
        logger.info(
            "%s: cluster-only fields ignored when running locally: %s",
            config_path, ", ".join(config.ignored_fields),
        )
    slots = config.resources.slots_per_trial
    if slots > 1 and "LOCAL_RANK" not in os.environ:
        return _launch_torchrun(args, slots)
    model_dir = Path(args.model_dir) if args.model_dir else config_path.resolve().parent
    trial_class = load_trial_class(config.entrypoint, model_dir, str(config_path))
    with init(exp_conf=config, run_dir=args.run_dir, model_dir=model_dir) as context:
        run = context._run
        trial = trial_class(context)
        fit = fit_arguments(config, context)
        if fit["max_length"] is None:
            raise UsageError(f"{config_path}: searcher.max_length is required to train")
        Trainer(trial, context).fit(
            **fit, latest_checkpoint=args.resume, test_mode=args.test_mode
        )
        if run.is_chief:
            _print_summary(run)
    if run.exit_reason == "preempted":
        return PREEMPTED_EXIT_CODE
    return 0


def _launch_torchrun(args: argparse.Namespace, slots: int) -> int:
    """Re-run this command under torchrun with ``slots`` processes per node."""
    from hookdet.trainer import default_run_dir

    command: List[str] = [sys.executable, "-m", "torch.distributed.run"]
    passthrough = list(args.torchrun or [])
    if not any(option.startswith(("--nnodes", "--rdzv-endpoint")) for option in passthrough):
        command.append("--standalone")
    command += [f"--nproc-per-node={slots}", *passthrough, "-m", "hookdet", *args.argv]
    env = dict(os.environ)
    if not args.run_dir and "HOOKDET_RUN_DIR" not in env:
        from hookdet.config import load_experiment_config

        env["HOOKDET_RUN_DIR"] = str(default_run_dir(load_experiment_config(Path(args.config))))
    logger.info("launching %d processes: %s", slots, " ".join(command))
    return subprocess.call(command, env=env)


def _print_summary(run: Any) -> None:
    state = run.state
    metric = run.config.searcher.metric
    best = "none" if state.best_validation is None else f"{state.best_validation:.6g}"
    lines = [
        f"hookdet: {run.exit_reason or 'finished'} after {state.batches_trained} batches",
        f"  best {metric}: {best}",
        f"  run directory: {run.run_dir}",
    ]
    if state.latest_checkpoint and run.storage is not None:
        lines.append(f"  latest checkpoint: {run.storage.location(state.latest_checkpoint)}")
    print("\n".join(lines), flush=True)


def command_plugins(args: argparse.Namespace) -> int:
    """List installed plugins, where each comes from, and the hooks each implements."""
    from hookdet.plugin_manager import DEFAULT_PLUGINS, PluginManager, installed_plugins

    manager = PluginManager()
    for name, target in sorted(installed_plugins().items()):
        try:
            plugin = manager.register(name, _load_entry_point(target))
            hooks = ", ".join(manager.hooks_of(plugin)) or "(none)"
        except Exception as error:  # an unloadable plugin is listed, not fatal
            hooks = f"cannot load: {error}"
        default = " (default)" if name in DEFAULT_PLUGINS else ""
        print(f"{name}{default}\n  from: {target}\n  hooks: {hooks}")
    return 0


def _load_entry_point(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attribute.split(".")):
        obj = getattr(obj, part)
    return obj


def command_export(args: argparse.Namespace) -> int:
    """Write a bare ``model.state_dict()`` from a checkpoint."""
    from hookdet.checkpoint_api import export_model_state

    path = export_model_state(args.checkpoint, args.output, args.model_index)
    print(f"wrote model {args.model_index}'s state_dict to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``hookdet`` argument parser."""
    parser = argparse.ArgumentParser(prog="hookdet", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="train the trial an experiment file describes")
    run.add_argument("config", help="the experiment file (Determined's YAML)")
    run.add_argument("--resume", metavar="CHECKPOINT", help="a checkpoint or run directory to continue from")
    run.add_argument("--model-dir", help="where the entrypoint module lives (default: the config's folder)")
    run.add_argument("--run-dir", help="where metrics, checkpoints and TensorBoard files go")
    run.add_argument("--slots", type=int, help="processes to train with (overrides resources.slots_per_trial)")
    run.add_argument("--test-mode", action="store_true", help="train one batch, validate one, checkpoint")
    for option in TORCHRUN_OPTIONS:
        run.add_argument(option, dest=f"torchrun_{option[2:].replace('-', '_')}", help=argparse.SUPPRESS)
    run.set_defaults(handler=command_run)

    plugins = commands.add_parser("plugins", help="list installed plugins and their hooks")
    plugins.set_defaults(handler=command_plugins)

    export = commands.add_parser("export", help="write a checkpoint's model weights for plain PyTorch")
    export.add_argument("checkpoint", help="a checkpoint or run directory")
    export.add_argument("output", help="the .pt file to write")
    export.add_argument("--model-index", type=int, default=0, help="which wrapped model (default 0)")
    export.set_defaults(handler=command_export)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``hookdet`` console script."""
    from hookdet.checkpoint_format import CheckpointError
    from hookdet.config import ConfigError
    from hookdet.data import DatasetReproducibilityError
    from hookdet.plugin_manager import PluginError
    from hookdet.reducers import MetricError
    from hookdet.trial import TrialError

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    args.torchrun = [
        f"{option}={getattr(args, 'torchrun_' + option[2:].replace('-', '_'))}"
        for option in TORCHRUN_OPTIONS
        if getattr(args, "torchrun_" + option[2:].replace("-", "_"), None) is not None
    ] if args.command == "run" else []
    logging.basicConfig(level=logging.INFO, format="%(asctime)s hookdet %(levelname)s %(message)s")
    known = (UsageError, ConfigError, PluginError, CheckpointError, TrialError, MetricError, DatasetReproducibilityError)
    try:
        return args.handler(args)
    except known as error:
        print(f"hookdet: error: {error}", file=sys.stderr)
        return 2
