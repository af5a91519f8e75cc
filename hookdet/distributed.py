"""``DistributedContext``: rank, size and the object collectives the loop needs.

The single-process context here is hookdet's own answer to ``hookdet_make_distributed``; the
``ddp`` and ``horovod`` plugins subclass it. Method names follow ``det.core.DistributedContext``.
"""
from __future__ import annotations

from typing import Any, List, Optional


class DistributedContext:
    """One process: every collective is the identity. Subclasses override the collectives."""

    def __init__(
        self,
        rank: int = 0,
        size: int = 1,
        local_rank: int = 0,
        local_size: int = 1,
        cross_rank: int = 0,
        cross_size: int = 1,
    ) -> None:
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size
        self.cross_rank = cross_rank
        self.cross_size = cross_size

    def get_rank(self) -> int:
        """This process's rank among all processes."""
        return self.rank

    def get_size(self) -> int:
        """The number of processes training the trial."""
        return self.size

    def get_local_rank(self) -> int:
        """This process's rank on its node."""
        return self.local_rank

    def get_local_size(self) -> int:
        """The number of processes on this node."""
        return self.local_size

    def get_cross_rank(self) -> int:
        """This node's index."""
        return self.cross_rank

    def get_cross_size(self) -> int:
        """The number of nodes."""
        return self.cross_size

    @property
    def is_chief(self) -> bool:
        """Whether this is rank 0, which writes checkpoints and reports metrics."""
        return self.rank == 0

    def allgather(self, obj: Any) -> List[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        return [obj]

    def gather(self, obj: Any) -> Optional[List[Any]]:
        """Every rank's ``obj`` on the chief; None elsewhere."""
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        """The chief's ``obj`` on every rank."""
        return obj

    def barrier(self) -> None:
        """Wait until every rank gets here."""

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (collective: every rank calls it at the same point).

        The loop reads stop requests through this, so all ranks stop at the same batch even when
        a signal reached only some of them, or reached them at different moments.
        """
        return bool(flag)

    def any_rank_soon(self, flag: bool) -> bool:
        """Like :meth:`any_rank`, but an agreement that may lag one call behind, for the loop's
        per-batch stop check: a backend may start agreeing on ``flag`` and return, without
        waiting, what the previous call's agreement found. Every rank still gets the same answer
        at the same call, so every rank stops at the same batch, one batch after the request.
        A blocking :meth:`any_rank` afterwards includes whatever was still being agreed on.
        This default waits (no lag)."""
        return self.any_rank(flag)

    def close(self) -> None:
        """Tear down the process group, if any."""
