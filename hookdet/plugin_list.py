"""The experiment file's ``plugins:`` list, resolved once into the names a run loads.

pytest's ``-p`` convention:

- absent: the defaults (:data:`DEFAULT_PLUGINS`) run;
- ``plugins: [amp, mlflow]`` (or ``[+amp]``, the same thing spelt explicitly) adds to the defaults;
- ``plugins: [no:progress]`` removes a default (and keeps the trial from switching it on later);
- ``plugins: {only: [checkpoint, metrics_log]}`` runs exactly those and nothing else.

``checkpoint_storage.type`` picks a storage plugin that joins whenever ``checkpoint`` runs. The
result is a :class:`PluginSelection`; :class:`hookdet.run.Run` keeps it as ``run.plugin_names``
and ``run.removed_plugins``, and nothing else re-reads the raw list.

This module is the one place outside ``hookspecs.DEFAULT_PROVIDERS`` where hookdet's host knows
built-in plugins by name: the defaults, the storage plugin joining ``checkpoint``, ``ddp`` joining
a multi-process launch, and the launcher ``horovod`` needs.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

from hookdet.hookspecs import DEFAULT_PROVIDERS

#: Plugins that run unless the experiment file removes them (``no:<name>``) or says ``only:``.
DEFAULT_PLUGINS = ("callbacks", "preemption", "metrics_log", "checkpoint", "tensorboard", "progress")

#: The key of the "exactly these and nothing else" spelling: ``plugins: {only: [...]}``.
ONLY_KEY = "only"

#: Plugins that answer ``hookdet_make_distributed`` for a multi-process launch; ``ddp`` joins a
#: launch that names neither.
DISTRIBUTED_PLUGINS = ("ddp", "horovod")
#: The plugin ``init(enable_tensorboard_logging=False)`` leaves out.
TENSORBOARD_PLUGIN = "tensorboard"

REMOVE_PREFIX = "no:"
ADD_PREFIX = "+"

RawPluginList = Union[None, Sequence[str], Mapping[str, Sequence[str]]]


@dataclasses.dataclass(frozen=True)
class PluginSelection:
    """The plugins a run loads, in order, and the ones the experiment file removed."""

    names: Tuple[str, ...]
    removed: FrozenSet[str] = frozenset()
    exact: bool = False

    def __contains__(self, name: object) -> bool:
        return name in self.names


def resolve_plugin_list(requested: RawPluginList) -> PluginSelection:
    """Resolve the experiment file's ``plugins:`` value (already checked by the config schema).

    Names are kept in order: defaults first, then added names in the order listed; duplicates
    collapse onto their first place.
    """
    if isinstance(requested, Mapping):
        names = list(requested.get(ONLY_KEY) or [])
        removed: FrozenSet[str] = frozenset()
        exact = True
    else:
        entries = list(requested or [])
        removed = frozenset(e[len(REMOVE_PREFIX):] for e in entries if e.startswith(REMOVE_PREFIX))
        added = [e[len(ADD_PREFIX):] if e.startswith(ADD_PREFIX) else e for e in entries if not e.startswith(REMOVE_PREFIX)]
        names = list(DEFAULT_PLUGINS) + added
        exact = False
    kept = tuple(name for name in dict.fromkeys(names) if name not in removed)
    return PluginSelection(names=kept, removed=removed, exact=exact)


def names_to_load(
    selection: PluginSelection, launched_distributed: bool, launched_by_horovod: bool = False, tensorboard: bool = True
) -> List[str]:
    """The names a run loads at start: the selection, with ``ddp`` for a multi-process launch
    (``horovod`` for horovodrun's ranks) that names no distributed plugin, and without
    TensorBoard when the Trainer API switched it off."""
    names = list(selection.names)
    launched = launched_distributed or launched_by_horovod
    if launched and not any(name in names for name in DISTRIBUTED_PLUGINS):
        names.append("horovod" if launched_by_horovod else DISTRIBUTED_PLUGINS[0])
    if not tensorboard:
        names = [name for name in names if name != TENSORBOARD_PLUGIN]
    return names


def joining_later(selection: PluginSelection) -> Set[str]:
    """Plugins a run may load after the list is resolved: the built-in providers the trial
    switches on (``use_amp()`` loads ``amp``) and ``ddp``, which joins a multi-process launch."""
    return ({DISTRIBUTED_PLUGINS[0]} | set(DEFAULT_PROVIDERS.values())) - selection.removed


def launcher_for(selection: PluginSelection) -> str:
    """The command ``hookdet run`` starts ranks with: ``horovodrun`` for ``horovod``, else torchrun."""
    return "horovodrun" if "horovod" in selection.names else "torchrun"


def unused_plugin_config(
    plugin_config: Optional[Dict[str, Any]], enabled: Iterable[str], switchable: Iterable[str] = ()
) -> Optional[str]:
    """The message for a ``plugin_config`` block naming a plugin that is not enabled, or None.

    ``switchable`` names plugins the trial may still switch on (``use_amp()`` loads ``amp``); the
    run checks again, without them, once the trial is built and before training starts.
    """
    enabled = set(enabled)
    stray = [name for name in (plugin_config or {}) if name not in enabled and name not in set(switchable)]
    if not stray:
        return None
    return (
        f"plugin_config.{stray[0]}: plugin {stray[0]!r} is not enabled, so its options would be "
        f"ignored; add it to plugins: (enabled: {', '.join(sorted(enabled)) or 'none'})"
    )
