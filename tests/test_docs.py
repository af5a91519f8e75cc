"""The documentation in ``docs/`` says what the code does.

- ``docs/hooks.md`` documents exactly the hooks of ``hookdet/plugins/hookspecs.py``: one ``### `name(args)```
  heading per spec, with the spec's arguments, its kind (firstresult or broadcast, per batch or
  not) and its ranks (chief only or every rank).
- Every ``hookdet ...`` command in a code block (of ``docs/`` and the examples' READMEs) names a
  real subcommand and parses with the real argument parser; every plugin named in a YAML
  ``plugins:`` list is an entry point (installed, declared by a package under ``plugins-contrib/``,
  or declared in a TOML block of the same page).
- Relative links resolve; the checkpoint-format tables list exactly the keys a real checkpoint
  has; the plugin and test code of ``writing-plugins.md`` run as printed.
"""
from __future__ import annotations

import inspect
import re
import shlex
import sys
import tomllib
import types
from pathlib import Path
from typing import Any, Dict, Iterator, List, NamedTuple, Set, Tuple

import pytest
import yaml

from hookdet import pytorch

from hookdet.plugins import hookspecs
from hookdet.checkpoints.format import load_state, read_metadata
from hookdet.checkpoints.lookup import resolve_checkpoint_dir
from hookdet.cli.commands import build_parser
from hookdet.plugins.manager import ENTRY_POINT_GROUP, installed_plugins
from tests.support.trials import OneWeightTrial

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
REQUIRED_PAGES = (
    "hooks.md",
    "writing-plugins.md",
    "migrating-from-determined.md",
    "checkpoint-format.md",
    "exact-resume.md",
    "multi-node.md",
)
SHELL_LANGUAGES = ("", "bash", "sh", "shell", "console", "text")

SPECS = {
    name: function
    for name, function in vars(hookspecs).items()
    if inspect.isfunction(function) and hasattr(function, "hookdet_spec")
}


# ---------------------------------------------------------------------------------------------
# Parsing Markdown
# ---------------------------------------------------------------------------------------------


class CodeBlock(NamedTuple):
    page: str
    line: int
    language: str
    text: str


def pages() -> List[Path]:
    """The documentation pages, and each example's README (they show commands too)."""
    return sorted(DOCS.glob("*.md")) + sorted((REPO / "examples").glob("*/README.md"))


def code_blocks(path: Path) -> List[CodeBlock]:
    """Fenced code blocks (```lang ... ```) of a Markdown file, with their first line number."""
    blocks: List[CodeBlock] = []
    language, start, lines = None, 0, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fence = re.match(r"^\s*```(\S*)\s*$", line)
        if fence and language is None:
            language, start, lines = fence.group(1), number, []
        elif fence and language is not None:
            page = path.relative_to(REPO).as_posix()
            blocks.append(CodeBlock(page, start, language, "\n".join(lines)))
            language = None
        elif language is not None:
            lines.append(line)
    assert language is None, f"{path.relative_to(REPO)}:{start}: unclosed code block"
    return blocks


def prose(path: Path) -> str:
    """The page without its code blocks (headings inside a code block are not headings)."""
    return re.sub(r"^\s*```.*?^\s*```\s*$", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)


class HookSection(NamedTuple):
    arguments: List[str]
    body: str


def hook_sections() -> Dict[str, HookSection]:
    """``### `name(args)``` sections of hooks.md, by hook name."""
    text = prose(DOCS / "hooks.md")
    sections: Dict[str, HookSection] = {}
    parts = re.split(r"^(#{1,3} .*)$", text, flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2]):
        match = re.fullmatch(r"### `(\w+)\((.*)\)`\s*", heading)
        if match is None:
            assert not heading.startswith("### `"), f"hooks.md: malformed hook heading {heading!r}"
            continue
        name, arguments = match.groups()
        assert name not in sections, f"hooks.md documents {name} twice"
        sections[name] = HookSection([a.strip() for a in arguments.split(",") if a.strip()], body)
    return sections


def field(section: HookSection, name: str) -> str:
    match = re.search(rf"^- \*\*{name}\*\*: (.+)$", section.body, flags=re.M)
    assert match is not None, f"no **{name}** line"
    return match.group(1)


def table_keys(path: Path, heading: str) -> Dict[str, str]:
    """First-column backticked keys of the table under ``## heading``, with their rows."""
    text = prose(path)
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match is not None, f"{path.name} has no section '## {heading}'"
    return {key: row for row, key in re.findall(r"^(\| `([\w.]+)` \|.*)$", match.group(1), flags=re.M)}


# ---------------------------------------------------------------------------------------------
# hooks.md against hookspecs.py
# ---------------------------------------------------------------------------------------------


def test_the_docs_pages_exist() -> None:
    for page in REQUIRED_PAGES:
        assert (DOCS / page).is_file(), f"docs/{page} is missing"


def test_hooks_md_documents_exactly_the_specs() -> None:
    documented = set(hook_sections())
    assert sorted(set(SPECS) - documented) == [], "hooks in hookspecs.py missing from docs/hooks.md"
    assert sorted(documented - set(SPECS)) == [], "hooks in docs/hooks.md that hookspecs.py does not have"


