"""``LRScheduler``: a torch LR scheduler plus when the loop should step it."""
from __future__ import annotations

import enum
from typing import Any, Dict

import torch


class LRScheduler:
    """Determined's wrapper that tells the loop when to step a torch LR scheduler.

    Created by ``context.wrap_lr_scheduler``; the trial keeps using the torch scheduler itself.
    """

    class StepMode(enum.Enum):
        """When the loop steps the scheduler."""

        STEP_EVERY_EPOCH = 1
        STEP_EVERY_BATCH = 2
        MANUAL_STEP = 3
        STEP_EVERY_OPTIMIZER_STEP = 4

    def __init__(self, scheduler: Any, step_mode: "LRScheduler.StepMode", frequency: int = 1):
        if not isinstance(step_mode, LRScheduler.StepMode):
            raise TypeError(f"wrap_lr_scheduler: step_mode must be an LRScheduler.StepMode, got {step_mode!r}")
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
            raise ValueError(f"wrap_lr_scheduler: frequency must be an int >= 1, got {frequency!r}")
        if (
            isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
            and step_mode is not LRScheduler.StepMode.MANUAL_STEP
        ):
            raise ValueError(
                "wrap_lr_scheduler: ReduceLROnPlateau needs a metric, so it can only be used with "
                "step_mode=MANUAL_STEP (LRScheduler.StepMode.MANUAL_STEP); step it yourself, for "
                "example from a PyTorchCallback's on_validation_end(self, metrics): "
                "scheduler.step(metrics[\"validation_error\"])"
            )
        self.scheduler = scheduler
        self.step_mode = step_mode
        self.frequency = frequency

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the underlying scheduler."""
        self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> Any:
        """The learning rates the scheduler set last."""
        return self.scheduler.get_last_lr()

    def state_dict(self) -> Dict[str, Any]:
        """The torch scheduler's state."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the torch scheduler's state."""
        self.scheduler.load_state_dict(state_dict)
