"""The experiment-file path of a parity case: the same experiment file trained by Determined's
legacy harness and by ``hookdet run``.

On a cluster, ``entrypoint: module:Trial`` runs ``determined.exec.harness``, whose
``_run_pytorch_trial`` maps the experiment config (with the master's defaults filled in) onto
``pytorch.init`` and ``Trainer.fit``. That needs a master, so :func:`determined_legacy_harness`
performs the same mapping with Determined's own functions (``TrainUnit._from_values``,
``core._parse_searcher_max_length``, ``TrainUnit._from_searcher_unit``) and seeds as the cluster
does (``_set_random_seeds(trial_seed)``), in local training mode. Local mode differs from the
cluster in two ways the cases avoid: ``checkpoint_policy: best`` falls back to ``all`` (the
cases use ``all`` or ``none``), and TensorBoard logging is off (Determined does not depend on
``tensorboard``: expected difference ``tensorboard-not-a-dependency``).
:func:`hookdet_run` runs ``hookdet run exp.yaml`` through the CLI's own ``main``, in this process.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict, Optional


#: What Determined's master fills in for fields an experiment file leaves out (its expconf
#: schema defaults for these fields).
MASTER_DEFAULTS: Dict[str, Any] = {
    "min_validation_period": {"batches": 0},
    "min_checkpoint_period": {"batches": 0},
    "scheduling_unit": 100,
    "perform_initial_validation": False,
    "checkpoint_policy": "best",
    "optimizations": {"aggregation_frequency": 1, "average_aggregated_gradients": True,
                      "gradient_compression": False},
    "profiling": {"enabled": False},
}


def with_master_defaults(experiment: Dict[str, Any]) -> Dict[str, Any]:
    config = copy.deepcopy(experiment)
    for key, default in MASTER_DEFAULTS.items():
        if key in ("optimizations", "profiling"):  # blocks of fields; the rest are whole values
            config[key] = {**default, **config.get(key, {})}
        else:
            config.setdefault(key, default)
    return config


def determined_legacy_harness(trial_class: Any, experiment: Dict[str, Any], trial_seed: int,
                              latest_checkpoint: Optional[str]) -> None:
    """Train ``trial_class`` as ``_run_pytorch_trial`` would on a cluster."""
    from determined import core, pytorch
    from determined.pytorch import _trainer

    config = with_master_defaults(experiment)
    hparams = config["hyperparameters"]
    optimizations = config["optimizations"]
    with pytorch.init(hparams=hparams, exp_conf=config, enable_tensorboard_logging=False,
                      aggregation_frequency=int(optimizations["aggregation_frequency"])) as context:
        context._set_default_gradient_compression(bool(optimizations["gradient_compression"]))
        context._set_default_average_aggregated_gradients(bool(optimizations["average_aggregated_gradients"]))
        context._set_is_pre_trainer()
        _trainer._set_random_seeds(trial_seed)  # what pytorch.init does on a cluster
        trial = trial_class(context)
        global_batch_size = int(hparams["global_batch_size"])
        max_length = pytorch.TrainUnit._from_searcher_unit(
            core._parse_searcher_max_length(config), core._parse_searcher_units(config), global_batch_size
        )
        pytorch.Trainer(trial, context).fit(
            max_length=max_length,
            checkpoint_period=pytorch.TrainUnit._from_values(
                **config["min_checkpoint_period"], global_batch_size=global_batch_size),
            validation_period=pytorch.TrainUnit._from_values(
                **config["min_validation_period"], global_batch_size=global_batch_size),
            reporting_period=pytorch.Batch(config["scheduling_unit"]),
            checkpoint_policy=config["checkpoint_policy"],
            latest_checkpoint=latest_checkpoint,
            step_zero_validation=config["perform_initial_validation"],
            test_mode=False,
            profiling_enabled=bool(config["profiling"]["enabled"]),
        )


def hookdet_run(trial: str, experiment: Dict[str, Any], latest_checkpoint: Optional[str]) -> None:
    """``hookdet run exp.yaml`` (``--resume`` the latest checkpoint), in this process; raises
    ``SystemExit`` with its status if it fails."""
    import yaml  # hookdet's dependency; Determined's environment has no PyYAML

    from hookdet.cli import commands as cli

    module, _, class_name = trial.rpartition(".")
    config = dict(experiment, entrypoint=f"tests.parity.{module or 'trials'}:{class_name}")
    Path("exp.yaml").write_text(yaml.safe_dump(config))
    argv = ["run", "exp.yaml"] + (["--resume", latest_checkpoint] if latest_checkpoint else [])
    status = cli.main(argv)
    if status != 0:
        raise SystemExit(f"hookdet run exited {status}")