def test_hooks_md_arguments_match_the_specs() -> None:
    for name, section in hook_sections().items():
        if name in SPECS:
            assert section.arguments == list(inspect.signature(SPECS[name]).parameters), name


def test_hooks_md_kinds_match_the_specs() -> None:
    for name, section in hook_sections().items():
        if name not in SPECS:
            continue
        kind = field(section, "Kind")
        firstresult = SPECS[name].hookdet_spec["firstresult"]
        assert kind.startswith("firstresult" if firstresult else "broadcast"), f"{name}: {kind}"
        assert ("*per batch*" in kind) == (name in hookspecs.PER_BATCH_HOOKS), f"{name}: {kind}"


def test_hooks_md_ranks_match_the_specs() -> None:
    chief_only = {name for name, spec in SPECS.items() if "chief only" in (inspect.getdoc(spec) or "").lower()}
    assert set(hookspecs.CHIEF_ONLY_HOOKS) <= chief_only
    for name, section in hook_sections().items():
        if name not in SPECS:
            continue
        ranks = field(section, "Ranks")
        assert ranks.startswith("chief only") == (name in chief_only), f"{name}: {ranks}"
        assert ranks.startswith(("chief only", "every rank")), f"{name}: {ranks}"
        assert field(section, "Fires")


def test_hooks_md_loop_map_shows_every_hook() -> None:
    (loop_map,) = [block for block in code_blocks(DOCS / "hooks.md") if "on_trial_startup(" in block.text]
    missing = [name for name in SPECS if name not in loop_map.text]
    assert missing == [], f"the loop map in docs/hooks.md does not show {missing}"


# ---------------------------------------------------------------------------------------------
# Commands, plugin names and links in every page
# ---------------------------------------------------------------------------------------------


def shell_commands(block: CodeBlock) -> Iterator[Tuple[int, List[str]]]:
    """``hookdet`` invocations in a shell-like block: (line, arguments after ``hookdet``).

    Lines starting with ``hookdet `` (after a ``$`` prompt) and ``... -m hookdet ...`` forms,
    backslash continuations joined, ``#`` comments dropped.
    """
    text = block.text.replace("\\\n", " ")
    for offset, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        tokens = shlex.split(line, comments=True) if ("hookdet" in line) else []
        if tokens[:1] == ["hookdet"]:
            yield block.line + offset, tokens[1:]
        elif "-m" in tokens:
            position = tokens.index("-m")
            if tokens[position + 1 : position + 2] == ["hookdet"]:
                yield block.line + offset, tokens[position + 2 :]


def test_hookdet_commands_in_the_docs_are_real() -> None:
    parser = build_parser()
    subcommands = set(next(a for a in parser._actions if a.dest == "command").choices)
    found = 0
    for path in pages():
        for block in code_blocks(path):
            if block.language not in SHELL_LANGUAGES:
                continue
            for line, arguments in shell_commands(block):
                where = f"{block.page}:{line}: hookdet {' '.join(arguments)}"
                assert arguments and arguments[0] in subcommands, f"{where}: no such subcommand"
                try:
                    parser.parse_args(arguments)
                except SystemExit:
                    pytest.fail(f"{where}: the hookdet argument parser rejects it")
                found += 1
    assert found >= 10, "the docs should show how to run hookdet"


def declared_entry_points(toml_text: str) -> Set[str]:
    data = tomllib.loads(toml_text)
    return set(data.get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))


def contrib_plugin_names() -> Set[str]:
    names: Set[str] = set()
    for pyproject in (REPO / "plugins-contrib").glob("*/pyproject.toml"):
        names |= declared_entry_points(pyproject.read_text(encoding="utf-8"))
    return names


def test_plugin_names_in_yaml_blocks_are_entry_points() -> None:
    known = set(installed_plugins()) | contrib_plugin_names()
    lists = 0
    for path in pages():
        blocks = code_blocks(path)
        here = known | {
            name for block in blocks if block.language == "toml" for name in declared_entry_points(block.text)
        }
        for block in blocks:
            if block.language not in ("yaml", "yml"):
                continue
            try:
                content = yaml.safe_load(block.text)
            except yaml.YAMLError as error:
                pytest.fail(f"{block.page}:{block.line}: the YAML block does not parse: {error}")
            if not isinstance(content, dict) or "plugins" not in content:
                continue
            lists += 1
            for entry in content["plugins"]:
                name = entry[len("no:"):] if entry.startswith("no:") else entry.lstrip("+")
                assert name in here, f"{block.page}:{block.line}: plugin {name!r} is not an entry point"
    assert lists >= 2


def test_relative_links_resolve() -> None:
    for path in pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(path)):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            assert (path.parent / target.split("#")[0]).exists(), f"{path.relative_to(REPO)}: broken link {target}"


# ---------------------------------------------------------------------------------------------
# checkpoint-format.md against a real checkpoint
# ---------------------------------------------------------------------------------------------


