"""Object collectives for a ``DistributedContext`` a script built itself, with no process group.

Determined's Core API lets a script start its own workers and give each a
``det.core.DistributedContext(rank=, size=, local_rank=, ..., chief_ip=)``; its collectives
then run over ZMQ sockets the chief opens. hookdet runs them over torch's ``TCPStore``, the
key-value server torch.distributed's own rendezvous uses: the chief hosts it on
``chief_ip:port``, every rank connects, and each collective is a few keys. Every rank makes the
same collective calls in the same order, so a call's number names its keys on every rank:
``allgather`` number *n* has each rank set ``n/<rank>`` and read every other; ``broadcast``
has the chief set ``n/0``; ``gather`` has the chief read them all. The last rank to finish
with a call (counted with the store's atomic ``add``) deletes its keys, so the store holds
only calls in progress. The chief's process serves the store, so as it leaves (the context
closed, or the interpreter exiting) it waits for the workers to leave first. Values are pickled, as ``torch.distributed``'s object collectives do.

The port is ``pub_port + port_offset`` (Determined's names); when the script leaves
``pub_port`` at its default (Determined's 12360) it is ``$HOOKDET_CHIEF_PORT`` where that is set:
``hookdet run`` sets it to a free port for each run, so two runs on one machine do not meet.
"""
from __future__ import annotations

import atexit
import datetime
import os
import pickle
from typing import Any, List, Optional

#: Determined's default port for the chief's inter-process communication.
DEFAULT_CHIEF_PORT = 12360
#: The port ``hookdet run`` gives a script's self-built contexts.
CHIEF_PORT_ENV = "HOOKDET_CHIEF_PORT"
#: How long a rank waits for the others at a collective before it fails, naming the call.
WAIT_SECONDS = 1800
#: How long the chief waits, as it leaves, for the workers to leave first.
LEAVE_WAIT_SECONDS = 60


def chief_port(pub_port: int, port_offset: int) -> int:
    """The port the chief's store listens on (see the module's docstring)."""
    base = int(os.environ.get(CHIEF_PORT_ENV, DEFAULT_CHIEF_PORT)) if pub_port == DEFAULT_CHIEF_PORT else pub_port
    return base + port_offset


def free_port() -> int:
    """A port nothing listens on now (the one ``hookdet run`` hands a run as
    ``$HOOKDET_CHIEF_PORT``)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


class StoreCollectives:
    """``allgather``/``gather``/``broadcast``/``barrier`` over a ``TCPStore`` the chief hosts."""

    def __init__(self, rank: int, size: int, chief_ip: Optional[str], port: int) -> None:
        from torch.distributed import TCPStore

        self.rank = rank
        self.size = size
        self._calls = 0
        self._store = TCPStore(chief_ip or "127.0.0.1", port, world_size=size, is_master=rank == 0,
                               timeout=datetime.timedelta(seconds=WAIT_SECONDS), wait_for_workers=False)
        self._left = False
        atexit.register(self.close)  # a script rarely closes the context it built: leave at exit

    def _next(self) -> str:
        self._calls += 1
        return str(self._calls)

    def _done(self, call: str, keys: List[str]) -> None:
        """This rank is done with ``call``; the last one removes its keys."""
        if self._store.add(f"{call}/done", 1) == self.size:
            for key in [*keys, f"{call}/done"]:
                self._store.delete_key(key)

    def allgather(self, obj: Any) -> List[Any]:
        call = self._next()
        keys = [f"{call}/{rank}" for rank in range(self.size)]
        self._store.set(keys[self.rank], pickle.dumps(obj))
        gathered = [pickle.loads(self._store.get(key)) for key in keys]
        self._done(call, keys)
        return gathered

    def gather(self, obj: Any) -> Optional[List[Any]]:
        call = self._next()
        keys = [f"{call}/{rank}" for rank in range(self.size)]
        self._store.set(keys[self.rank], pickle.dumps(obj))
        gathered = [pickle.loads(self._store.get(key)) for key in keys] if self.rank == 0 else None
        self._done(call, keys)
        return gathered

    def broadcast(self, obj: Any) -> Any:
        call = self._next()
        key = f"{call}/0"
        if self.rank == 0:
            self._store.set(key, pickle.dumps(obj))
        value = pickle.loads(self._store.get(key))
        self._done(call, [key])
        return value

    def barrier(self) -> None:
        self.allgather(None)

    def close(self) -> None:
        """Leave: a worker says so; the chief, whose process serves the store, waits for every
        worker to have said so (at most :data:`LEAVE_WAIT_SECONDS`: a worker that died is not
        waited for), so none is cut off in the middle of its last collective."""
        if self._left:
            return
        self._left = True
        if self.rank != 0:
            self._store.set(f"left/{self.rank}", b"")
            return
        try:
            self._store.wait([f"left/{rank}" for rank in range(1, self.size)],
                             datetime.timedelta(seconds=LEAVE_WAIT_SECONDS))
        except Exception:  # noqa: BLE001 - a worker that never comes to leave is not waited for longer
            pass
