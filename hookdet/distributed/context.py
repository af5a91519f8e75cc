"""``DistributedContext``: rank, size and the object collectives the loop needs.

The single-process context here is hookdet's own answer to ``hookdet_make_distributed``.
:class:`TorchDistributedContext` (a ``torch.distributed`` process group) and
:class:`HorovodDistributedContext` are what the ``ddp`` and ``horovod`` plugins answer with, and
what ``DistributedContext.from_torch_distributed()`` / ``.from_horovod(hvd)`` give a script that
starts its processes itself (Determined's local-distributed recipe). Method names follow
``det.core.DistributedContext``; ``hookdet.core.DistributedContext`` is this class.
"""
from __future__ import annotations

import os
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from hookdet.distributed.stop_agreement import StopAgreement
from hookdet.distributed.store_collectives import DEFAULT_CHIEF_PORT


def rank_device(local_rank: int) -> torch.device:
    """The device a rank trains on: GPU *local_rank* where there are GPUs (as in Determined), else
    the CPU. More ranks on a machine than it has GPUs is a usage error, said in one line."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    if local_rank >= gpus:
        from hookdet.errors import UsageError

        raise UsageError(
            f"local rank {local_rank} has no GPU: this machine has {gpus} and each rank trains on "
            f"its own; start at most {gpus} ranks per machine (resources.slots_per_trial divided by "
            "the machines), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on CPUs"
        )
    return torch.device("cuda", local_rank)


class DistributedContext:
    """Rank, size and object collectives. One process: every collective is the identity. The
    object a collective takes is ``stuff``, Determined's name for it (a caller may name it).

    Built by a script for each worker it starts itself (Determined's
    ``det.core.DistributedContext(rank=, size=, local_rank=, local_size=, cross_rank=,
    cross_size=, chief_ip=)``), the collectives of a context of more than one rank run over a
    key-value store the chief hosts (:mod:`hookdet.distributed.store_collectives`), with no
    process group. Subclasses override the collectives with their backend's.
    """

    def __init__(
        self,
        *,
        rank: int,
        size: int,
        local_rank: int,
        local_size: int,
        cross_rank: int,
        cross_size: int,
        chief_ip: Optional[str] = None,
        pub_port: int = DEFAULT_CHIEF_PORT,
        pull_port: int = 12376,  # Determined's; the store needs one port
        port_offset: int = 0,
        force_tcp: bool = False,
    ) -> None:
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size
        self.cross_rank = cross_rank
        self.cross_size = cross_size
        self._chief_ip = chief_ip
        self._port = (pub_port, port_offset)
        self._store: Any = None
        if type(self) is DistributedContext and local_size != size and chief_ip is None:
            raise AssertionError(
                f"This is a distributed job (local_size {local_size} != size {size}) but chief_ip was none "
                "provided.  When cross_size > 1, the chief_ip parameter is required."
            )

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

    def allgather(self, stuff: Any) -> List[Any]:
        """Every rank's ``stuff``, in rank order, on every rank."""
        return [stuff] if self.size == 1 else self._collectives().allgather(stuff)

    def gather(self, stuff: Any) -> Optional[List[Any]]:
        """Every rank's ``stuff`` on the chief; None elsewhere."""
        return [stuff] if self.size == 1 else self._collectives().gather(stuff)

    def broadcast(self, stuff: Any) -> Any:
        """The chief's ``stuff`` on every rank."""
        return stuff if self.size == 1 else self._collectives().broadcast(stuff)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.size > 1:
            self._collectives().barrier()

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (collective: every rank calls it at the same point).

        The loop reads stop requests through this, so all ranks stop at the same batch even when
        a signal reached only some of them, or reached them at different moments.
        """
        return bool(flag) if self.size == 1 else any(self.allgather(bool(flag)))

    def _collectives(self) -> Any:
        """The chief's store, joined on the first collective (every rank makes the same calls)."""
        if self._store is None:
            from hookdet.distributed.store_collectives import StoreCollectives, chief_port

            self._store = StoreCollectives(self.rank, self.size, self._chief_ip, chief_port(*self._port))
        return self._store

    def any_rank_soon(self, flag: bool) -> bool:
        """Like :meth:`any_rank`, but an agreement that may lag behind, for the loop's per-batch
        stop check: a backend may start agreeing on ``flag`` and return, without waiting, what an
        earlier agreement found (``TorchDistributedContext`` agrees about every 0.2 s of
        training). Every rank still gets the same answer at the same call, so every rank stops
        at the same batch. A blocking :meth:`any_rank` afterwards includes whatever was still
        being agreed on. This default waits (no lag)."""
        return self.any_rank(flag)

    def close(self) -> None:
        """Tear down the process group or leave the chief's store, if any."""
        if self._store is not None:
            self._store.close()
            self._store = None

    # ------------------------------------------------------------------ Determined's extras

    def get_num_agents(self) -> int:
        """The number of machines (Determined's name for :meth:`get_cross_size`)."""
        return self.cross_size

    def allgather_local(self, stuff: Any) -> List[Any]:
        """The ``stuff`` of every rank on this machine, in local-rank order (every rank calls it)."""
        return [item for rank, item in self._with_node(stuff) if rank == self.cross_rank]

    def gather_local(self, stuff: Any) -> Optional[List[Any]]:
        """The ``stuff`` of every rank on this machine on its local chief; None elsewhere."""
        gathered = self.allgather_local(stuff)
        return gathered if self.local_rank == 0 else None

    def broadcast_local(self, stuff: Any = None) -> Any:
        """This machine's local chief's ``stuff`` on every rank of the machine."""
        return self.allgather_local(stuff)[0]

    def _with_node(self, stuff: Any) -> List[Any]:
        return self.allgather((self.cross_rank, stuff))

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_torch_distributed(cls, chief_ip: Optional[str] = None) -> "DistributedContext":
        """The context of a process group started by torchrun (``RANK``, ``WORLD_SIZE``, ...).

        Joins the group from those variables (gloo on CPU, nccl on CUDA) when the script has not
        called ``torch.distributed.init_process_group`` itself; a group the script made is left
        for the script to destroy. ``chief_ip`` is accepted for Determined's signature; torchrun's
        rendezvous already says where the chief is.
        """
        missing = [name for name in ("RANK", "WORLD_SIZE") if name not in os.environ]
        if missing and not dist.is_initialized():
            raise RuntimeError(
                f"DistributedContext.from_torch_distributed(): {', '.join(missing)} not set; "
                "start the script under torchrun (or hookdet run with slots_per_trial > 1)"
            )
        owns_group = not dist.is_initialized()
        if owns_group:
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return TorchDistributedContext(str(dist.get_backend()), owns_group)

    @classmethod
    def from_horovod(cls, hvd: Any, chief_ip: Optional[str] = None) -> "DistributedContext":
        """The context of an initialised Horovod (``hvd.init()`` already called)."""
        return HorovodDistributedContext(hvd)

    @classmethod
    def from_deepspeed(cls, chief_ip: Optional[str] = None) -> "DistributedContext":
        """The context of a DeepSpeed launch: its launcher sets torch.distributed's variables
        (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) and DeepSpeed trains over a torch process
        group, so this is :meth:`from_torch_distributed`."""
        return cls.from_torch_distributed(chief_ip)

    @classmethod
    def from_tf_config(cls) -> Any:
        """Determined's TensorFlow constructor: refused, in one line (hookdet trains PyTorch)."""
        from hookdet.errors import UsageError

        raise UsageError("DistributedContext.from_tf_config() builds a TensorFlow strategy; hookdet runs PyTorch "
                         "only: use from_torch_distributed() (under torchrun) or from_horovod()")


