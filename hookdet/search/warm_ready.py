"""The warm process's last preload (see :mod:`hookdet.search.warm_start`): it readies an
interpreter whose only work from now on is to be forked, once per segment.

- ``gc.freeze()``: the objects built so far (torch, the libraries, hookdet) leave the garbage
  collector's generations, so a segment's collections never walk them (walking an inherited
  object writes to it, and so copies its page);
- torch's operator libraries register a ``weakref.finalize`` each (about 170) that unregisters
  their operators when the interpreter exits: 30 ms of every segment's exit spent undoing
  registrations that end with the process anyway. The finalizers inherited from here are made
  not to run at a segment's exit (their ``atexit`` flag); a segment's own still run.

- what every ``hookdet run`` reads and no segment changes is read once here: hookdet's version
  (the command line's ``--version``), the plugins' entry points (stevedore keeps them in memory
  once read) and the class of the default checkpoint storage. In a forked segment, reading them
  again walks the installed packages with cold caches; a segment whose ``sys.path`` has packages
  from elsewhere (a ``PYTHONPATH`` of its own) reads the entry points again.

Nothing here is for another process: the warm process alone imports this module.
"""
from __future__ import annotations

import gc
import sys
import weakref

import stevedore

from hookdet.checkpoints.registry import storage_class
from hookdet.cli.commands import version_string
from hookdet.plugins.selection import ENTRY_POINT_GROUP


def skip_inherited_torch_finalizers() -> int:
    """Clear the ``atexit`` flag of torch's live finalizers; how many. The registry of live
    finalizers has no public name: without it (another Python), nothing is changed."""
    registry = getattr(weakref.finalize, "_registry", {})
    skipped = 0
    for finalizer in list(registry):
        found = finalizer.peek()
        if found is not None and getattr(found[1], "__module__", "") == "torch.library":
            finalizer.atexit = False
            skipped += 1
    return skipped


#: ``sys.path`` as the entry points were read: a segment whose path has packages from elsewhere
#: reads them again.
PATH_READ = tuple(sys.path)
version_string()
stevedore.NamedExtensionManager(ENTRY_POINT_GROUP, names=[])  # reads the group, loads nothing
storage_class("default")
skip_inherited_torch_finalizers()
gc.freeze()
