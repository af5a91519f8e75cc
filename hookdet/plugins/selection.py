"""The experiment file's ``plugins:`` list and the launch, resolved once into the plugins a run loads.

pytest's ``-p`` convention:

- absent: the defaults (:data:`DEFAULT_PLUGINS`) run;
- ``plugins: [amp, mlflow]`` (or ``[+amp]``, the same thing spelt explicitly) adds to the defaults;
- ``plugins: [no:progress]`` removes a default (and keeps the trial from switching it on later);
- ``plugins: {only: [checkpoint, metrics_log]}`` runs exactly those and nothing else.

A multi-process launch (``WORLD_SIZE`` > 1, or horovodrun's ``HOROVOD_SIZE``) adds ``ddp``
(``horovod`` for horovodrun) unless the list names a distributed plugin, removes it (``no:ddp``)
or says ``only:``: the file's word holds under a launcher too, and a launch that no plugin makes
distributed is refused when the run opens. The result is one :class:`PluginSelection`, built by
:func:`select_plugins`; the plugin manager is built from it and nothing re-reads the raw list.

This module is the one place where hookdet's host knows built-in plugins by name: the
defaults, the distributed plugins a launch adds, the launcher ``horovod`` needs, the built-in
answer to each trial-API provider hook (:data:`DEFAULT_PROVIDERS`) and the built-in precision
each of Determined's mixed-precision calls switches on (:data:`PRECISION_FOR_CALL`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, FrozenSet, Iterable, Mapping, Optional, Sequence, Set, Tuple, Union

#: The entry-point group every plugin, built-in or third-party, is installed under.
ENTRY_POINT_GROUP = "hookdet.plugins"

#: Plugins that run unless the experiment file removes them (``no:<name>``) or says ``only:``.
DEFAULT_PLUGINS = ("callbacks", "preemption", "metrics_log", "checkpoint", "tensorboard", "progress", "run_log")

#: The built-in plugin that answers each trial-API provider hook when no registered plugin does;
#: :meth:`hookdet.plugins.manager.PluginManager.provide` loads it by this name, unless the
#: experiment file removed it (so ``no:callbacks`` leaves the trial's callbacks unrun, with a warning).
DEFAULT_PROVIDERS = {
    "hookdet_add_callbacks": "callbacks",
    "hookdet_set_profiler": "profiler",
    "hookdet_make_tensorboard_writer": "tensorboard",
}

#: The built-in precision each of Determined's mixed-precision calls switches on while a run is
#: in float32 (:func:`hookdet.trial_api.precision.precision_for_call`).
PRECISION_FOR_CALL = {
    "use_amp": "amp",
    "wrap_scaler": "amp",
    "autocast_forward_pass": "amp",
    "configure_apex_amp": "apex",
}

#: The key of the "exactly these and nothing else" spelling: ``plugins: {only: [...]}``.
ONLY_KEY = "only"

#: Plugins that answer ``hookdet_make_distributed`` for a multi-process launch; ``ddp`` joins a
#: launch that names neither.
DISTRIBUTED_PLUGINS = ("ddp", "horovod")
#: The plugin ``init(enable_tensorboard_logging=False)`` leaves out.
TENSORBOARD_PLUGIN = "tensorboard"
#: The plugin whose live view ``hookdet run``'s launcher draws for a run of several processes.
PROGRESS_PLUGIN = "progress"

REMOVE_PREFIX = "no:"
ADD_PREFIX = "+"

RawPluginList = Union[None, Sequence[str], Mapping[str, Sequence[str]]]


@dataclasses.dataclass(frozen=True)
class Launch:
    """How this process was started: one of ``world_size`` ranks, by horovodrun or not."""

    world_size: int = 1
    horovod: bool = False

    @classmethod
    def from_environment(cls, environ: Optional[Mapping[str, str]] = None) -> "Launch":
        """The launch torchrun (``WORLD_SIZE``) or horovodrun (``HOROVOD_SIZE``) describes."""
        environ = os.environ if environ is None else environ
        horovod_size = int(environ.get("HOROVOD_SIZE", "1"))
        if horovod_size > 1:
            return cls(world_size=horovod_size, horovod=True)
        return cls(world_size=int(environ.get("WORLD_SIZE", "1")))

    @property
    def multi_process(self) -> bool:
        return self.world_size > 1


@dataclasses.dataclass(frozen=True)
class PluginSelection:
    """The plugins a run loads, in order, the ones the experiment file removed, whether it said
    ``only:``, and the launch they were chosen for."""

    names: Tuple[str, ...]
    removed: FrozenSet[str] = frozenset()
    exact: bool = False
    launch: Launch = Launch()

    def __contains__(self, name: object) -> bool:
        return name in self.names

    @property
    def shows_progress(self) -> bool:
        """Whether the built-in progress view is on (the launcher then draws it for the ranks)."""
        return PROGRESS_PLUGIN in self.names

    @property
    def launcher(self) -> str:
        """The command ``hookdet run`` starts ranks with: ``horovodrun`` for ``horovod``, else torchrun."""
        return "horovodrun" if "horovod" in self.names else "torchrun"

    def may_join(self) -> Set[str]:
        """Plugins the file's ``plugin_config`` may configure beyond :attr:`names`: the built-in
        providers the trial may switch on (``use_amp()`` loads ``amp``) and the distributed
        plugins a launch adds (one file serves one process and many), unless removed."""
        switchable = set(DEFAULT_PROVIDERS.values()) | set(PRECISION_FOR_CALL.values())
        return (set(DISTRIBUTED_PLUGINS) | switchable) - self.removed

    def not_distributed_reason(self) -> str:
        """Why no plugin of this selection makes a multi-process launch distributed."""
        removed = sorted(self.removed & set(DISTRIBUTED_PLUGINS))
        if removed:
            return f"the experiment file removes {', '.join(repr(n) for n in removed)} (no:{removed[0]})"
        if self.exact:
            return f"the experiment file lists only {list(self.names)}"
        return "no plugin in the experiment file answers hookdet_make_distributed"


def select_plugins(requested: RawPluginList, launch: Launch = Launch(), tensorboard: bool = True) -> PluginSelection:
    """Resolve the experiment file's ``plugins:`` value (already checked by the config schema)
    for ``launch``; ``tensorboard=False`` (the Trainer API's switch) leaves TensorBoard out.

    Names are kept in order: defaults first, then added names in the order listed; duplicates
    collapse onto their first place; a distributed plugin a launch adds comes last.
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
    kept = [name for name in dict.fromkeys(names) if name not in removed]
    joining = "horovod" if launch.horovod else DISTRIBUTED_PLUGINS[0]
    if launch.multi_process and not exact and joining not in removed and not set(kept) & set(DISTRIBUTED_PLUGINS):
        kept.append(joining)
    if not tensorboard:
        kept = [name for name in kept if name != TENSORBOARD_PLUGIN]
    return PluginSelection(names=tuple(kept), removed=removed, exact=exact, launch=launch)


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
