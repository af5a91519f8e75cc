"""``core_context.experimental``: which checkpoint a task used, as Determined records it.

On a cluster, a script that serves or evaluates a stored model tells the master which checkpoint
(or model-registry version) it used, linking what it reports to that checkpoint. Locally there
is no master and no model registry: the checkpoint's id is recorded in the run's ``run.json``,
under ``used_checkpoints`` (in the order told, each once), where ``hookdet show`` and the web view
read every other field of the run.
"""
from __future__ import annotations

from typing import Any

from hookdet.runs import record as run_record


class ExperimentalCoreContext:
    """``report_task_using_checkpoint`` and ``report_task_using_model_version`` (Determined's)."""

    def __init__(self, run: Any) -> None:
        self._run = run

    def report_task_using_checkpoint(self, checkpoint: Any) -> None:
        """Record that this run used ``checkpoint`` (an SDK ``Checkpoint``, or its id)."""
        self._record(str(getattr(checkpoint, "uuid", checkpoint)))

    def report_task_using_model_version(self, model_version: Any) -> None:
        """Record that this run used ``model_version``'s checkpoint (Determined asserts it has one)."""
        assert model_version.checkpoint
        self._record(str(model_version.checkpoint.uuid))

    def _record(self, checkpoint_id: str) -> None:
        run = self._run
        if not run.is_chief:
            return
        used = list((run_record.read_record(run.run_dir, check_alive=False) or {}).get("used_checkpoints") or [])
        if checkpoint_id not in used:
            run_record.note_fields(run.run_dir, used_checkpoints=[*used, checkpoint_id])
