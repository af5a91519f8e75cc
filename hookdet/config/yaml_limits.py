"""Bounds on an experiment file's YAML, checked before anything is built from it.

A few hundred bytes of YAML can describe a billion items through aliases (each ``*a`` repeating
an anchored list that itself repeats another), and thousands of nested brackets exhaust Python's
recursion. Experiment files are small: :func:`check_text` refuses a file over :data:`MAX_BYTES`
(it is copied into every checkpoint's metadata); :class:`BoundedNesting` refuses nesting deeper
than :data:`MAX_DEPTH` while scanning and composing, and :func:`check_expanded_size` refuses a
document whose aliases would expand beyond :data:`MAX_EXPANDED_NODES` nodes, counted on the node
graph without expanding it. Both raise ``yaml.MarkedYAMLError`` at the offending line, so the config loader
reports them as it reports any malformed YAML: one line naming the file and the line.
"""
from __future__ import annotations

from typing import Dict

import yaml

#: Deepest nesting of mappings and sequences accepted (Determined's files nest under 10).
MAX_DEPTH = 100
#: Most nodes a document may hold once every alias is expanded.
MAX_EXPANDED_NODES = 100_000
#: Largest experiment file accepted: its content is copied into every checkpoint's metadata.
MAX_BYTES = 1 << 20


class YamlLimitError(yaml.MarkedYAMLError):
    """The document exceeds a bound; the message says which and where."""


class BoundedNesting:
    """A mix-in for a PyYAML loader: refuse nesting deeper than :data:`MAX_DEPTH`.

    Flow collections (``[...]``, ``{...}``) are counted by the scanner as it opens them, so a
    deep one is refused before PyYAML's look-ahead over possible keys (quadratic in the depth)
    gets far; block nesting is counted by the composer. Brackets inside quoted strings, block
    scalars and comments are text to the scanner, not nesting.
    """

    _depth = 0

    def fetch_flow_collection_start(self, TokenClass):  # type: ignore[no-untyped-def]
        super().fetch_flow_collection_start(TokenClass)  # type: ignore[misc]
        if self.flow_level > MAX_DEPTH:  # type: ignore[attr-defined]
            raise _too_deep(self.tokens[-1].start_mark)  # type: ignore[attr-defined]

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _too_deep(self.peek_event().start_mark)  # type: ignore[attr-defined]
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._depth -= 1


def _too_deep(mark: yaml.Mark) -> YamlLimitError:
    return YamlLimitError(
        problem=f"nested more than {MAX_DEPTH} levels deep; an experiment file never is", problem_mark=mark
    )


def too_large(size: int) -> str:
    """Why a file of ``size`` bytes is refused."""
    return (
        f"the file is {size:,} bytes, over the {MAX_BYTES:,} an experiment file may have "
        "(it is copied into every checkpoint); keep data out of it"
    )


def check_text(text: str) -> None:
    """Refuse text over :data:`MAX_BYTES` before parsing it."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_BYTES:
        raise YamlLimitError(problem=too_large(size), problem_mark=yaml.Mark("<file>", 0, 0, 0, None, None))


def check_expanded_size(root: yaml.Node) -> None:
    """Refuse ``root`` if expanding its aliases gives more than :data:`MAX_EXPANDED_NODES` nodes."""
    sizes: Dict[int, int] = {}
    # Children before parents, without recursion: the graph is acyclic (PyYAML refuses
    # recursive aliases) but may share a node many times.
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        if not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        size = 1 + sum(sizes[id(child)] for child in children)
        if size > MAX_EXPANDED_NODES:
            raise YamlLimitError(
                problem=(
                    f"expands to more than {MAX_EXPANDED_NODES:,} items through its aliases "
                    "(an alias bomb?); an experiment file never does"
                ),
                problem_mark=node.start_mark,
            )
        sizes[id(node)] = size
