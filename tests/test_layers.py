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
    "__main__": 8,
}
SIBLINGS_APART = {("engine", "routing"), ("routing", "engine"), ("planner", "gateway"), ("planner", "emulator"),
                  ("gateway", "planner"), ("emulator", "planner"), ("gateway", "sim"), ("emulator", "sim"),
                  ("live", "sim"), ("sim", "live")}
"""Pairs that must never import each other: a live driver (gateway, emulator, live) never imports
`sim`, and the simulator never imports the live side."""
LEAVES = {"errors", "registry"}
"""Stdlib-only modules every layer may import, L0's `spec` included (docs/architecture.md: spec
"may import `errors`, `registry`")."""
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
            if target not in LEAVES and LAYER[target] >= LAYER[pkg]:
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


def module_name(rel: Path) -> str:
    """`planner/fit.py` -> `fleetwise.planner.fit`; a package's `__init__.py` is the package."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["fleetwise", *parts])


def module_imports(name: str, is_package: bool, tree: ast.AST, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` imports: every static import, function-local and
    TYPE_CHECKING ones included; `from pkg import sub` imports the submodule `pkg.sub` when there
    is one (else the package itself)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return {m for m in out if m in known and m != name}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of `graph` (module -> modules it imports) as one path `a -> ... -> a` per
    strongly connected group of two or more modules."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    circles, done = [], set()
    for m in sorted(graph):
        if m in done or m not in reach[m]:
            continue
        group = {n for n in reach[m] if m in reach[n]}
        done |= group
        circles.append(_path_back(graph, m, group))
    return circles


def _path_back(graph: dict[str, set[str]], start: str, group: set[str]) -> list[str]:
    """A shortest import path from `start` back to itself inside `group`."""
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for m in frontier:
            for n in sorted(graph[m] & group):
                if n == start:
                    path = [m]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if n not in prev:
                    prev[n] = m
                    nxt_frontier.append(n)
        frontier = nxt_frontier
    raise AssertionError(f"{start} is in a circle but no path leads back to it")


def package_graph(pkg: str, sources: dict[Path, ast.AST]) -> dict[str, set[str]]:
    """Imports among the modules of package `pkg` (subpackages included)."""
    names = {module_name(rel): (rel, tree) for rel, tree in sources.items() if package_of(rel) == pkg}
    known = set(names)
    return {n: module_imports(n, rel.name == "__init__.py", tree, known) for n, (rel, tree) in names.items()}


PACKAGES = sorted({package_of(rel) for rel, _ in CASES})


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_import_circle_inside_a_package(pkg):
    """Modules of a package import each other only one way (a type-only circle ties them too)."""
    circles = import_circles(package_graph(pkg, dict(CASES)))
    assert circles == [], "import circle(s): " + "; ".join(" -> ".join(c) for c in circles)


def test_an_import_circle_is_caught_and_named():
    """A type-only and a function-local import close a circle; `from pkg import sub` names the
    submodule, and `from pkg import value` the package's `__init__`, which closes none here."""
    sources = {
        Path("pkg/__init__.py"): ast.parse("VALUE = 1\n"),
        Path("pkg/a.py"): ast.parse("from fleetwise.pkg import b, VALUE\n"),
        Path("pkg/b.py"): ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from fleetwise.pkg.c import C\n"),
        Path("pkg/c.py"): ast.parse("def f():\n    from fleetwise.pkg.a import A\n"),
        Path("pkg/d.py"): ast.parse("from fleetwise.pkg import VALUE\nfrom fleetwise.pkg.a import A\n"),
    }
    graph = package_graph("pkg", sources)
    assert graph["fleetwise.pkg.a"] == {"fleetwise.pkg", "fleetwise.pkg.b"}
    assert graph["fleetwise.pkg.d"] == {"fleetwise.pkg", "fleetwise.pkg.a"}
    assert import_circles(graph) == [["fleetwise.pkg.a", "fleetwise.pkg.b", "fleetwise.pkg.c", "fleetwise.pkg.a"]]
    del sources[Path("pkg/c.py")]
    assert import_circles(package_graph("pkg", sources)) == []
