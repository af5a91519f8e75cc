"""``core_context.profiler``: Determined's system-metrics sampler, a documented no-op here.

On a cluster ``profiler.on()`` samples CPU, GPU, memory, disk and network use in a thread and
sends it to the master for the WebUI's profiler tab. hookdet has no such tab: a trial class
profiles with the ``profiler`` plugin (``context.set_profiler``, torch's profiler into the run's
TensorBoard files), which a Core API script, owning its loop, runs itself
(``torch.profiler.profile(on_trace_ready=tensorboard_trace_handler(core_context.train.get_tensorboard_path()))``).
``on()`` and ``off()`` are accepted and say so once in the log, so a script written for a
cluster runs unchanged.
"""
from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("hookdet")


class ProfilerContext:
    """Determined's ``ProfilerContext`` (``core_context.profiler``): accepted, records nothing."""

    def __init__(self, run: Any) -> None:
        self._run = run
        self._told = False

    def on(self, sampling_interval: int = 1, samples_per_report: int = 10) -> None:
        """Determined starts sampling system metrics; hookdet logs once that it does not."""
        if not self._told:
            self._told = True
            logger.info("core_context.profiler.on(): hookdet records no system metrics for the Core API; profile "
                        "with torch.profiler into core_context.train.get_tensorboard_path() (docs/core-api.md)")

    def off(self) -> None:
        """Stop sampling (nothing was sampled)."""
