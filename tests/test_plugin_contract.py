"""The plugin contract, checked on the source: plugins reach the core only through public names,
no built-in plugin imports another, and no host module calls a plugin by name.

* Plugins (``hookdet/plugins/builtin/``, every package under ``plugins-contrib/``, its tests
  aside, and the replacement package in ``tests/fixtures/hookdet-replacements``) touch no underscore attribute of an object that is not their own (``self``/``cls``),
  import no underscore name from hookdet, and import no built-in plugin (a built-in may not
  import another; a contrib plugin none). The few reaches left are listed in
  :data:`ALLOWED_REACHES`, each with its reason: torch functions with no public equivalent, and
  a plugin's companion object in the same module.
* Host modules (everything else in ``hookdet/``) import no built-in plugin, never ask the plugin
  manager for a built-in by name, compare nothing with a built-in's name, and call no method
  that only a particular plugin has. The names of built-ins live in one place by design:
  :mod:`hookdet.plugins.selection` (the defaults, the join rules and ``DEFAULT_PROVIDERS``).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

from hookdet.plugins.manager import installed_plugins

REPO = Path(__file__).resolve().parent.parent
HOOKDET = REPO / "hookdet"
BUILTINS = HOOKDET / "plugins" / "builtin"

#: ``(file relative to the repo, expression)`` -> why the underscore reach stays.
ALLOWED_REACHES: Dict[Tuple[str, str], str] = {
    ("hookdet/plugins/builtin/apex/backends.py", "torch._amp_update_scale_"):
        "GradScaler's own scale update; torch has no public per-scaler function for apex's N losses",
    ("hookdet/plugins/builtin/apex/backends.py", "torch._amp_foreach_non_finite_check_and_unscale_"):
        "GradScaler's own fused unscale-and-check; no public equivalent",
    ("hookdet/plugins/builtin/apex/backends.py", "torch._foreach_copy_"):
        "one fused copy of every master weight back into the model; the public way is a Python loop per parameter",
    ("hookdet/plugins/builtin/tensorboard.py", "self.get_writer()._get_file_writer"):
        "SummaryWriter's file writer, reopened if the trial closed it; what add_scalar itself calls",
}

#: Methods only a particular plugin has: the host reaches them through hooks instead. (The
#: mixed-precision switches, ``use_amp`` and the like, are methods of the documented
#: ``Precision`` protocol, which the context calls on whatever ``hookdet_make_precision`` gave.)
PLUGIN_METHODS = {"get_writer", "set_profiler", "add_callbacks", "resume_point", "callbacks"}

#: Host modules that name built-ins by design (see the module docstring).
NAMING_MODULES = {"hookdet/plugins/selection.py"}


def builtin_names() -> Set[str]:
    return {name for name, target in installed_plugins().items() if target.startswith("hookdet.plugins.builtin.")}


def plugin_sources() -> List[Path]:
    contrib = [
        path for path in sorted((REPO / "plugins-contrib").glob("*/**/*.py"))
        if "tests" not in path.relative_to(REPO / "plugins-contrib").parts
    ]
    replacements = sorted((REPO / "tests" / "fixtures" / "hookdet-replacements").glob("*.py"))
    return sorted(BUILTINS.rglob("*.py")) + contrib + replacements


def host_sources() -> List[Path]:
    return [path for path in sorted(HOOKDET.rglob("*.py")) if BUILTINS not in path.parents]


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def imported_modules(tree: ast.AST) -> Iterator[Tuple[int, str, List[str]]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, [alias.name for alias in node.names]


def test_the_walk_sees_the_plugins_and_the_host() -> None:
    names = {relative(path) for path in plugin_sources()}
    assert {"hookdet/plugins/builtin/checkpoint/__init__.py", "hookdet/plugins/builtin/amp.py"} <= names
    assert any(name.startswith("plugins-contrib/hookdet-mlflow/") for name in names)
    assert "hookdet/loop/core_loop.py" in {relative(path) for path in host_sources()}


def test_plugins_touch_no_underscore_attribute_of_a_hookdet_object() -> None:
    problems = []
    used_allowances = set()
    for path in plugin_sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            key = (relative(path), ast.unparse(node))
            if key in ALLOWED_REACHES:
                used_allowances.add(key)
                continue
            problems.append(f"{key[0]}:{node.lineno}: {key[1]}")
    assert problems == [], "plugins reach into private attributes:\n" + "\n".join(problems)
    assert used_allowances == set(ALLOWED_REACHES), f"stale allowances: {set(ALLOWED_REACHES) - used_allowances}"


def test_plugins_import_no_other_plugin_and_no_private_name() -> None:
    problems = []
    for path in plugin_sources():
        # A plugin is a module of builtin_plugins/ or a package there (whose modules import each other).
        own = None
        if BUILTINS in path.parents:
            top = path.relative_to(BUILTINS).parts[0]
            own = f"hookdet.plugins.builtin.{top[:-3] if top.endswith('.py') else top}"
        for line, module, names in imported_modules(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{relative(path)}:{line}"
            if module.startswith("hookdet.plugins.builtin") and not (own and (module == own or module.startswith(own + "."))):
                problems.append(f"{where}: imports {module}")
            if module.startswith("hookdet") and any(part.startswith("_") for part in module.split(".")):
                problems.append(f"{where}: imports the private module {module}")
            if module.startswith("hookdet") and any(n.startswith("_") for n in names):
                problems.append(f"{where}: imports private names {names} from {module}")
    assert problems == [], "\n".join(problems)


#: What a plugin outside hookdet imports of it: the faces, nothing behind them.
FACES = {"hookdet", "hookdet.plugin", "hookdet.pytorch"}


def third_party_plugin_sources() -> List[Path]:
    """Plugins written outside hookdet: the contrib packages (their tests aside) and the
    third-party packages the tests install."""
    fixtures = [
        path for name in ("hookdet-replacements", "hookdet-flatfs", "hookdet-sample-plugin")
        for path in sorted((REPO / "tests" / "fixtures" / name).glob("*.py")) if path.name != "setup.py"
    ]
    return [path for path in plugin_sources() if BUILTINS not in path.parents] + fixtures


def test_plugins_outside_hookdet_import_only_its_faces() -> None:
    """A stranger's plugin needs ``hookdet.plugin`` (and ``hookdet.pytorch`` for trial types),
    never a module behind them: what is not on a face may change without notice."""
    problems = [
        f"{relative(path)}:{line}: imports {module}"
        for path in third_party_plugin_sources()
        for line, module, _ in imported_modules(ast.parse(path.read_text(encoding="utf-8")))
        if module.split(".")[0] == "hookdet" and module not in FACES
    ]
    assert len(third_party_plugin_sources()) >= 4
    assert problems == [], "\n".join(problems)


def test_builtin_plugins_import_only_the_faces_too() -> None:
    """hookdet's own plugins are held to the face a stranger gets: ``hookdet.plugin`` (and the
    trial's ``hookdet.pytorch``), the checkpoint plugin also ``hookdet.plugin.checkpoint``, and
    their own package; nothing behind them."""
    problems = []
    for path in sorted(BUILTINS.rglob("*.py")):
        top = path.relative_to(BUILTINS).parts[0]
        own = f"hookdet.plugins.builtin.{top[:-3] if top.endswith('.py') else top}"
        allowed = FACES | ({"hookdet.plugin.checkpoint"} if own.endswith(".checkpoint") else set())
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, module, _ in imported_modules(tree):
            if module.split(".")[0] == "hookdet" and module not in allowed and not (
                    module == own or module.startswith(own + ".")):
                problems.append(f"{relative(path)}:{line}: imports {module}")
        in_a_package = path.parent != BUILTINS  # only there does ``from .x`` stay in the plugin
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and (node.level > 1 or not in_a_package):
                problems.append(f"{relative(path)}:{node.lineno}: a relative import out of its plugin")
    assert problems == [], "\n".join(problems)


def test_every_name_of_the_plugin_face_resolves() -> None:
    """Each name ``hookdet.plugin`` offers (those resolved on first use too) is there."""
    import hookdet.plugin as face

    missing = [name for name in face.__all__ if getattr(face, name, None) is None]
    assert missing == []


def test_host_modules_import_no_builtin_plugin() -> None:
    problems = [
        f"{relative(path)}:{line}: imports {module}"
        for path in host_sources()
        for line, module, _ in imported_modules(ast.parse(path.read_text(encoding="utf-8")))
        if module.startswith("hookdet.plugins.builtin")
    ]
    assert problems == [], "\n".join(problems)


def test_host_modules_call_no_plugin_by_name() -> None:
    builtins = builtin_names()
    assert {"checkpoint", "amp", "tensorboard", "callbacks"} <= builtins
    problems = []
    for path in host_sources():
        if relative(path) in NAMING_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{relative(path)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                method = node.func.attr
                if method in PLUGIN_METHODS:
                    problems.append(f"{where}: calls .{method}() of a plugin")
                arguments = [a.value for a in node.args if isinstance(a, ast.Constant)]
                if method in ("get", "load", "register", "unregister") and "plugins" in ast.unparse(node.func.value):
                    named = [a for a in arguments if a in builtins]
                    if named:
                        problems.append(f"{where}: asks the plugin manager for {named[0]!r} by name")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                names = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
                if names and names[0] in PLUGIN_METHODS:
                    problems.append(f"{where}: getattr(..., {names[0]!r})")
            if isinstance(node, ast.Compare):
                constants = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                named = [c for c in constants if c in builtins]
                if named:
                    problems.append(f"{where}: compares with the plugin name {named[0]!r}")
    assert problems == [], "host modules reach plugins by name:\n" + "\n".join(problems)


def test_the_loop_uses_only_the_named_context_interface() -> None:
    """core_loop.py reaches into the context only through :mod:`hookdet.loop.loop_interface`."""
    from hookdet.loop import loop_interface

    declared = {
        name
        for protocol in (loop_interface.ContextForLoop, loop_interface.ContextExperimentalForLoop)
        for name in (*protocol.__annotations__, *vars(protocol))
        if name.startswith("_") and not name.startswith("__") and name not in ("_abc_impl", "_is_protocol")
    }
    assert declared == loop_interface.LOOP_MEMBERS
    used = set()
    for node in ast.walk(ast.parse((HOOKDET / "loop" / "core_loop.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = ast.unparse(node.value)
            if base.endswith("context") or base.endswith("context.experimental"):
                used.add(node.attr)
    assert used and used <= loop_interface.LOOP_MEMBERS, used - loop_interface.LOOP_MEMBERS


def test_one_hook_monitor_times_and_wraps_implementations() -> None:
    """Only :mod:`hookdet.plugins.monitor` installs pluggy's call monitoring or swaps a hook
    implementation's function; ``hook_timing`` (and ``HOOKDET_TRACE``) only listen to it."""
    problems = []
    for path in [*host_sources(), *plugin_sources()]:
        if relative(path) == "hookdet/plugins/monitor.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "add_hookcall_monitoring":
                problems.append(f"{relative(path)}:{node.lineno}: add_hookcall_monitoring")
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Attribute) and target.attr == "function" for target in node.targets
            ):
                problems.append(f"{relative(path)}:{node.lineno}: assigns a hook implementation's function")
    assert problems == [], "\n".join(problems)
