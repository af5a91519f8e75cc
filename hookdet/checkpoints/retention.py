"""Which checkpoints retention deletes.

Retention follows Determined's checkpoint garbage collection: a checkpoint is kept when it is
among the ``save_trial_latest`` newest (by batches trained), or among the
``max(save_trial_best, save_experiment_best)`` best by ``searcher.metric`` (a local experiment
has one trial, so its best are the experiment's best) — "best" counts only checkpoints taken
right after a validation, whose metric is that validation's. Determined collects garbage when
the experiment ends; hookdet applies the same rule after every checkpoint to bound disk use,
but while training goes on it never deletes the newest checkpoint (the resume point), even
when the counts are 0. When training completes, the rule is applied exactly. With no
``checkpoint_storage`` configured, ``hookdet run`` applies Determined's defaults (1 latest, 1
best), while the Trainer API run bare (no ``hookdet.get_cluster_info()``) keeps every
checkpoint, as Determined's local training does.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple


def checkpoints_to_delete(
    saved: List[Tuple[str, int, Optional[float]]],
    keep_latest: int,
    keep_best: int,
    smaller_is_better: bool,
    protect_newest: bool = False,
) -> List[str]:
    """Which of ``saved`` (``(id, batches trained, metric or None)``, oldest first) to delete.

    Determined's rule for one trial: keep a checkpoint whose rank by batches trained (newest
    first, equal batches sharing a rank) is within ``keep_latest``, or whose rank by metric
    (best first, ties to the older, NaN after every number) is within ``keep_best``;
    checkpoints with no metric are kept only as latest. ``protect_newest`` also keeps the last
    one saved.
    """
    keep = set()
    for storage_id, steps, _metric in saved:
        newer = sum(1 for _, other_steps, _ in saved if other_steps > steps)
        if newer < keep_latest:
            keep.add(storage_id)
    sign = 1.0 if smaller_is_better else -1.0

    def order(item: Tuple[int, Tuple[str, int, Optional[float]]]) -> Tuple[int, float, int]:
        index, (_storage_id, _steps, metric) = item
        value = float(metric)  # type: ignore[arg-type]
        return (1, 0.0, index) if math.isnan(value) else (0, sign * value, index)

    scored = [
        (index, entry)
        for index, entry in enumerate(saved)
        if isinstance(entry[2], (int, float)) and not isinstance(entry[2], bool)
    ]
    keep.update(entry[0] for _, entry in sorted(scored, key=order)[:keep_best])
    if protect_newest and saved:
        keep.add(saved[-1][0])
    return [storage_id for storage_id, _, _ in saved if storage_id not in keep]
