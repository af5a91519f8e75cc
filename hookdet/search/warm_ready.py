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

- the warm process ends with the process that started it (a search's worker): each process it
  forks holds the pipe by which :mod:`multiprocessing` tells the server its caller is gone, so a
  server with a segment running would outlive a worker killed with SIGKILL, and the segment,
  waiting on its parent-death signal, would train on, orphaned. A thread of the server waits on
  its parent's exit and ends it; the segment then gets its parent-death signal (SIGTERM:
  checkpoint and stop).

- what the warm process imported from outside the interpreter's own library and its
  site-packages (an editable install, a ``PYTHONPATH`` entry: code a user edits) is noted with
  each file's modification time and size; a segment forked after one of them changed runs as a
  new interpreter instead (:func:`changed_source`), so it runs the code as it is now.

Nothing here is for another process: the warm process alone imports this module.
"""
from __future__ import annotations

import gc
import os
import select
import signal
import site
import sys
import sysconfig
import threading
import time
import weakref
from typing import Dict, Optional, Tuple

import stevedore

from hookdet.checkpoints.registry import storage_class
# up: hookdet's version, read once here for every segment's command line
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


def watched_sources() -> Dict[str, Tuple[int, int]]:
    """(modification time, size) of the file of every module imported so far that lies outside
    the interpreter's standard library and site-packages, by path."""
    paths = sysconfig.get_paths()
    installed = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")} | set(site.getsitepackages())
    roots = tuple(os.path.join(os.path.realpath(root), "") for root in installed)
    found: Dict[str, Tuple[int, int]] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and not os.path.realpath(path).startswith(roots):
            try:
                status = os.stat(path)
            except OSError:
                continue
            found[path] = (status.st_mtime_ns, status.st_size)
    return found


def changed_source() -> Optional[str]:
    """A file :data:`WATCHED` notes that has changed (or gone) since the warm process imported
    it, or None."""
    for path, seen in WATCHED.items():
        try:
            status = os.stat(path)
        except OSError:
            return path
        if (status.st_mtime_ns, status.st_size) != seen:
            return path
    return None


def end_with_parent() -> None:
    """End this process (SIGKILL: it holds nothing to save) when the process that started it
    exits, watched from a daemon thread (a forked child has none of its threads)."""
    parent = os.getppid()

    def watch() -> None:
        try:
            with_parent = os.pidfd_open(parent)
        except (AttributeError, OSError):  # no pidfd (an older kernel): look every second
            while os.getppid() == parent:
                time.sleep(1.0)
        else:
            select.select([with_parent], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="hookdet-warm-parent", daemon=True).start()


#: ``sys.path`` as the entry points were read: a segment whose path has packages from elsewhere
#: reads them again.
PATH_READ = tuple(sys.path)
version_string()
stevedore.NamedExtensionManager(ENTRY_POINT_GROUP, names=[])  # reads the group, loads nothing
storage_class("default")
skip_inherited_torch_finalizers()
#: What :func:`changed_source` compares with: :func:`watched_sources` as the warm process got ready.
WATCHED = watched_sources()
end_with_parent()
gc.freeze()
