"""The one importer of ``module:Qualified.Name`` specs: trial entrypoints, the trial class a
checkpoint records, plugin entry points. Every failure is one :class:`SpecImportError` that names
the spec and what went wrong, for the caller to put in context (file, checkpoint, plugin).
"""
from __future__ import annotations

import importlib
from typing import Any


class SpecImportError(ImportError):
    """``spec`` names nothing importable; the message says whether the module or the name was
    missing, with the module's own error."""

    def __init__(self, spec: str, message: str) -> None:
        super().__init__(message)
        self.spec = spec


def import_object(spec: str) -> Any:
    """The object ``spec`` (``module:Qualified.Name``, or a bare ``module``) names."""
    module_name, _, qualname = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # a module that fails while importing is the user's to see
        raise SpecImportError(
            spec, f"cannot import module {module_name!r}: {type(error).__name__}: {error}"
        ) from error
    for part in filter(None, qualname.split(".")):
        if not hasattr(target, part):
            raise SpecImportError(spec, f"module {module_name!r} has no {qualname!r}")
        target = getattr(target, part)
    return target
