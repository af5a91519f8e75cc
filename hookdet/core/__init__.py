"""``det.core`` names a Trainer-API script touches: ``hookdet.core.DistributedContext``.

Determined's local-distributed recipe builds the context itself and hands it to
``pytorch.init(distributed=...)``::

    dist.init_process_group("gloo")
    distributed = det.core.DistributedContext.from_torch_distributed()

Re-exports only; the class lives in :mod:`hookdet.distributed.context`.
"""
from hookdet.distributed.context import DistributedContext

__all__ = ["DistributedContext"]
