"""How the ranks of a ``torch.distributed`` run agree, while they train, that one wants to stop.

A stop request (a signal, ``context.set_stop_requested``) may reach one rank only, or the ranks
at different batches; every rank must still stop after the same batch. At boundaries (report,
validation, checkpoint, epoch end) the loop asks with a blocking all-reduce; between boundaries
it asks after every batch through :meth:`StopAgreement.after_batch`, which must not make the
ranks wait for each other and must cost little next to a batch.

So the agreement is asynchronous and paced by time: an all-reduce (max) of two integers, the
stop flag and the next pace, is *started* once every ``every`` batches and *collected* when the
next one starts, having had those batches to arrive. ``every`` is chosen so that an agreement
starts about every :data:`AGREE_EVERY_SECONDS` of training: for batches of 0.2 s or more after
every batch, for a 9 ms batch every 22, for batches under 0.8 ms every 256. Starting one costs
0.2-0.4 ms of CPU on a busy 2-core machine (a cProfile of ``benchmarks/ddp_step_time.py``),
3-4 % of a 9 ms batch if done after every batch. Each rank proposes the pace of its own recent
batches; the reduction takes the most frequent, and as every rank collects the same result at
the same batch, the ranks keep one schedule. A request is honoured after at most
``2 * every - 1`` batches, under half a second of training (one batch for batches of 0.2 s or
more); at a boundary at once. Determined checks only at boundaries.

The group is a gloo group of its own: on the training group the all-reduce would queue behind
DDP's gradient all-reduce.
"""
from __future__ import annotations

import time
from typing import Any, Optional

import torch
import torch.distributed as dist

#: About how much training time passes between two starts of the stop agreement.
AGREE_EVERY_SECONDS = 0.2
#: The most batches between two starts, whatever their pace.
MOST_BATCHES_BETWEEN = 256


class StopAgreement:
    """The ranks' asynchronous agreement on stopping, started every ``every`` batches."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.every = 1  # batches between two starts, the same on every rank
        self._countdown = 1
        self._batches_since_start = 0
        self._requested = False  # a request on this rank since the last start
        self._started_at = 0.0
        # One tensor does: the agreement in flight is always collected before the next starts.
        self._tensor = torch.zeros(2, dtype=torch.int64)
        self._in_flight: Optional[Any] = None

    def after_batch(self, requested: bool) -> bool:
        """Called by every rank after every batch between boundaries: whether the ranks agreed
        to stop (known one agreement after the request reached some rank)."""
        self._requested = self._requested or requested
        self._batches_since_start += 1
        self._countdown -= 1
        if self._countdown > 0:
            return False
        now = time.perf_counter()
        pace = self._proposed_every(now)
        agreed = self.collect()
        self._start(pace)
        self._started_at, self._batches_since_start = now, 0
        self._countdown = self.every
        return agreed

    def collect(self) -> bool:
        """Wait for the agreement in flight, if any, and take its pace: whether a rank asked to
        stop. Called by every rank at the same points (after a batch above, and at boundaries)."""
        if self._in_flight is None:
            return False
        self._in_flight.wait()
        self._in_flight = None
        stop, negative_every = self._tensor.tolist()
        self.every = -negative_every
        return bool(stop)

    def release(self) -> Optional[Any]:
        """Let go of the group (returned, for its owner to destroy) unless an agreement is still
        in flight on it; then None. No agreement can be started after."""
        if self._in_flight is not None:
            return None
        group, self.group = self.group, None
        return group

    def _proposed_every(self, now: float) -> int:
        """Batches that take about ``AGREE_EVERY_SECONDS`` at this rank's recent pace."""
        if not self._started_at:
            return 1
        per_batch = (now - self._started_at) / self._batches_since_start
        wanted = int(AGREE_EVERY_SECONDS / per_batch) if per_batch > 0 else MOST_BATCHES_BETWEEN
        return max(1, min(wanted, MOST_BATCHES_BETWEEN))

    def _start(self, pace: int) -> None:
        # max of (flag, -pace): any rank's request, and the smallest pace (the most frequent).
        self._tensor[0], self._tensor[1] = int(self._requested), -pace
        self._requested = False
        self._in_flight = dist.all_reduce(self._tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
