"""``det.core``: Determined's Core API, run locally (``hookdet.core``).

A script that trains in a loop of its own calls ``det.core.init()`` and reports metrics, stores
checkpoints, reads its hyperparameters and checks for preemption through the returned context
(:mod:`hookdet.core.context`). Each context has its own module: :mod:`~hookdet.core.train`,
:mod:`~hookdet.core.checkpoint`, :mod:`~hookdet.core.preempt`, :mod:`~hookdet.core.searcher`
(deprecated in Determined 0.38), :mod:`~hookdet.core.profiler`, :mod:`~hookdet.core.experimental`. ``DistributedContext`` lives in
:mod:`hookdet.distributed.context`; Determined's local-distributed recipe builds one itself::

    dist.init_process_group("gloo")
    distributed = det.core.DistributedContext.from_torch_distributed()

This module re-exports Determined's names only; docs/core-api.md says what each does locally.
"""
from hookdet.core.checkpoint import CheckpointContext, DownloadMode
from hookdet.core.context import Context, TensorboardMode, init
from hookdet.core.experimental import ExperimentalCoreContext
from hookdet.core.preempt import PreemptContext, PreemptMode
from hookdet.core.profiler import ProfilerContext
from hookdet.core.searcher import SearcherContext, SearcherContextMissing, SearcherMode, SearcherOperation, Unit
from hookdet.core.train import EarlyExitReason, TrainContext
from hookdet.distributed.context import DistributedContext, DummyDistributedContext

__all__ = [
    "CheckpointContext",
    "Context",
    "DistributedContext",
    "DownloadMode",
    "DummyDistributedContext",
    "EarlyExitReason",
    "ExperimentalCoreContext",
    "PreemptContext",
    "PreemptMode",
    "ProfilerContext",
    "SearcherContext",
    "SearcherContextMissing",
    "SearcherMode",
    "SearcherOperation",
    "TensorboardMode",
    "TrainContext",
    "Unit",
    "init",
]
