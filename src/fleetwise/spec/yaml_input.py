"""The YAML side of `fleetwise.spec.inputs`: a SafeLoader that refuses duplicate keys, deep
nesting and alias expansion past a budget. Loaded by `inputs.parse_yaml` on the first YAML
document, so that a process reading only JSON never imports PyYAML; errors become one line there.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from fleetwise.errors import SpecError, quote
from fleetwise.spec.limits import MAX_NESTING_DEPTH, MAX_YAML_NODES


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, deep nesting and alias expansion past a budget."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        self._depth += 1
        try:
            if self._depth > MAX_NESTING_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"nested more than {MAX_NESTING_DEPTH} levels deep (line {mark.line + 1}); "
                                     "flatten the document")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"unhashable key {quote(key)}", key_node.start_mark) from None
                if dup:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {quote(key)}; give each key once", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
"""A number in exponent form (`1e3`, `25.757e9`, `1.5E-3`): a float in YAML 1.2 and JSON, text
under PyYAML's YAML 1.1 rule (which needs a dot and a signed exponent). Tried after the YAML 1.1
resolvers, so what they read as a number or another type is unchanged."""
_BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789."))


def _expanded_nodes(root: Any, where: str) -> int:
    """Nodes of the composed YAML graph with every alias expanded (memoised: linear in the graph);
    SpecError for a recursive alias (a node that contains itself)."""
    memo: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[Any] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for kv in node.value for n in kv]
        if done:
            open_nodes.discard(key)
            memo[key] = min(1 + sum(memo[id(c)] for c in children), MAX_YAML_NODES + 1)
            continue
        if key in memo:
            continue
        if key in open_nodes:
            raise SpecError(f"{where}: line {node.start_mark.line + 1}: a recursive alias (a node that contains "
                            "itself); specs are trees, so remove the self-reference")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children)
    return memo[id(root)]


def load(text: str, where: str) -> Any:
    """The document in YAML `text`, or None; SpecError past the alias budget, `yaml.YAMLError`
    for what is not valid YAML (turned into one line by `inputs.parse_yaml`)."""
    loader = _BoundedLoader(text)  # the reader refuses control characters here
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        n = _expanded_nodes(node, where)
        if n > MAX_YAML_NODES:
            raise SpecError(f"{where}: expands to more than {MAX_YAML_NODES:,} nodes (aliases counted at every "
                            "use); a spec is far smaller, so remove the repeated aliases")
        return loader.construct_document(node)
    finally:
        loader.dispose()
