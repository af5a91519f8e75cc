"""Checkpoints that don't stop training: a host-memory snapshot, written by a background thread.

At a checkpoint boundary the checkpoint plugin builds the state dict as always, then
:class:`HostSnapshot` copies every tensor in it into host memory (once; CUDA tensors with
``non_blocking`` copies into pinned buffers, ordered on the training stream, and one CUDA event
that the *writer* waits on, so the training thread never synchronises with the device for it).
Containers are rebuilt and plain values kept, so nothing the training goes on to change (weights,
optimizer moments, an accumulated ``.grad``, a scheduler's lists) can reach the file. Training
then resumes, and :class:`BackgroundWriter` serialises, checksums, fsyncs and renames the
snapshot into place on a thread of its own.

At most one write is in flight: the next checkpoint, a resume, and the end of the run (completed,
stopped or preempted) wait for it, and say so in the log when they have to. A write that fails
raises :class:`~hookdet.checkpoints.format.CheckpointError` naming the checkpoint and the cause at
the next of those points; the storage never publishes a half-written checkpoint (see
:mod:`hookdet.checkpoints.storage`).

Host buffers are kept between snapshots and reused when the next state has the same layout (it
almost always has), so after the first checkpoint a snapshot is a plain copy into memory that is
already mapped: the cost of asynchrony is one extra host copy of the state, held for the run.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from hookdet.checkpoints.format import CheckpointError

logger = logging.getLogger("hookdet")


class HostSnapshot:
    """Copies nested state (tensors, containers, plain values) into host memory.

    Tensors that share a storage still share one after the copy (tied weights, views), exactly
    as ``torch.save`` would have seen them. Buffers of the previous snapshot are reused in order
    when their size matches; call :meth:`take` again only once the previous snapshot is written.
    """

    def __init__(self) -> None:
        self._buffers: List[torch.UntypedStorage] = []

    def take(self, state: Any) -> Tuple[Any, Optional[Any]]:
        """``(copy of state, CUDA event or None)``; the copy is complete once the event is."""
        previous, self._buffers = self._buffers, []
        copying = _SnapshotPass(iter(previous), self._buffers)
        copied = copying.copy(state)
        event = None
        if copying.cuda:
            event = torch.cuda.Event()
            event.record()
        return copied, event


class _SnapshotPass:
    """One :meth:`HostSnapshot.take`: the storages copied so far (so that tensors sharing one
    share its copy), the previous snapshot's buffers to reuse in order, and whether any copy
    came from the GPU."""

    def __init__(self, reuse: Any, buffers: List[torch.UntypedStorage]) -> None:
        self.reuse = reuse
        self.buffers = buffers
        self.storages: Dict[Tuple[str, int], torch.UntypedStorage] = {}
        self.tensors: Dict[int, torch.Tensor] = {}
        self.cuda = False

    def copy(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.copy_tensor(value)
        kind = type(value)
        if kind is dict:
            return {key: self.copy(item) for key, item in value.items()}
        if kind is collections.OrderedDict:
            copied = collections.OrderedDict((key, self.copy(item)) for key, item in value.items())
            for name, attribute in vars(value).items():  # e.g. a state dict's _metadata
                setattr(copied, name, self.copy(attribute))
            return copied
        if kind in (list, tuple, set):
            return kind(self.copy(item) for item in value)
        if kind is bytearray:
            return bytearray(value)
        return value  # immutable: numbers, strings, bytes, None, dtypes, devices, sizes

    def copy_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) in self.tensors:
            return self.tensors[id(tensor)]
        if tensor.layout != torch.strided or tensor.is_conj() or tensor.is_neg() or tensor.is_quantized:
            copied = tensor.detach().to("cpu", copy=True)  # rare layouts: a plain copy
        else:
            source = tensor.untyped_storage()
            on_cuda = source.device.type == "cuda"
            key = (str(source.device), source.data_ptr())
            host = self.storages.get(key)
            if host is None:
                host = self.buffer(source.nbytes(), pinned=on_cuda)
                host.copy_(source, non_blocking=on_cuda)
                self.storages[key] = host
                self.cuda = self.cuda or on_cuda
            copied = torch.empty(0, dtype=tensor.dtype).set_(host, tensor.storage_offset(), tensor.size(), tensor.stride())
        if type(tensor) is torch.nn.Parameter:
            copied = torch.nn.Parameter(copied, requires_grad=tensor.requires_grad)
        self.tensors[id(tensor)] = copied
        return copied

    def buffer(self, nbytes: int, pinned: bool) -> torch.UntypedStorage:
        """A host buffer of ``nbytes``: the previous snapshot's next one when it fits."""
        candidate = next(self.reuse, None)
        if candidate is not None and candidate.nbytes() == nbytes and candidate.is_pinned() == pinned:
            host = candidate
        else:
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).untyped_storage()
        self.buffers.append(host)
        return host


