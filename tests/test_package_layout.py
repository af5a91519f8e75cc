"""The package reads in one sitting per piece: modules import each other in layers
(:data:`LAYERS`: an import up a layer says why), never in a circle; no function is over 60 lines
but the loop's per-batch path; no module over 500 without its reason.

The import walk reads every module's source, imports inside functions included (a lazy import is
still a dependency); only imports under ``if TYPE_CHECKING:`` are left out, since they never run.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

HOOKDET = Path(__file__).resolve().parents[1] / "hookdet"


def module_name(path: Path) -> str:
    parts = path.relative_to(HOOKDET.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> Dict[str, Set[str]]:
    """Module -> the hookdet modules it imports."""
    graph: Dict[str, Set[str]] = {name: set() for name in map(module_name, HOOKDET.rglob("*.py"))}
    for name, target, _ in import_statements():
        graph[name].add(target)
    return graph


def import_statements() -> Iterator[Tuple[str, str, int]]:
    """(module, hookdet module it imports, line of the import statement), for every import of one
    hookdet module by another (inside functions too; not under ``if TYPE_CHECKING:``)."""
    modules = {module_name(path): path for path in HOOKDET.rglob("*.py")}
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
            for target in dict.fromkeys(targets):
                if target in modules and target != name:
                    yield name, target, node.lineno


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


#: hookdet's layers, lowest first: a module imports from its own layer and those below. A module
#: is in the layer of the longest name here that it is, or is inside. An import that runs up a
#: layer says why in a comment ``# up: ...`` on its line (or the line above it).
LAYERS = (
    ("hookdet", "hookdet.markers", "hookdet.exit_codes", "hookdet.errors"),
    # parts that need nothing of hookdet's but the errors: Determined's distributed context, the
    # searchers' spaces and their Go arithmetic, batches, metrics, a process's outcome record
    ("hookdet.distributed.context", "hookdet.distributed.stop_agreement", "hookdet.distributed.store_collectives",
     "hookdet.search.space",
     "hookdet.search.go_math", "hookdet.data", "hookdet.metrics", "hookdet.launch"),
    ("hookdet.config",),
    ("hookdet.checkpoints",),
    ("hookdet.runs",),
    ("hookdet.plugins",),
    ("hookdet.trial_api",),
    ("hookdet.loop", "hookdet.tensorboard"),
    # the faces: Determined's (pytorch, its checkpoint API) and the plugins' own
    ("hookdet.pytorch", "hookdet.checkpoints.api", "hookdet.plugin"),
    ("hookdet.plugins.builtin",),
    ("hookdet.distributed",),
    ("hookdet.search", "hookdet.core", "hookdet.transformers"),
    ("hookdet.ui",),
    # the programs: the command line, the one each rank starts as, torchrun's agent and the ranks it forks
    ("hookdet.cli", "hookdet.__main__", "hookdet.distributed.rank_entry", "hookdet.distributed.torchrun_agent",
     "hookdet.distributed.forked_ranks"),
)
#: What marks an import that runs up a layer, followed by why.
UP = "# up:"


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer."""
    found = [(len(name), index) for index, names in enumerate(LAYERS) for name in names
             if module == name or module.startswith(name + ".")]
    assert found, f"{module} is in no layer of LAYERS"
    return max(found)[1]


def test_modules_import_down_their_layers_and_each_import_up_says_why() -> None:
    unexplained = []
    for module, target, line in import_statements():
        if layer_of(target) <= layer_of(module) or module.startswith(target + "."):
            continue  # down, or the docstring-only package a module is in
        path = HOOKDET.parent / (module.replace(".", "/") + ("/__init__.py" if (HOOKDET.parent / module.replace(".", "/")).is_dir() else ".py"))
        source = path.read_text(encoding="utf-8").splitlines()
        said = [text for text in source[max(line - 2, 0):line] if UP in text and text.split(UP, 1)[1].strip()]
        if not said:
            unexplained.append(f"{path.relative_to(HOOKDET.parent)}:{line}: {module} -> {target}")
    assert unexplained == [], "imports up a layer without a '# up: why' comment:\n" + "\n".join(unexplained)


def test_the_layer_check_sees_an_import_up() -> None:
    assert layer_of("hookdet.cli.commands") > layer_of("hookdet.loop.trainer") > layer_of("hookdet.errors")
    assert layer_of("hookdet.distributed.rank_entry") > layer_of("hookdet.distributed.launcher")
    assert ("hookdet.distributed.rank_entry", "hookdet.cli.commands") in {(m, t) for m, t, _ in import_statements()}


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
