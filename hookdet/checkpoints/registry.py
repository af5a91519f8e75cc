"""Storage types by name: ``checkpoint_storage.type`` -> the class that serves it.

Types are entry points in the group ``hookdet.checkpoint_storage`` (hookdet declares its own
there: ``shared_fs``, ``directory``, ``s3``, ``gcs``, ``azure``), loaded by name through stevedore only when a run
asks for that type. A package adds a type with one line in its ``pyproject.toml``::

    [project.entry-points."hookdet.checkpoint_storage"]
    webdav = "hookdet_webdav:WebDAVStorage"     # a CheckpointStorage subclass

The class answers :meth:`~hookdet.checkpoints.storage.CheckpointStorage.from_config` (the block
of the experiment file) and ``from_locator`` (what a run directory recorded of it).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Dict, List, Optional

from hookdet.checkpoints.storage import CheckpointStorage, StorageError

GROUP = "hookdet.checkpoint_storage"

#: A ``checkpoint_storage`` block of retention counts only: the run's own directory, served by
#: the ``shared_fs`` type. ``local`` is what run directories of hookdet 0.1 recorded.
_ALIASES = {"default": "shared_fs", "local": "shared_fs"}


def installed_types() -> List[str]:
    """Every storage type installed: hookdet's own in Determined's order, then others by name."""
    from stevedore import NamedExtensionManager

    built_in = ["shared_fs", "directory", "s3", "gcs", "azure"]
    names = {entry_point.name for entry_point in NamedExtensionManager(GROUP, names=[]).list_entry_points()}
    return [name for name in built_in if name in names] + sorted(names - set(built_in))


@functools.lru_cache(maxsize=None)
def storage_class(type_name: str) -> type:
    """The class serving ``type_name``; :class:`StorageError` listing the installed types when
    none does (or its module fails to import)."""
    from stevedore import DriverManager
    from stevedore.exception import NoMatches

    name = _ALIASES.get(type_name, type_name)
    try:
        return DriverManager(GROUP, name, invoke_on_load=False, on_load_failure_callback=_reraise).driver
    except NoMatches:
        raise StorageError(
            f"no checkpoint storage type {type_name!r} is installed (installed: "
            f"{', '.join(installed_types())}); a package adds one in the entry-point group {GROUP!r}"
        ) from None


def _reraise(_manager: Any, entry_point: Any, error: BaseException) -> None:
    raise StorageError(f"checkpoint storage type {entry_point.name!r} failed to load: {error}") from error


def make_storage(config: Any, run_dir: Path) -> CheckpointStorage:
    """The storage a validated ``checkpoint_storage`` block (or None: the default) names."""
    type_name = "default" if config is None else config.type
    storage = storage_class(type_name).from_config(config, Path(run_dir))
    if not storage.type_name:  # a class that does not say its type: the name it was found by
        storage.type_name = type_name
    return storage


def storage_from_locator(
    locator: Dict[str, Any], current: Optional[CheckpointStorage] = None
) -> CheckpointStorage:
    """The storage a recorded :meth:`~CheckpointStorage.locator` describes: ``current`` (the
    running run's storage) when it is the same place, so its credentials are used."""
    if current is not None and current.same_place(locator):
        return current
    if not isinstance(locator, dict) or not isinstance(locator.get("type"), str):
        raise StorageError(f"a checkpoint storage locator needs a 'type'; got {locator!r}")
    cls = storage_class(locator["type"])
    try:
        return cls.from_locator(locator)
    except (TypeError, ValueError) as error:
        raise StorageError(f"cannot rebuild {locator['type']!r} storage from {locator!r}: {error}") from error
