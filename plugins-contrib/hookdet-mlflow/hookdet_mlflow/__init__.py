"""hookdet-mlflow: MLflow tracking for hookdet runs, as the ``mlflow`` plugin.

Install the package and add the plugin in the experiment file (hookdet's defaults still run)::

    plugins: [mlflow]
    plugin_config:
      mlflow: {tracking_uri: "sqlite:///mlflow.db", log_checkpoints: true}
"""
from hookdet_mlflow.plugin import MLflowPlugin, flatten_params, metric_key

__version__ = "0.1.0"

__all__ = ["MLflowPlugin", "__version__", "flatten_params", "metric_key"]
