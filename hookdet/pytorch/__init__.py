"""The Determined-compatible face: ``from hookdet import pytorch`` for ``from determined import pytorch``.

Re-exports only; each name lives in the module that owns its concept.
"""
from hookdet.checkpoints.api import CheckpointLoadContext, load_trial_from_checkpoint_path
from hookdet.trial_api.context import PyTorchExperimentalContext, PyTorchTrialContext
from hookdet.data.batch_moving import TorchData, data_length, to_device
from hookdet.data.loader import DataLoader, adapt_batch_sampler
from hookdet.trial_api.lr_scheduler import LRScheduler
from hookdet.metrics.reducers import MetricReducer, Reducer
from hookdet.loop.trainer import Trainer, init
from hookdet.trial_api.trial import Batch, Epoch, PyTorchCallback, PyTorchTrial, ShouldExit, TrainUnit
from hookdet.pytorch import samplers

__all__ = [
    "Batch",
    "CheckpointLoadContext",
    "DataLoader",
    "Epoch",
    "LRScheduler",
    "MetricReducer",
    "PyTorchCallback",
    "PyTorchExperimentalContext",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Reducer",
    "ShouldExit",
    "TorchData",
    "TrainUnit",
    "Trainer",
    "adapt_batch_sampler",
    "data_length",
    "init",
    "load_trial_from_checkpoint_path",
    "samplers",
    "to_device",
]
