"""Determined's legacy ``determined.tensorboard.metric_writers.pytorch.TorchWriter``, at the same path
under ``hookdet``. It asks the run in progress for its TensorBoard writer through the
``hookdet_make_tensorboard_writer`` provider hook, like ``context.get_tensorboard_writer()``.
"""
from __future__ import annotations

from typing import Any

from hookdet.loop.active_run import active_run

__all__ = ["TorchWriter"]


class TorchWriter:
    """Create it in the trial's ``__init__``; ``writer`` is the run's ``SummaryWriter`` (the one
    ``context.get_tensorboard_writer()`` returns), ``add_scalar(name, value, step)`` writes one
    scalar. New code should use ``context.get_tensorboard_writer()``.
    """

    def __init__(self) -> None:
        run = active_run()
        if run is None:
            raise RuntimeError(
                "TorchWriter() needs a run with the 'tensorboard' plugin: create it inside the "
                "trial after pytorch.init(...) (or use context.get_tensorboard_writer())"
            )
        self.writer: Any = run.plugins.provide("hookdet_make_tensorboard_writer", run=run)

    def add_scalar(self, name: str, value: Any, step: int) -> None:
        """Write ``value`` under tag ``name`` at ``step``."""
        self.writer.add_scalar(name, value, step)

    def reset(self) -> None:
        """Flush pending events to disk."""
        self.writer.flush()

    def flush(self) -> None:
        """Flush pending events to disk."""
        self.writer.flush()
