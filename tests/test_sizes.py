"""Modules and functions a person can hold: no module in src/ over 600 lines and no function over
60 (issue 27's rule), unless the module's docstring opens with `Kept long:` and the reason."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "fleetwise"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
KEPT = "Kept long:"


def _sources() -> list[tuple[Path, str, ast.Module]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        out.append((path, text, ast.parse(text)))
    return out


def _kept(tree: ast.Module) -> bool:
    doc = ast.get_docstring(tree) or ""
    return doc.startswith(KEPT)


def test_no_module_over_600_lines() -> None:
    long = [f"{p.relative_to(SRC)}: {len(t.splitlines())}" for p, t, tree in _sources()
            if len(t.splitlines()) > MAX_MODULE_LINES and not _kept(tree)]
    assert long == []


def test_no_function_over_60_lines() -> None:
    long = []
    for path, _, tree in _sources():
        if _kept(tree):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}: {n}")
    assert long == []
