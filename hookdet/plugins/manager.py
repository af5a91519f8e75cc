"""Builds the pluggy manager from the experiment file's ``plugins:`` list.

Plugins are entry points in the ``hookdet.plugins`` group, built-in and third-party alike, and
are resolved by name through stevedore: only the named ones are imported. An entry point names a
module (registered as is) or a class (instantiated; with ``options=`` when its ``__init__`` takes
them, filled from ``plugin_config.<name>``). A plugin class may declare ``conflicts_with`` (names
it refuses to run beside); what a run has exactly one of (its precision) is asked with
:meth:`PluginManager.one_answer`, which refuses a second answer by itself. Any exception a plugin raises in a hook is re-raised as a
:class:`PluginError` naming the plugin and the hook.
"""
from __future__ import annotations

import inspect
import logging
import os
import types
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

import pluggy

from hookdet.plugins import hookspecs
from hookdet.plugins import default_hooks
from hookdet.errors import PluginError  # PluginError: raised here, defined with hookdet's other errors
from hookdet.plugins.monitor import HookMonitor, TraceLog
from hookdet.markers import HOOK_NAMESPACE
from hookdet.plugins import selection
from hookdet.plugins.selection import DEFAULT_PLUGINS  # noqa: F401 (re-exported)
from hookdet.plugins.options import options_for

logger = logging.getLogger("hookdet")

ENTRY_POINT_GROUP = selection.ENTRY_POINT_GROUP

DEFAULTS_NAME = "hookdet.defaults"


def option_error(plugin: str, field: str, expected: str, value: Any) -> PluginError:
    """The one error a bad ``plugin_config.<plugin>.<field>`` value gets."""
    return PluginError(f"plugin_config.{plugin}.{field} must be {expected}, got {value!r}")


def check_known_options(plugin: str, options: Dict[str, Any], known: Tuple[str, ...]) -> None:
    """Refuse an option the plugin does not have, listing the ones it does."""
    for name in options:
        if name not in known:
            raise PluginError(
                f"plugin_config.{plugin}: unknown option {name!r}; known options: {', '.join(known)}"
            )


