"""The project's pluggy markers, as pytest and kedro define theirs.

Plugins decorate their hook implementations with :data:`hookimpl`; the catalogue in
:mod:`hookdet.plugins.hookspecs` uses :data:`hookspec`.
"""
import pluggy

HOOK_NAMESPACE = "hookdet"

hookspec = pluggy.HookspecMarker(HOOK_NAMESPACE)
hookimpl = pluggy.HookimplMarker(HOOK_NAMESPACE)
