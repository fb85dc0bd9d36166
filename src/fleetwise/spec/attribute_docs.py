"""Attribute docstrings of spec classes (the string right after an annotated field), read from one
parse of each module: the field descriptions of the specs' JSON schema.

pydantic's `use_attribute_docstrings` finds the same strings, but on Python < 3.13 it walks the
call stack and tokenizes and parses every class's source again, class by class (about a tenth
of `fleetwise simulate`'s start-up). Here a module's source is parsed once, when its first spec
class is defined, and every class of it is answered from that tree. The rule is pydantic's: in
a class's own body (not nested classes or functions), a string statement directly after an
annotated assignment to a name documents that name, cleaned with `inspect.cleandoc`
(tests/spec/test_attribute_docs.py checks both agree on every spec class).
"""

from __future__ import annotations

import ast
import inspect
import linecache
import sys
import textwrap
from typing import Any

__all__ = ["attribute_docstrings"]

_BY_MODULE: dict[str, dict[str, dict[str, str] | None]] = {}
"""module name -> class qualified name -> field -> docstring (None: the name is defined twice)."""


class _Docs(ast.NodeVisitor):
    """Collects `name -> docstring` from one class body (what pydantic's rule reads)."""

    def __init__(self) -> None:
        self.target: str | None = None
        self.docs: dict[str, str] = {}
        self.previous: type[ast.AST] | None = None

    def visit(self, node: ast.AST) -> Any:
        result = super().visit(node)
        self.previous = type(node)
        return result

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Name):
            self.target = node.target.id

    def visit_Expr(self, node: ast.Expr) -> None:
        value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and self.previous is ast.AnnAssign:
            if self.target:
                self.docs[self.target] = inspect.cleandoc(value.value)
            self.target = None

    def visit_ClassDef(self, node: ast.ClassDef) -> None:  # a nested class documents its own fields
        pass

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        pass

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        pass


def _class_docs(node: ast.ClassDef) -> dict[str, str]:
    visitor = _Docs()
    visitor.generic_visit(node)
    return visitor.docs


_BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)
"""Nodes that can hold a class statement (expressions cannot)."""


def _index(tree: ast.AST, prefix: str, out: dict[str, dict[str, str] | None]) -> None:
    """Every class under `tree` by qualified name (`Outer.Inner`, `f.<locals>.C`)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            name = prefix + node.name
            out[name] = None if name in out else _class_docs(node)
            _index(node, name + ".", out)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            _index(node, f"{prefix}{node.name}.<locals>.", out)
        elif isinstance(node, _BLOCKS):
            _index(node, prefix, out)


def _module_classes(module: str) -> dict[str, dict[str, str] | None]:
    table = _BY_MODULE.get(module)
    if table is None:
        table = {}
        path = getattr(sys.modules.get(module), "__file__", None)
        lines = linecache.getlines(path) if path else []
        if lines:
            try:
                _index(ast.parse("".join(lines)), "", table)
            except SyntaxError:
                table = {}
        _BY_MODULE[module] = table
    return table


def _from_class_source(cls: type) -> dict[str, str]:
    """The slow way, for a class its module's tree cannot name alone: the class's own source."""
    try:
        source = textwrap.dedent("".join(inspect.getsourcelines(cls)[0]))
        node = ast.parse(source if not source.startswith((" ", "\t")) else f"if True:\n{source}").body[0]
    except (OSError, TypeError, SyntaxError):
        return {}
    while not isinstance(node, ast.ClassDef) and getattr(node, "body", None):
        node = node.body[0]  # type: ignore[attr-defined]
    return _class_docs(node) if isinstance(node, ast.ClassDef) else {}


def attribute_docstrings(cls: type) -> dict[str, str]:
    """Field name -> docstring of the fields `cls`'s own body documents ({} without source)."""
    table = _module_classes(cls.__module__)
    if cls.__qualname__ in table:
        found = table[cls.__qualname__]
        return dict(found) if found is not None else _from_class_source(cls)
    return _from_class_source(cls) if table else {}