class DummyDistributedContext(DistributedContext):
    """One process, rank 0 of 1 (Determined's name): what a run of one process is given."""

    def __init__(self) -> None:
        super().__init__(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)


class RankAloneContext(DistributedContext):
    """Says it is rank ``rank`` of ``size`` while its collectives run as one process (each is the
    identity): for testing what a plugin does off the chief, or on a rank of a large run, without
    starting the other ranks (``hookdet.plugin.RankAloneContext(rank=1, size=2)``)."""

    def __init__(self, rank: int = 0, size: int = 1) -> None:
        super().__init__(rank=rank, size=size, local_rank=rank, local_size=size, cross_rank=0, cross_size=1)

    def allgather(self, stuff: Any) -> List[Any]:
        return [stuff]

    def gather(self, stuff: Any) -> Optional[List[Any]]:
        return [stuff]

    def broadcast(self, stuff: Any) -> Any:
        return stuff

    def barrier(self) -> None:
        """Nothing to wait for."""

    def any_rank(self, flag: bool) -> bool:
        return bool(flag)


class TorchDistributedContext(DistributedContext):
    """Rank, size and object collectives over a ``torch.distributed`` process group.

    Object collectives (``allgather``, ``gather``, ``broadcast``) pickle Python objects. They and
    :meth:`any_rank` run on a gloo group, so they never touch the GPU: with nccl as the training
    backend a second, gloo, group is created for them.
    """

    def __init__(self, backend: str, owns_group: bool) -> None:
        size = dist.get_world_size()
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        rank = dist.get_rank()
        super().__init__(
            rank=rank,
            size=size,
            local_rank=int(os.environ.get("LOCAL_RANK", rank % local_size)),
            local_size=local_size,
            cross_rank=int(os.environ.get("GROUP_RANK", rank // local_size)),
            cross_size=max(1, size // local_size),
        )
        self.backend = backend
        self._owns_group = owns_group
        self._cpu_group = None if backend == "gloo" else dist.new_group(backend="gloo")
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._stop_agreement = StopAgreement(dist.new_group(backend="gloo"))

    def allgather(self, stuff: Any) -> List[Any]:
        """Every rank's ``stuff``, in rank order, on every rank."""
        gathered: List[Any] = [None] * self.size
        dist.all_gather_object(gathered, stuff, group=self._cpu_group)
        return gathered

    def gather(self, stuff: Any) -> Optional[List[Any]]:
        """Every rank's ``stuff`` on the chief; None elsewhere."""
        gathered: Optional[List[Any]] = [None] * self.size if self.is_chief else None
        dist.gather_object(stuff, gathered, dst=0, group=self._cpu_group)
        return gathered

    def broadcast(self, stuff: Any) -> Any:
        """The chief's ``stuff`` on every rank."""
        holder = [stuff]
        dist.broadcast_object_list(holder, src=0, group=self._cpu_group)
        return holder[0]

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        dist.barrier(group=self._cpu_group)

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (an all-reduce of one CPU integer), or was at
        the last :meth:`any_rank_soon` agreement, which this collects."""
        earlier = self._stop_agreement.collect()
        self._flag.fill_(int(flag))
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._cpu_group)
        return earlier or bool(self._flag.item())

    def any_rank_soon(self, flag: bool) -> bool:
        """The per-batch stop check, agreed asynchronously and paced by time
        (:mod:`hookdet.distributed.stop_agreement`): no wait on the peers, the same answer on
        every rank after the same batch."""
        return self._stop_agreement.after_batch(flag)

    def close(self) -> None:
        """Leave the process group: destroy the groups this context made (the default group too
        when this plugin created it) and let go of them, so that their gloo threads end now and
        not while the interpreter exits, where a gloo thread that needs the GIL aborts the
        process after it trained well. A stop agreement still in flight (a rank failed between
        two agreements) keeps its group: ending it would wait for peers that may be gone.

        Not collective: a rank that failed must be able to leave without waiting for the others.
        """
        if not dist.is_initialized():
            return
        own = [group for group in (self._cpu_group, self._stop_agreement.release()) if group is not None]
        if self._owns_group:
            dist.destroy_process_group()
        else:
            for group in own:
                dist.destroy_process_group(group)
        self._cpu_group = None


class HorovodDistributedContext(DistributedContext):
    """Rank, size and object collectives over Horovod."""

    def __init__(self, hvd: Any) -> None:
        super().__init__(
            rank=hvd.rank(),
            size=hvd.size(),
            local_rank=hvd.local_rank(),
            local_size=hvd.local_size(),
            cross_rank=hvd.cross_rank(),
            cross_size=hvd.cross_size(),
        )
        self._hvd = hvd
        self._calls = 0

    def _name(self, what: str) -> str:
        # Horovod matches collectives across ranks by name; every rank makes the same calls in
        # the same order, so a counter keeps concurrent names unique and identical everywhere.
        self._calls += 1
        return f"hookdet.{what}.{self._calls}"

    def allgather(self, stuff: Any) -> List[Any]:
        """Every rank's ``stuff``, in rank order, on every rank."""
        return list(self._hvd.allgather_object(stuff, name=self._name("allgather")))

    def gather(self, stuff: Any) -> Optional[List[Any]]:
        """Every rank's ``stuff`` on the chief (gathered everywhere: Horovod has no gather); None
        elsewhere."""
        gathered = self.allgather(stuff)
        return gathered if self.is_chief else None

    def broadcast(self, stuff: Any) -> Any:
        """The chief's ``stuff`` on every rank."""
        return self._hvd.broadcast_object(stuff, root_rank=0, name=self._name("broadcast"))

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        self._hvd.barrier()

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank."""
        reduced = self._hvd.allreduce(
            torch.tensor([int(flag)], dtype=torch.int32), op=self._hvd.Max, name="hookdet.stop"
        )
        return bool(reduced.item())

    def close(self) -> None:
        """Shut Horovod down."""
        if self._hvd.is_initialized():
            self._hvd.shutdown()
