"""``TorchWriter`` at Determined's path: ``from hookdet.tensorboard.metric_writers.pytorch import TorchWriter``."""
from hookdet.builtin_plugins.tensorboard import TorchWriter

__all__ = ["TorchWriter"]