class BackgroundWriter:
    """Runs one checkpoint write at a time on a thread of its own.

    The thread is a daemon: a process killed or interrupted mid-write leaves only the storage's
    hidden temporary directory, never a checkpoint that looks complete.
    """

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._outcome: Optional[Tuple[bool, Any]] = None
        self._name = ""
        self._storage: Any = None
        self._started = 0.0
        #: Seconds the last finished write took, from submission to its end (for the log).
        self.last_duration: Optional[float] = None

    @property
    def busy(self) -> bool:
        """Whether a write was submitted and not yet collected by :meth:`wait`."""
        return self._thread is not None

    def done(self) -> bool:
        """Whether the write in flight has finished (successfully or not)."""
        return self._thread is not None and not self._thread.is_alive()

    def submit(self, name: str, write: Callable[[], Any], storage: Any = None) -> None:
        """Start ``write()`` in the background; ``name`` identifies the checkpoint in messages,
        ``storage`` (where it goes) explains a failure."""
        if self._thread is not None:
            raise RuntimeError(f"checkpoint {self._name} is still being written")

        def run() -> None:
            try:
                self._outcome = (True, write())
            except BaseException as error:  # reported to the training thread by wait()
                self._outcome = (False, error)

        self._name, self._outcome, self._started = name, None, time.perf_counter()
        self._storage = storage
        self._thread = threading.Thread(target=run, name=f"hookdet-checkpoint-{name[:8]}", daemon=True)
        self._thread.start()

    def wait(self, before: str) -> Any:
        """Block until the write finishes; return what it returned.

        Logs that training waits (naming the checkpoint and ``before`` what) when it has to.
        Raises :class:`CheckpointError` naming the checkpoint and the cause when the write failed.
        """
        thread = self._thread
        if thread is None:
            raise RuntimeError("no checkpoint write is in flight")
        if thread.is_alive():
            logger.info("waiting for checkpoint %s to finish writing before %s", self._name, before)
            thread.join()
        self._thread = None
        self.last_duration = time.perf_counter() - self._started
        succeeded, value = self._outcome or (False, RuntimeError("the writer thread ended without an outcome"))
        self._outcome = None
        if not succeeded:
            raise write_failed(self._name, value, self._storage) from value
        return value


def write_failed(name: str, cause: BaseException, storage: Any = None) -> CheckpointError:
    """The error that fails a run whose checkpoint ``name`` could not be written to ``storage``:
    the checkpoint, the error, and the cause in words (disk full, permission denied...)."""
    from hookdet.checkpoints.os_errors import failure_cause

    message = f"checkpoint {name} could not be written: {type(cause).__name__}: {cause}"
    explained = failure_cause(storage, cause)
    if explained is not None:
        where = storage.describe() if storage is not None else "the checkpoint storage"
        message += f" ({explained}, {where})"
    return CheckpointError(message + "; earlier checkpoints are intact")
