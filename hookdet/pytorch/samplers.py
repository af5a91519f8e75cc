"""``hookdet.pytorch.samplers``: Determined's reproducible samplers (re-exported)."""
from hookdet.samplers import (  # noqa: F401
    DistributedBatchSampler,
    DistributedSampler,
    RepeatBatchSampler,
    RepeatSampler,
    ReproducibleShuffleBatchSampler,
    ReproducibleShuffleSampler,
    SkipBatchSampler,
    SkipSampler,
)
