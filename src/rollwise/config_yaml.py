"""Safe YAML loading for run configs: bounded nesting, bounded alias expansion, no duplicate keys.

`yaml.safe_load` is safe against code execution but not against a hostile or mistaken file:

- nesting 10,000 levels deep overflows the recursive composer (a `RecursionError` traceback);
- a few lines of anchors and aliases ("billion laughs") load instantly as shared references and then
  expand exponentially wherever the config is copied, dumped (`--print-config`) or hashed;
- a key given twice silently keeps the last value, so a second `train:` section replaces the first.

`load_yaml(text, source)` refuses each of these with one line that names the file, the line and the
limit (`ConfigYAMLError`, a `ValueError`), before anything is constructed. Anchors, aliases and merge
keys (`<<: *base`) keep working as long as the expanded document stays under `MAX_NODES` nodes and
`MAX_DEPTH` levels. The check walks the composed node graph once, iteratively and memoised by node,
so it costs time linear in the file, not in the expansion.

Left out: limits on scalar length (a config file is read whole anyway) and on the number of documents
(only the first is read; more is a YAML error, as before). Numbers are not checked here: non-finite
floats are refused by the pydantic models (`allow_inf_nan=False`).
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 64
"""Deepest nesting of mappings and sequences, aliases expanded (a real config needs fewer than 10)."""
MAX_NODES = 100_000
"""Most nodes (scalars, lists, mappings) in the document once every alias is expanded."""
_MERGE_TAG = "tag:yaml.org,2002:merge"

__all__ = ["MAX_DEPTH", "MAX_NODES", "ConfigYAMLError", "load_yaml"]


class ConfigYAMLError(ValueError):
    """A config file (or override value) refused while reading YAML; the message is one line."""


class _Refused(yaml.YAMLError):
    """Raised inside the loader; `load_yaml` turns it into a `ConfigYAMLError` naming the source."""

    def __init__(self, problem: str, line: int | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.line = line


class _SafeLoader(yaml.SafeLoader):
    """PyYAML's pure-Python safe loader (the C one composes recursively in C) with the three checks."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        # NOTE: the composer recurses once per nesting level; counting here stops it long before Python's
        # recursion limit, at the first event past the limit, so the error can name its line.
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        # Compared as written (resolved tag + text), before merge keys are flattened into the mapping: keys
        # a merge brings in may be overridden, keys written twice may not.
        first: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:
                continue
            line = key.start_mark.line + 1
            seen = first.get((key.tag, key.value))
            if seen is not None:
                raise _Refused(f"duplicate key {key.value!r} (first at line {seen})", line)
            first[(key.tag, key.value)] = line
        return node

    def get_single_node(self) -> Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


_BOOL_TAG = "tag:yaml.org,2002:bool"
# NOTE: YAML 1.1 (PyYAML's default) reads on/off/yes/no/y/n as booleans, so a documented value such as
# `rollout.speculative.source: off` arrived as False and was refused. Configs follow YAML 1.2 here: only true and
# false are booleans; the other words stay strings (a boolean field still takes "yes" / "no" / "on" / "off").
_SafeLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_SafeLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: Node) -> None:
    """Refuse a node graph whose alias-expanded size or depth is over the limits, or that contains itself.

    Iterative post-order walk over distinct nodes; `size`/`depth` of a node are those of its expansion.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        k = id(node)
        if done:
            on_path.discard(k)
            kids = _children(node)
            size[k] = 1 + sum(size[id(c)] for c in kids)
            depth[k] = 1 + max((depth[id(c)] for c in kids), default=0)
            line = node.start_mark.line + 1
            if size[k] > MAX_NODES:
                raise _Refused(f"aliases expand to more than {MAX_NODES:,} nodes (an alias bomb?)", line)
            if depth[k] > MAX_DEPTH:  # counted as compose_node counts: every node, scalars too, is a level
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels once aliases are expanded", line)
            continue
        if k in size:
            continue
        if k in on_path:
            raise _Refused("an alias refers to itself (a recursive structure)", node.start_mark.line + 1)
        on_path.add(k)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)


def load_yaml(text: str, source: str = "<config>") -> Any:
    """The first YAML document of `text` as Python data.

    Raises `ConfigYAMLError` (one line naming `source`) for the refusals above, and lets PyYAML's own
    `yaml.YAMLError` through for plain syntax errors, which the caller already words.
    """
    loader = _SafeLoader(text)
    try:
        return loader.get_single_data()
    except _Refused as e:
        where = f" at line {e.line}" if e.line is not None else ""
        raise ConfigYAMLError(f"bad config: {source}{where}: {e.problem}") from None
    except RecursionError:  # belt and braces: a construct nested in a way compose_node does not see
        raise ConfigYAMLError(f"bad config: {source}: nested too deeply to read") from None
    finally:
        loader.dispose()
