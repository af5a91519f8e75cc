"""The ``mlflow`` plugin: one MLflow run per hookdet run, continued across resumes.

What it records, on the chief only:

* **params**: the run's hyperparameters (nested ones flattened to ``a.b``; non-strings as JSON);
* **metrics**: every training and validation report, as ``training/<name>`` and
  ``validation/<name>`` at step = batches trained (the TensorBoard plugin's tags);
* **tags**: ``hookdet.trial_class``, ``hookdet.experiment_name``, ``hookdet.run_dir``,
  ``hookdet.latest_checkpoint``, plus ``plugin_config.mlflow.tags``;
* **artifacts** (``log_checkpoints: true``): each checkpoint directory under
  ``checkpoints/<uuid>``; a checkpoint that is not a local directory (S3) is recorded as the tag
  ``hookdet.checkpoint.<uuid>`` with its location instead.

The MLflow run id is part of the plugin's state, which hookdet saves in every checkpoint under
the plugin's name; a resumed trial reopens that run and its metrics continue where they stopped.

Options (``plugin_config.mlflow``)::

    tracking_uri: sqlite:///mlflow.db   # default: $MLFLOW_TRACKING_URI, else MLflow's own default
    experiment_name: my-experiment      # default: the experiment file's name, else "hookdet"
    run_name: my-run                    # default: the run directory's name
    log_checkpoints: false
    tags: {team: vision}
"""
from __future__ import annotations

import json
import logging
import numbers
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pydantic

from hookdet.plugin import PluginError, hookimpl, options_for

logger = logging.getLogger("hookdet")

DEFAULT_EXPERIMENT = "hookdet"
INSTALL_HINT = (
    "plugin 'mlflow' needs the mlflow package, which is not installed: run "
    "`pip install hookdet-mlflow` (it brings mlflow), or remove 'mlflow' from the experiment "
    "file's plugins"
)

#: MLflow's status for each way a hookdet run can end (``run.exit_reason``).
STATUS_FOR_EXIT = {
    "completed": "FINISHED",
    "exited": "FINISHED",
    "stopped": "KILLED",
    "preempted": "KILLED",
}


