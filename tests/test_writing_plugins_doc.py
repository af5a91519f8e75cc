"""docs/writing-plugins.md names every hook, every plugin protocol and every public ``Run`` field a
plugin author may use (its code examples are executed by tests/test_docs.py)."""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import hookdet
import hookdet.plugin
from hookdet.plugins import hookspecs

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "writing-plugins.md").read_text(encoding="utf-8")


def test_every_hook_is_named() -> None:
    specs = [name for name, f in vars(hookspecs).items() if inspect.isfunction(f) and hasattr(f, "hookdet_spec")]
    assert len(specs) > 30
    missing = [name for name in specs if f"`{name}`" not in PAGE]
    assert missing == [], f"writing-plugins.md does not name {missing}"


def test_every_protocol_is_named() -> None:
    protocols = [name for name, obj in vars(hookspecs).items()
                 if inspect.isclass(obj) and getattr(obj, "_is_protocol", False) and obj.__module__ == hookspecs.__name__]
    assert len(protocols) >= 4
    assert [name for name in protocols if f"`{name}`" not in PAGE] == []


def test_every_public_export_and_run_field_is_named() -> None:
    plugin_face = [name for name in hookdet.plugin.__all__]
    assert [name for name in plugin_face if f"`{name}`" not in PAGE and f"hookdet.plugin.{name}" not in PAGE] == []
    determined_face = [
        name for name in hookdet.__all__
        if not name.startswith("_") and name not in ("pytorch", *hookdet.plugin.__all__)
    ]
    assert [name for name in determined_face if f"hookdet.{name}" not in PAGE] == []
    fields = [field.name for field in dataclasses.fields(hookdet.plugin.Run)] + ["hook", "is_chief", "options"]
    assert [name for name in fields if f"run.{name}" not in PAGE] == []
