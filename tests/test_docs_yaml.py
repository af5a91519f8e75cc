"""Every YAML snippet in README.md, docs/, the examples' and contrib plugins' READMEs goes through
the real config loader (a Kubernetes manifest is only parsed): it validates, its ``plugins:`` list resolves, and no ``plugin_config``
block names a plugin the snippet leaves off (or the trial could not switch on)."""
from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
import yaml

from hookdet.config import parse_experiment_config
from hookdet.plugins.selection import unused_plugin_config
from hookdet.loop.trainer import plugin_selection_for
from tests.test_docs import CodeBlock, code_blocks

REPO = Path(__file__).resolve().parent.parent


def markdown_pages() -> List[Path]:
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "examples").glob("*/README.md")),
        *sorted((REPO / "plugins-contrib").glob("*/README.md")),
    ]


def yaml_blocks() -> List[CodeBlock]:
    return [block for page in markdown_pages() for block in code_blocks(page) if block.language in ("yaml", "yml")]


def test_there_are_yaml_snippets_to_check() -> None:
    assert len(yaml_blocks()) >= 5


@pytest.mark.parametrize("block", yaml_blocks(), ids=lambda block: f"{block.page}:{block.line}")
def test_yaml_snippet_loads_through_the_config_loader(block: CodeBlock) -> None:
    content = yaml.safe_load(block.text)
    assert isinstance(content, dict), f"{block.page}:{block.line}: not a mapping"
    if {"apiVersion", "kind"} <= set(content):  # a Kubernetes manifest (docs/search.md's workers)
        assert content["kind"] == "Job" and "hookdet" in str(content["spec"]["template"]), block.text
        return
    config = parse_experiment_config(content, source=f"{block.page}:{block.line}")
    selection = plugin_selection_for(config)
    assert unused_plugin_config(config.plugin_config, selection.names, selection.may_join()) is None
