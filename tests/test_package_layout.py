"""The package reads in one sitting per piece: modules import each other in layers, never in a
circle (the trial API and context, then the loop, then plugins, then the command line); no
function is over 60 lines but the loop's per-batch path; no module over 500 without its reason.

The import walk reads every module's source, imports inside functions included (a lazy import is
still a dependency); only imports under ``if TYPE_CHECKING:`` are left out, since they never run.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

HOOKDET = Path(__file__).resolve().parents[1] / "hookdet"


def module_name(path: Path) -> str:
    parts = path.relative_to(HOOKDET.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> Dict[str, Set[str]]:
    """Module -> the hookdet modules it imports."""
    modules = {module_name(path): path for path in HOOKDET.rglob("*.py")}
    graph: Dict[str, Set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        type_only = {
            id(inner) for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for statement in node.body for inner in ast.walk(statement)
        }
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_walk_sees_lazy_imports_and_skips_type_only_ones() -> None:
    graph = import_graph()
    assert "hookdet.plugins.options" in graph["hookdet.config.reading"]  # imported inside a function
    assert "hookdet.trial_api.context" not in graph["hookdet.plugins.hookspecs"]  # under TYPE_CHECKING only
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_of_hookdet_imports_itself_through_others() -> None:
    assert circles(import_graph()) == []


#: Functions allowed past :data:`MAX_FUNCTION_LINES`, each with its reason.
LONG_FUNCTIONS = {
    "TrainingLoop._train": "the per-batch path, kept in one function so it makes no call it does not need",
}
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500
#: What a module over :data:`MAX_MODULE_LINES` says in its docstring, followed by its reason.
LONG_MODULE_REASON = "Why one long module:"


def test_no_function_is_over_60_lines_but_the_per_batch_path() -> None:
    long = []
    for path in sorted(HOOKDET.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for parent in ast.walk(tree):
            for node in ast.iter_child_nodes(parent):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{parent.name}.{node.name}" if isinstance(parent, ast.ClassDef) else node.name
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS:
                        long.append(f"{path.relative_to(HOOKDET.parent)}: {name} ({lines} lines)")
    assert long == []


def test_no_module_is_over_500_lines_without_its_reason() -> None:
    unexplained = []
    for path in sorted(HOOKDET.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES and LONG_MODULE_REASON not in (ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{path.relative_to(HOOKDET.parent)} ({len(text.splitlines())} lines)")
    assert unexplained == []