def read_seconds_option(plugin: str, options: Dict[str, Any], field: str, default: float) -> float:
    """A ``plugin_config.<plugin>.<field>`` number of seconds, 0 or more (``default`` if absent)."""
    value = options.get(field, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise option_error(plugin, field, "a number of seconds, 0 or more", value)
    return float(value)


def installed_plugins() -> Dict[str, str]:
    """Installed plugin names mapped to their entry-point targets, without importing any."""
    import stevedore  # reads entry points (importlib.metadata): only when plugins are listed

    manager = stevedore.NamedExtensionManager(ENTRY_POINT_GROUP, names=[])
    return {ep.name: ep.value for ep in manager.list_entry_points()}


class _HookFinder(pluggy.PluginManager):
    """pluggy's manager, told that no hook is named like ``__init__``: registering a plugin
    skips its dunder attributes (about half of what ``dir()`` lists on a plugin instance, and
    half the time a registration takes; every run registers its plugins)."""

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            return None
        return super().parse_hookimpl_opts(plugin, name)


class PluginManager:
    """hookdet's plugins for one run: registration by name, conflicts, errors, tracing."""

    def __init__(
        self,
        plugin_config: Optional[Dict[str, Dict[str, Any]]] = None,
        locate: Optional[Callable[[str], str]] = None,
    ) -> None:
        """``plugin_config`` holds each plugin's options; ``locate(name)`` says where the
        experiment file gives them (``file:line``), for a plugin's refusal of its options."""
        self._locate = locate
        self._pm = _HookFinder(HOOK_NAMESPACE)
        self._pm.add_hookspecs(hookspecs)
        self._pm.register(default_hooks, name=DEFAULTS_NAME)
        self._plugin_config = dict(plugin_config or {})
        #: The one watch over hook calls: errors named by plugin, and timing for listeners
        #: (``monitor.listen(...)``; the ``hook_timing`` plugin listens, and so does
        #: ``HOOKDET_TRACE=1``'s log).
        self.monitor = HookMonitor(self._pm, DEFAULTS_NAME, PluginError)
        if os.environ.get("HOOKDET_TRACE", "") not in ("", "0"):
            self.monitor.listen(TraceLog())

    @property
    def hook(self) -> Any:
        """The hook relay (``manager.hook.on_validation_end(metrics=...)``)."""
        return self._pm.hook

    @property
    def pluggy_manager(self) -> pluggy.PluginManager:
        """The underlying pluggy manager."""
        return self._pm

    # ------------------------------------------------------------------ loading

    def load_all(self, names: Iterable[str]) -> None:
        """Import and register ``names`` in order; an unknown name lists the installed ones."""
        names = [name for name in names if self.get(name) is None]
        if not names:
            return
        import stevedore  # reads entry points (importlib.metadata): only when plugins are named

        unknown: List[str] = []
        failures: List[str] = []

        def on_missing(missing: Iterable[str]) -> None:
            unknown.extend(missing)

        def on_failure(_manager: Any, entry_point: Any, error: Exception) -> None:
            failures.append(f"plugin {entry_point.name!r} ({entry_point.value}) failed to import: {error}")

        extensions = stevedore.NamedExtensionManager(
            ENTRY_POINT_GROUP,
            names=names,
            name_order=True,
            invoke_on_load=False,
            on_missing_entrypoints_callback=on_missing,
            on_load_failure_callback=on_failure,
        )
        if failures:  # a plugin that failed to import is installed, not unknown: say why
            raise PluginError("; ".join(failures))
        if unknown:
            names_installed = sorted(installed_plugins())
            named = ", ".join(f"{name!r}{_closest(name, names_installed)}" for name in sorted(unknown))
            raise PluginError(f"unknown plugin {named}; installed plugins: {', '.join(names_installed) or 'none'}")
        for extension in extensions:
            self.register(extension.name, extension.plugin)

    def load(self, name: str) -> Any:
        """The plugin registered as ``name``, loading it now if the experiment file did not list it.

        A plugin loaded this way (by ``context.experimental.use_amp()``, say) is configured at once
        when the run already started. A plugin the experiment file removed (``no:<name>``) is
        refused.
        """
        plugin = self.get(name)
        if plugin is None:
            if name in self.removed:
                raise PluginError(
                    f"plugin {name!r} is needed here but the experiment file removes it (no:{name}); "
                    f"drop 'no:{name}' from plugins"
                )
            self.load_all([name])
            plugin = self.get(name)
            if self._run is not None and hasattr(plugin, "hookdet_configure"):
                self._call_plugin_hook(name, plugin, "hookdet_configure", run=self._run)
        return plugin

    _run: Any = None
    #: Names the experiment file removed (``no:<name>``): :meth:`load` refuses them.
    removed: FrozenSet[str] = frozenset()
    #: Bumped by every registration and unregistration, so a caller that cached which hooks have
    #: implementations knows when to look again (the loop checks it between batches).
    generation: int = 0

    def ensure_provider(self, hook_name: str) -> None:
        """Make sure some plugin answers the provider hook ``hook_name``.

        When none does, the plugin :data:`hookdet.plugins.selection.DEFAULT_PROVIDERS` names for it is
        loaded (the trial switched a feature on that the experiment file did not list).
        """
        if self.implemented(hook_name):
            return
        default = selection.DEFAULT_PROVIDERS.get(hook_name)
        if default is None:
            raise PluginError(f"no plugin implements {hook_name}; enable one that does")
        self.load(default)
        if not self.implemented(hook_name):
            raise PluginError(f"plugin {default!r} was loaded to answer {hook_name} but does not implement it")

    def provide(self, hook_name: str, *, optional: bool = False, **kwargs: Any) -> Any:
        """The first non-None answer to the provider hook ``hook_name``.

        When no running plugin answers, the built-in provider that
        :data:`hookdet.plugins.selection.DEFAULT_PROVIDERS` names is loaded and asked (the trial switched
        on a feature the experiment file did not list). A provider the experiment file removed
        (``no:<name>``) is an error naming it, or with ``optional`` an answer of None.
        """
        caller = getattr(self._pm.hook, hook_name)
        answer = caller(**kwargs) if self.implemented(hook_name) else None
        if answer is not None:
            return answer
        default = selection.DEFAULT_PROVIDERS.get(hook_name)
        if default is None or self.get(default) is not None or (optional and default in self.removed):
            if optional:
                return None
            raise PluginError(f"no plugin answers {hook_name}; enable one that implements it")
        self.load(default)
        return caller(**kwargs)

    def load_precision_for(self, call: str) -> Any:
        """Load the built-in precision that answers the trial's mixed-precision ``call``
        (:data:`hookdet.plugins.selection.PRECISION_FOR_CALL`: ``use_amp`` loads ``amp``)."""
        return self.load(selection.PRECISION_FOR_CALL[call])

    def one_answer(self, hook_name: str, what: str, **kwargs: Any) -> Any:
        """The answer of the one plugin that answers the provider hook ``hook_name`` (None when
        none does); a second answering is refused, naming both. A run has one of ``what`` (its
        precision): the structure keeps it so, not a declared conflict list."""
        answers: List[Tuple[str, Any]] = []
        for implementation in getattr(self._pm.hook, hook_name).get_hookimpls():
            name = implementation.plugin_name
            if name == DEFAULTS_NAME:
                continue
            results = self._call_plugin_hook(name, implementation.plugin, hook_name, **kwargs)
            answers += [(name, answer) for answer in results if answer is not None]
        if len(answers) > 1:
            first, second = sorted(name for name, _ in answers)[:2]
            raise PluginError(
                f"plugins {first!r} and {second!r} both provide {what}, and a run has one; remove "
                "one from the experiment file's plugins (or stop the trial from switching it on)"
            )
        return answers[0][1] if answers else None

    def unregister(self, name: str) -> Any:
        """Unregister the plugin registered as ``name`` (if any); returns it."""
        plugin = self._pm.unregister(name=name) if self._pm.has_plugin(name) else None
        self.generation += 1
        return plugin

    def start(self, run: Any) -> None:
        """Configure every registered plugin for ``run`` (``hookdet_configure``)."""
        self._run = run
        self.hook.hookdet_configure(run=run)

    def register(self, name: str, target: Any) -> Any:
        """Register a plugin module, class or instance as ``name``; returns the registered object."""
        options = self._plugin_config.get(name) or {}
        where = f"{self._locate(name)}: " if self._locate is not None and name in self._plugin_config else ""
        if isinstance(target, types.ModuleType):
            if options:
                raise PluginError(f"{where}plugin {name!r} is a module and takes no plugin_config options")
            plugin = target
        elif inspect.isclass(target):
            takes_options = "options" in inspect.signature(target).parameters
            if options and not takes_options:
                raise PluginError(f"{where}plugin {name!r} takes no plugin_config options, got {sorted(options)}")
            try:
                plugin = target(options=options_for(target, options, name)) if takes_options else target()
            except PluginError as error:
                raise PluginError(f"{where}{error}") from error
            except Exception as error:
                raise PluginError(f"{where}plugin {name!r}: invalid plugin_config.{name}: {error}") from error
        else:
            plugin = target
        self._check_conflicts(name, plugin)
        try:
            self._pm.register(plugin, name=name)
            self.generation += 1
            self._pm.check_pending()
            self.monitor.wrap_implementations()
        except pluggy.PluginValidationError as error:
            if self._pm.is_registered(plugin):
                self._pm.unregister(plugin)
            raise PluginError(f"plugin {name!r} does not match hookdet's hooks: {error}") from error
        return plugin

    def _check_conflicts(self, name: str, plugin: Any) -> None:
        mine = set(getattr(plugin, "conflicts_with", ()))
        for other_name, other in self.named_plugins().items():
            theirs = set(getattr(other, "conflicts_with", ()))
            if other_name in mine or name in theirs:
                raise PluginError(
                    f"plugins {other_name!r} and {name!r} cannot run together; remove one from "
                    "the experiment file's plugins (or stop the trial from enabling it)"
                )

    def get(self, name: str) -> Any:
        """The registered plugin ``name``, or None."""
        return self._pm.get_plugin(name)

    def named_plugins(self) -> Dict[str, Any]:
        """Registered plugins by name, hookdet's defaults excluded, in registration order."""
        return {
            name: plugin
            for name, plugin in self._pm.list_name_plugin()
            if name != DEFAULTS_NAME and plugin is not None
        }

    # ------------------------------------------------------------------ introspection

    def implemented(self, hook_name: str) -> bool:
        """Whether a plugin other than hookdet's defaults implements or wraps ``hook_name``.

        The loop calls a per-batch hook only when this is True.
        """
        caller = getattr(self._pm.hook, hook_name)
        return any(impl.plugin_name != DEFAULTS_NAME for impl in caller.get_hookimpls())

    def hooks_of(self, plugin: Any) -> List[str]:
        """The hook names ``plugin`` implements."""
        return sorted(caller.name for caller in self._pm.get_hookcallers(plugin) or [])

    # ------------------------------------------------------------------ the hook monitor

    def _call_plugin_hook(self, name: str, plugin: Any, hook_name: str, **kwargs: Any) -> Any:
        """Call one plugin's implementation of ``hook_name`` only."""
        caller = self._pm.subset_hook_caller(
            hook_name, remove_plugins=[p for n, p in self._pm.list_name_plugin() if n != name]
        )
        return caller(**kwargs)


def _closest(name: str, installed: List[str]) -> str:
    """`` (did you mean 'x'?)`` for the installed plugin name closest to a misspelt one."""
    import difflib

    matches = difflib.get_close_matches(name, installed, n=1, cutoff=0.6)
    return f" (did you mean {matches[0]!r}?)" if matches else ""