def test_checkpoint_format_tables_match_a_real_checkpoint(tmp_path: Path) -> None:
    hparams: Dict[str, Any] = {"lr": 0.1, "records": 4, "global_batch_size": 1}
    with pytorch.init(hparams=hparams, exp_conf={"plugins": {"only": ["callbacks", "checkpoint"]}}, run_dir=tmp_path) as context:
        trial = OneWeightTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(3), validation_period=pytorch.Batch(3))
    directory = resolve_checkpoint_dir(tmp_path)
    page = DOCS / "checkpoint-format.md"
    for heading, actual in (
        ("`state_dict.pth`", set(load_state(directory))),
        ("`metadata.json`", set(read_metadata(directory))),
    ):
        documented = table_keys(page, heading)
        assert sorted(actual - set(documented)) == [], f"{heading} keys missing from checkpoint-format.md"
        required = {key for key, row in documented.items() if "optional" not in row}
        assert sorted(required - actual) == [], f"checkpoint-format.md documents {heading} keys a checkpoint lacks"
    text = page.read_text(encoding="utf-8")
    for entry in read_metadata(directory)["files"].values():
        for key in entry:
            assert f"`{key}`" in text, f"manifest entry field {key!r} is undocumented"
    trial_state = load_state(directory)["trial_state"]
    row = table_keys(page, "`state_dict.pth`")["trial_state"]
    assert [key for key in trial_state if f"`{key}`" not in row] == []


# ---------------------------------------------------------------------------------------------
# writing-plugins.md: its code runs as printed
# ---------------------------------------------------------------------------------------------


def python_block(first_line: str) -> str:
    blocks = [
        block.text
        for block in code_blocks(DOCS / "writing-plugins.md")
        if block.language == "python" and block.text.splitlines()[0].strip() == first_line
    ]
    assert len(blocks) == 1, f"writing-plugins.md should have one python block starting {first_line!r}"
    return blocks[0]


def test_writing_plugins_example_package_and_its_tests_run(tmp_path: Path) -> None:
    package = types.ModuleType("csv_metrics")
    package.__path__ = []  # a package, so "csv_metrics.plugin" can be imported from it
    plugin_module = types.ModuleType("csv_metrics.plugin")
    exec(compile(python_block("# csv_metrics/plugin.py"), "csv_metrics/plugin.py", "exec"), plugin_module.__dict__)
    package.plugin = plugin_module
    saved = {name: sys.modules.get(name) for name in ("csv_metrics", "csv_metrics.plugin")}
    sys.modules.update({"csv_metrics": package, "csv_metrics.plugin": plugin_module})
    try:
        tests: Dict[str, Any] = {"__name__": "test_plugin"}
        exec(compile(python_block("# tests/test_plugin.py"), "tests/test_plugin.py", "exec"), tests)
        test_functions = [function for name, function in tests.items() if name.startswith("test_")]
        assert len(test_functions) >= 2
        for index, function in enumerate(test_functions):
            directory = tmp_path / str(index)
            directory.mkdir()
            function(directory)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module

    (pyproject,) = [
        block.text for block in code_blocks(DOCS / "writing-plugins.md")
        if block.language == "toml" and "[project]" in block.text
    ]
    target = tomllib.loads(pyproject)["project"]["entry-points"][ENTRY_POINT_GROUP]["csv_metrics"]
    module_name, _, attribute = target.partition(":")
    assert module_name == "csv_metrics.plugin" and hasattr(plugin_module, attribute)

    with pytest.raises(Exception, match="fliename"):
        plugin_module.CsvMetricsPlugin(options={"fliename": "x.csv"})
    # what hookdet says of the misspelt option when it reads an experiment file naming it
    from hookdet.plugins.options import option_problems

    installed = {"csv_metrics": plugin_module.CsvMetricsPlugin}
    assert option_problems({"csv_metrics": {"fliename": "x.csv", "group": "test"}}, installed.get) == [
        (("csv_metrics", "fliename"), "unknown option 'fliename'; did you mean 'filename'?"),
    ]
    assert option_problems({"csv_metrics": {"group": "test"}}, installed.get) == [
        (("csv_metrics", "group"), "expected one of 'training' or 'validation'; got 'test'"),
    ]


def test_writing_plugins_wrapper_example_times_every_batch(tmp_path: Path) -> None:
    (source,) = [
        block.text for block in code_blocks(DOCS / "writing-plugins.md")
        if block.language == "python" and "class BatchTimer" in block.text
    ]
    namespace: Dict[str, Any] = {}
    exec(compile(source, "BatchTimer", "exec"), namespace)
    timer = namespace["BatchTimer"]()
    hparams: Dict[str, Any] = {"lr": 0.1, "records": 4, "global_batch_size": 1}
    with pytorch.init(hparams=hparams, exp_conf={"plugins": {"only": []}}, run_dir=tmp_path, plugins=[timer]) as context:
        trial = OneWeightTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(3))
    assert timer.seconds > 0
    assert float(trial.model.weight.detach()) != 0.0, "the wrapper returned the trial's result and training went on"