def flatten_params(values: Dict[str, Any], prefix: str = "") -> Dict[str, str]:
    """``{"opt": {"lr": 0.1}}`` -> ``{"opt.lr": "0.1"}``; strings as they are, the rest as JSON."""
    flat: Dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_params(value, prefix=f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return flat


def metric_key(group: str, name: str) -> str:
    """The MLflow metric key of ``name`` reported in ``group``: ``training/loss``."""
    return f"{group}/{name}"


def _chunks(items: List[Any], size: int) -> Iterator[List[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class MLflowOptions(pydantic.BaseModel):
    """``plugin_config.mlflow``, declared: hookdet checks it with the experiment file."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    tracking_uri: Optional[str] = pydantic.Field(
        None, min_length=1, description="the tracking server or store (default: MLflow's own default)"
    )
    experiment_name: Optional[str] = pydantic.Field(
        None, min_length=1, description="the MLflow experiment (default: the experiment file's name)"
    )
    run_name: Optional[str] = pydantic.Field(None, min_length=1, description="the MLflow run's name (default: the run directory's)")
    log_checkpoints: bool = pydantic.Field(False, description="upload each checkpoint as the run's artifacts")
    tags: Dict[str, Any] = pydantic.Field(default_factory=dict, description="tags set on the MLflow run")


class MLflowPlugin:
    """Logs the run to MLflow through one ``MlflowClient`` (no global ``mlflow.start_run`` state)."""

    Options = MLflowOptions

    def __init__(self, options: Any = None) -> None:
        self.options: MLflowOptions = options_for(MLflowPlugin, options, "mlflow")
        self.run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self._client: Any = None
        self._checkpoint_uuid: Optional[str] = None
        self._resumed_from: Optional[str] = None

    # ------------------------------------------------------------------ state (saved in checkpoints)

    def state_dict(self) -> Dict[str, Any]:
        """The MLflow run to continue on resume."""
        return {"run_id": self.run_id, "experiment_id": self.experiment_id}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Remember the checkpoint's MLflow run; it is reopened when the trial starts."""
        self.run_id = state.get("run_id")
        self.experiment_id = state.get("experiment_id")

    # ------------------------------------------------------------------ hooks

    @hookimpl
    def hookdet_configure(self, run: Any) -> None:
        """Refuse the run at once when mlflow is missing."""
        try:
            import mlflow  # noqa: F401
        except ImportError as error:
            raise PluginError(f"{INSTALL_HINT} [{error}]") from error

    @property
    def client(self) -> Any:
        """The ``MlflowClient`` for the configured tracking URI (created on first use)."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.options.tracking_uri)
        return self._client

    @hookimpl
    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Optional[str]) -> None:
        """Remember the checkpoint a resumed run starts from (it loads after this hook)."""
        self._resumed_from = checkpoint_uuid

    @hookimpl
    def on_training_start(self, run: Any) -> None:
        """Reopen the checkpoint's MLflow run (its id came with the checkpoint's state), or start
        one with params and tags (chief only)."""
        if not run.is_chief:
            return
        if self.run_id is not None and self._reopen(self._resumed_from):
            return
        self._start(run)

    def _reopen(self, checkpoint_uuid: Optional[str]) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(self.run_id)
        except MlflowException as error:
            logger.warning(
                "mlflow: the checkpoint's run %s is not in %s (%s); starting a new run",
                self.run_id, self.client.tracking_uri, error,
            )
            self.run_id = None
            return False
        self.client.update_run(self.run_id, status="RUNNING")
        if checkpoint_uuid:
            self.client.set_tag(self.run_id, "hookdet.resumed_from", checkpoint_uuid)
        logger.info("mlflow: continuing run %s at %s", self.run_id, self.client.tracking_uri)
        return True

    def _start(self, run: Any) -> None:
        options = self.options
        name = options.experiment_name or run.config.name or DEFAULT_EXPERIMENT
        self.experiment_id = self._experiment_id(name)
        trial_class = type(run.trial)
        tags = {
            "hookdet.trial_class": f"{trial_class.__module__}:{trial_class.__qualname__}",
            "hookdet.experiment_name": name,
            "hookdet.run_dir": str(Path(run.run_dir).resolve()),
            **{str(key): str(value) for key, value in options.tags.items()},
        }
        created = self.client.create_run(
            self.experiment_id, tags=tags, run_name=options.run_name or Path(run.run_dir).name
        )
        self.run_id = created.info.run_id
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH

        params = [Param(key, value) for key, value in flatten_params(run.hparams).items()]
        for chunk in _chunks(params, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=chunk)
        logger.info("mlflow: run %s in experiment %r at %s", self.run_id, name, self.client.tracking_uri)

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # created meanwhile by another run
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    @hookimpl
    def hookdet_report_metrics(
        self, run: Any, group: str, steps_completed: int, metrics: Dict[str, Any]
    ) -> None:
        """Log each numeric metric at step = batches trained (fires on the chief)."""
        if self.run_id is None:
            return
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        timestamp = int(time.time() * 1000)
        logged = [
            Metric(metric_key(group, name), float(value), timestamp, steps_completed)
            for name, value in metrics.items()
            if isinstance(value, numbers.Real) and not isinstance(value, bool)
        ]
        for chunk in _chunks(logged, MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=chunk)

    @hookimpl
    def on_checkpoint_upload_end(self, uuid: str) -> None:
        """Note the checkpoint's id for ``on_checkpoint_end``, which knows its directory."""
        self._checkpoint_uuid = uuid

    @hookimpl
    def on_checkpoint_end(self, run: Any, checkpoint_dir: str) -> None:
        """Tag the latest checkpoint; with ``log_checkpoints``, upload it as artifacts."""
        uuid, self._checkpoint_uuid = self._checkpoint_uuid, None
        if self.run_id is None or uuid is None or not run.is_chief:
            return
        self.client.set_tag(self.run_id, "hookdet.latest_checkpoint", uuid)
        if not self.options.log_checkpoints:
            return
        if Path(checkpoint_dir).is_dir():
            self.client.log_artifacts(self.run_id, checkpoint_dir, artifact_path=f"checkpoints/{uuid}")
        else:
            self.client.set_tag(self.run_id, f"hookdet.checkpoint.{uuid}", checkpoint_dir)

    @hookimpl
    def hookdet_unconfigure(self, run: Any) -> None:
        """End the MLflow run with the status matching how training ended."""
        if self.run_id is None or self._client is None:
            return
        status = STATUS_FOR_EXIT.get(run.exit_reason or "", "FAILED")
        self.client.set_terminated(self.run_id, status=status)
