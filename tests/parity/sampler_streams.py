"""The index streams of every sampler (and ``adapt_batch_sampler``, ``DataLoader``) as JSON.

``python sampler_streams.py determined`` in Determined's environment prints what Determined's
samplers yield; ``streams("hookdet")`` computes the same scenarios with hookdet's.
``test_sampler_parity.py`` compares the two. Only names both frameworks share are used, with
Determined's constructor parameters, so the one file serves both interpreters.

Every scenario records ``len()`` and the first items of the stream (endless samplers are cut
after a few passes), for several sizes, seeds, replica counts, ranks and skips.
"""
from __future__ import annotations

import importlib
import itertools
import json
import sys
from typing import Any, Dict, List

SIZES = [1, 5, 10, 13]
SEEDS = [0, 1, 7, 2024]
REPLICAS = [1, 2, 3, 4]
SKIPS = [0, 1, 3, 7]
PASSES = 3


def _plain(items: Any) -> Any:
    """Index lists as plain lists of ints (torch loaders yield tensors)."""
    if hasattr(items, "tolist"):
        return items.tolist()
    if isinstance(items, (list, tuple)):
        return [_plain(item) for item in items]
    return int(items)


def _take(sampler: Any, count: int) -> List[Any]:
    return [_plain(item) for item in itertools.islice(iter(sampler), count)]


def streams(root: str) -> Dict[str, Any]:
    """``{scenario: {"len": ..., "stream": [...]}}`` for ``root`` = ``determined`` or ``hookdet``."""
    import torch

    samplers = importlib.import_module(f"{root}.pytorch.samplers")
    pytorch = importlib.import_module(f"{root}.pytorch")
    data = torch.utils.data
    out: Dict[str, Any] = {}

    def record(name: str, sampler: Any, count: int) -> None:
        try:
            length: Any = len(sampler)
        except TypeError as error:  # pragma: no cover - recorded, compared like any value
            length = f"<no len: {error}>"
        out[name] = {"len": length, "stream": _take(sampler, count)}

    def batches(size: int, batch_size: int = 2) -> Any:
        return data.BatchSampler(data.SequentialSampler(range(size)), batch_size, False)

    for size, seed in itertools.product(SIZES, SEEDS):
        shuffle = samplers.ReproducibleShuffleSampler(data.SequentialSampler(range(size)), seed)
        out[f"shuffle n={size} seed={seed}"] = [_take(shuffle, size) for _ in range(PASSES)]
        batch_shuffle = samplers.ReproducibleShuffleBatchSampler(batches(size), seed)
        out[f"batch-shuffle n={size} seed={seed}"] = [
            _take(batch_shuffle, size) for _ in range(PASSES)
        ]
        record(
            f"repeat(shuffle) n={size} seed={seed}",
            samplers.RepeatSampler(
                samplers.ReproducibleShuffleSampler(data.SequentialSampler(range(size)), seed)
            ),
            PASSES * size,
        )
        record(
            f"repeat-batch(batch-shuffle) n={size} seed={seed}",
            samplers.RepeatBatchSampler(
                samplers.ReproducibleShuffleBatchSampler(batches(size), seed)
            ),
            PASSES * size,
        )
        for skip in SKIPS:
            record(
                f"skip(repeat(shuffle)) n={size} seed={seed} skip={skip}",
                samplers.SkipSampler(
                    samplers.RepeatSampler(
                        samplers.ReproducibleShuffleSampler(
                            data.SequentialSampler(range(size)), seed
                        )
                    ),
                    skip,
                ),
                2 * size,
            )
            record(f"skip n={size} skip={skip}", samplers.SkipSampler(range(size), skip), size)
            record(
                f"skip-batch n={size} skip={skip}",
                samplers.SkipBatchSampler(batches(size), skip),
                size,
            )

    for size, replicas in itertools.product(SIZES, REPLICAS):
        for rank in range(replicas):
            where = f"n={size} replicas={replicas} rank={rank}"
            record(f"distributed {where}", samplers.DistributedSampler(range(size), replicas, rank),
                   size)
            record(f"distributed-batch {where}",
                   samplers.DistributedBatchSampler(batches(size), replicas, rank), size)
            for seed, skip, repeat in itertools.product(SEEDS[:2], SKIPS, (False, True)):
                base = data.BatchSampler(
                    samplers.ReproducibleShuffleSampler(data.SequentialSampler(range(size)), seed),
                    3,
                    False,
                )
                adapted = pytorch.adapt_batch_sampler(base, repeat, skip, replicas, rank)
                record(f"adapt {where} seed={seed} skip={skip} repeat={repeat}", adapted,
                       3 * size)
                loader = pytorch.DataLoader(
                    list(range(size)),
                    batch_size=3,
                    sampler=samplers.ReproducibleShuffleSampler(
                        data.SequentialSampler(range(size)), seed
                    ),
                )
                record(
                    f"loader {where} seed={seed} skip={skip} repeat={repeat}",
                    loader.get_data_loader(repeat, skip, replicas, rank),
                    3 * size,
                )
            for skip, repeat, drop_last in itertools.product(SKIPS, (False, True), (False, True)):
                if repeat and drop_last and size < 2:
                    continue  # no batch at all: Determined's repeat spins forever (hookdet raises)
                unshuffled = pytorch.DataLoader(list(range(size)), batch_size=2, drop_last=drop_last)
                record(
                    f"unshuffled loader {where} skip={skip} repeat={repeat} drop_last={drop_last}",
                    unshuffled.get_data_loader(repeat, skip, replicas, rank),
                    3 * size,
                )
    return out


if __name__ == "__main__":
    json.dump(streams(sys.argv[1]), sys.stdout, sort_keys=True)
