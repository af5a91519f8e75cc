"""``hookdet.pytorch.samplers``: Determined's reproducible samplers (re-exported)."""
from hookdet.data.samplers import (  # noqa: F401
    DistributedBatchSampler,
    DistributedSampler,
    RepeatBatchSampler,
    RepeatSampler,
    ReproducibleShuffleBatchSampler,
    ReproducibleShuffleSampler,
    SkipBatchSampler,
    SkipSampler,
)
