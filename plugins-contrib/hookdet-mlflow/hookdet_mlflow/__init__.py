"""hookdet-mlflow: MLflow tracking for hookdet runs, as the ``mlflow`` plugin.

Install the package and list the plugin in the experiment file::

    plugins: [callbacks, preemption, metrics_log, checkpoint, tensorboard, progress, mlflow]
    plugin_config:
      mlflow: {tracking_uri: "sqlite:///mlflow.db", log_checkpoints: true}
"""
from hookdet_mlflow.plugin import MLflowPlugin, flatten_params, metric_key

__version__ = "0.1.0"

__all__ = ["MLflowPlugin", "__version__", "flatten_params", "metric_key"]
