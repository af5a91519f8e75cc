"""hookdet's modules import each other in layers, never in a circle: the trial API and context,
then the loop, then plugins, then the command line, each readable and testable on its own.

The walk reads every module's source, imports inside functions included (a lazy import is still
a dependency); only imports under ``if TYPE_CHECKING:`` are left out, since they never run.
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
    assert "hookdet.plugin_options" in graph["hookdet.config.reading"]  # imported inside a function
    assert "hookdet.context" not in graph["hookdet.hookspecs"]  # under TYPE_CHECKING only
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_of_hookdet_imports_itself_through_others() -> None:
    assert circles(import_graph()) == []
