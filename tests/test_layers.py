"""Layer rules of docs/architecture.md: a package imports only from layers below it.

Parses every module's imports (static, including function-local ones) and checks them against
the layer table, plus the purity rules: no clocks, no global random, no asyncio or HTTP in the
core layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fleetwise"

LAYER = {
    "errors": 0,
    "registry": 0,
    "spec": 0,
    "core": 1,
    "perf": 2,
    "engine": 3,
    "routing": 3,
    "ledger": 2,
    "sim": 4,
    "live": 4,
    "workload": 2,
    "planner": 5,
    "gateway": 5,
    "emulator": 5,
    "report": 6,
    "deploy": 6,
    "cli": 7,
}
SIBLINGS_APART = {("engine", "routing"), ("routing", "engine"), ("planner", "gateway"), ("planner", "emulator"),
                  ("gateway", "planner"), ("emulator", "planner"), ("gateway", "sim"), ("emulator", "sim"),
                  ("live", "sim"), ("sim", "live")}
"""Pairs that must never import each other: a live driver (gateway, emulator, live) never imports
`sim`, and the simulator never imports the live side."""
PURE = {"spec", "core", "perf", "workload", "engine", "routing", "sim"}
FORBIDDEN_IN_PURE = {"asyncio", "threading", "httpx", "starlette", "uvicorn", "random", "socket"}
CLOCK_CALLS = {("time", "time"), ("time", "monotonic"), ("time", "perf_counter"), ("datetime", "now")}
# The simulator reports its own wall-clock duration (`sim_wall_s`); only its runner may read it.
CLOCK_ALLOWED = {"sim/runner.py"}


def modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        yield rel, ast.parse(path.read_text(encoding="utf-8"))


def package_of(rel: Path) -> str:
    return rel.parts[0].removesuffix(".py") if rel.parts[0] != "__init__.py" else ""


def imported(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


CASES = [(rel, tree) for rel, tree in modules() if package_of(rel)]


def layer_violations(rel: Path, tree: ast.AST) -> list[str]:
    """Every import of module `rel` that breaks the layer rules, as messages."""
    pkg = package_of(rel)
    out = []
    for name in imported(tree):
        parts = name.split(".")
        if parts[0] == "fleetwise" and len(parts) > 1:
            target = parts[1]
            if target not in LAYER or target == pkg:
                continue
            if target != "errors" and LAYER[target] >= LAYER[pkg]:
                out.append(f"{rel} (layer {pkg}) imports fleetwise.{target}: a layer may only import layers below it")
            if (pkg, target) in SIBLINGS_APART:
                out.append(f"{rel} imports {target}")
        if pkg in PURE and parts[0] in FORBIDDEN_IN_PURE:
            out.append(f"{rel} ({pkg}) must not import {name}")
    return out


@pytest.mark.parametrize("rel,tree", CASES, ids=[str(r) for r, _ in CASES])
def test_imports_respect_layers(rel, tree):
    assert layer_violations(rel, tree) == []


@pytest.mark.parametrize("pkg", ["gateway", "emulator", "live"])
def test_a_live_driver_importing_the_simulator_is_caught(pkg):
    """The rule the live drivers rely on can fail: importing `sim` from them is a violation;
    the engine driver and the asyncio clock are what they import instead."""
    bad = ast.parse("def f():\n    from fleetwise.sim.runner import simulate\n")
    assert f"{pkg}/x.py imports sim" in layer_violations(Path(pkg) / "x.py", bad)
    good = ast.parse("from fleetwise.engine.driver import EngineDriver\nfrom fleetwise.core.views import WorkerView\n")
    assert layer_violations(Path(pkg) / "x.py", good) == []
    if pkg != "live":
        assert layer_violations(Path(pkg) / "x.py", ast.parse("import fleetwise.live.clock\n")) == []


@pytest.mark.parametrize("rel,tree", CASES, ids=[str(r) for r, _ in CASES])
def test_no_wall_clock_in_pure_layers(rel, tree):
    if package_of(rel) not in PURE or str(rel) in CLOCK_ALLOWED:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert (node.value.id, node.attr) not in CLOCK_CALLS, f"{rel} reads the wall clock"


KNOWN_CIRCLES = {
    frozenset({"sim/fault_kinds", "sim/faults"}),
    frozenset({"sim/recovery", "sim/runner"}),
    frozenset({"planner/disaggregation", "planner/fit", "planner/goodput", "planner/latency",
               "planner/refinement", "planner/simulate", "planner/sizing", "planner/state"}),
}
"""Circles inside a package still being untied (issue 27: the planner's shared vocabulary, the
simulator's fault modules); none may grow and no new one may appear."""


def module_graph(trees: dict[str, ast.AST]) -> dict[str, set[str]]:
    """Module ("pkg/mod") -> the modules of the same package it imports, a type-only import included."""
    graph: dict[str, set[str]] = {m: set() for m in trees}
    for m, tree in trees.items():
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fleetwise."):
                base = node.module.removeprefix("fleetwise.").replace(".", "/")
                names = [f"{base}/{a.name}" if f"{base}/{a.name}" in trees else base for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.removeprefix("fleetwise.").replace(".", "/") for a in node.names]
            graph[m].update(t for t in names if t in trees and t != m and t.split("/")[0] == m.split("/")[0])
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The import circles of `graph`: its strongly connected sets of two or more modules."""
    def reach(start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
    reached = {m: reach(m) for m in graph}
    return {frozenset(k for k in reached[m] if m in reached[k]) for m in graph} - {frozenset({m}) for m in graph}


def test_no_new_import_circle_inside_a_package():
    trees = {str(rel.with_suffix("")).removesuffix("/__init__"): tree for rel, tree in CASES}
    found = circles(module_graph(trees))
    assert found - KNOWN_CIRCLES == set(), "modules of one package import each other"


def test_an_import_circle_is_caught():
    a = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fleetwise.emulator.b import B\n")
    b = ast.parse("from fleetwise.emulator import c, a\n")
    c = ast.parse("from fleetwise.emulator.a import x\n")
    d = ast.parse("from fleetwise.emulator.a import x\nfrom fleetwise.routing.b import y\n")
    trees = {"emulator/a": a, "emulator/b": b, "emulator/c": c, "emulator/d": d, "routing/b": ast.parse("")}
    assert circles(module_graph(trees)) == {frozenset({"emulator/a", "emulator/b", "emulator/c"})}
