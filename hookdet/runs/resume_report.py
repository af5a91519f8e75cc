"""Say what changed on resume, and when a resume has nothing left to train.

A resumed run restores the checkpoint's state, but its hyperparameters and experiment fields
come from the files given now. When they differ, training silently mixes the two: the trial
reads the new ``lr``, while the optimizer restored from the checkpoint keeps the old one in its
parameter groups. :func:`report_resume` logs one warning listing every changed field, old and
new, and which one is in force; and a clear line when the checkpoint is already at or past
``max_length``, so a resume that trains nothing says so.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping

logger = logging.getLogger("hookdet")

#: Experiment fields that differ between runs of one experiment without changing training.
IGNORED_FIELDS = ("description", "name", "labels", "notes", "workspace", "project")


def flatten(value: Any, prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay whole."""
    if not isinstance(value, Mapping):
        return {prefix: value} if prefix else {}
    flat: Dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(item, Mapping) and item:
            flat.update(flatten(item, name))
        else:
            flat[name] = item
    return flat


def changed_fields(before: Mapping[str, Any], after: Mapping[str, Any]) -> List[str]:
    """``name: old -> new`` for every flattened field the checkpoint recorded (``before``) that
    differs now (one gone shown as 'unset'). A field it did not record is not a change: a
    checkpoint of Determined's local mode records only what the script passed, and one of an
    older hookdet lacks fields added since."""
    old, new = flatten(before), flatten(after)
    changes = []
    for name in sorted(old):
        if name.split(".")[0] in IGNORED_FIELDS:
            continue
        if old.get(name, _UNSET) != new.get(name, _UNSET):
            changes.append(f"{name}: {_show(old.get(name, _UNSET))} -> {_show(new.get(name, _UNSET))}")
    return changes


class _Unset:
    def __repr__(self) -> str:
        return "unset"


_UNSET = _Unset()


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def report_resume(run: Any, metadata: Mapping[str, Any], where: str) -> None:
    """Warn about hyperparameters and experiment fields that differ from the checkpoint's, and
    say so when the checkpoint is already at or past ``max_length``."""
    hparams = changed_fields(metadata.get("hparams") or {}, run.hparams)
    if hparams:
        logger.warning(
            "resuming %s with hyperparameters changed since it was written: %s. The new values "
            "are what the trial reads (get_hparam); state restored from the checkpoint "
            "(optimizer parameter groups such as lr, LR schedulers, models) keeps the "
            "checkpoint's values.", where, "; ".join(hparams),
        )
    recorded_config = {k: v for k, v in (metadata.get("experiment_config") or {}).items() if k != "hyperparameters"}
    current_config = {k: v for k, v in run.config.to_dict().items() if k != "hyperparameters"}
    fields = changed_fields(recorded_config, current_config) if recorded_config else []
    if fields:
        logger.warning(
            "resuming %s with experiment fields changed since it was written: %s. The new "
            "values are used.", where, "; ".join(fields),
        )
    batches, limit = run.state.batches_trained, run.max_batches
    if limit is not None and batches >= limit:
        logger.warning(
            "checkpoint %s is at batch %d, already at or past max_length (%d batches): "
            "nothing is left to train; raise searcher.max_length to train further",
            where, batches, limit,
        )
