"""The face for a plugin that writes and restores checkpoints, beside :mod:`hookdet.plugin`.

What the built-in ``checkpoint`` plugin (and any replacement of it) uses of hookdet's checkpoint
machinery, and nothing else of it:

* ``fmt``: the checkpoint format (``write_state``, ``write_metadata``, ``read_metadata``,
  ``load_state``, ``verify``, ``CheckpointError``, the file names): docs/checkpoint-format.md;
* ``lookup``: checkpoints found on a local disk; ``resolver``'s ``locate``: from what a user
  names (a path or a checkpoint id) to a storage and a checkpoint
  (:mod:`hookdet.checkpoints.resolver`); ``user_index``: this user's checkpoint ids;
* ``BackgroundWriter``, ``HostSnapshot`` and ``write_failed``: writing while training goes on;
* ``noting_the_write``: a write noted in the run directory while it lasts, so a resume can
  remove what a killed one left on any storage;
* ``report_resume``: what a resume says changed since the checkpoint was written;
* ``checkpoints_to_delete``: Determined's retention rule (:mod:`hookdet.checkpoints.retention`).
"""
from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import lookup, user_index
from hookdet.checkpoints.resolver import locate
from hookdet.checkpoints.retention import checkpoints_to_delete
from hookdet.checkpoints.writer import BackgroundWriter, HostSnapshot, write_failed
from hookdet.runs.lock import noting_the_write
from hookdet.runs.resume_report import report_resume

__all__ = ["BackgroundWriter", "HostSnapshot", "checkpoints_to_delete", "fmt", "locate", "lookup", "noting_the_write",
           "report_resume", "user_index", "write_failed"]
