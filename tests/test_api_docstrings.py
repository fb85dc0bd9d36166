"""Every public class, function and constant one package uses from another has a docstring, as do
the public methods of those classes: the cross-layer API says what it is for, in the project's
units, and a shared constant says where its value comes from."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "fleetwise"

Defs = dict[str, ast.AST]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package(module: str) -> str:
    """The layer package of a module: `fleetwise.routing.policy` -> `routing`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _public(name: str) -> bool:
    return not name.startswith("_")


def _is_setter(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A property's setter or deleter: its getter carries the docstring."""
    return any(isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter") for d in fn.decorator_list)


def _constants(tree: ast.Module) -> dict[str, bool]:
    """UPPER_CASE module constants -> whether an attribute docstring (a string right after) names them."""
    out = {}
    for i, n in enumerate(tree.body):
        target = n.targets[0] if isinstance(n, ast.Assign) else n.target if isinstance(n, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id.isupper():
            nxt = tree.body[i + 1] if i + 1 < len(tree.body) else None
            out[target.id] = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                and isinstance(nxt.value.value, str)
    return out


def undocumented_api(root: Path) -> list[str]:
    """`module.name` (or `module.Class.method`) of each undocumented definition or UPPER_CASE
    constant another package imports."""
    trees = {module_name(p, root): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(root.rglob("*.py"))}
    defs: dict[str, Defs] = {}
    constants: dict[str, dict[str, bool]] = {}
    reexports: dict[str, dict[str, str]] = {}
    for mod, tree in trees.items():
        defs[mod] = {n.name: n for n in tree.body
                     if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and _public(n.name)}
        constants[mod] = _constants(tree)
        reexports[mod] = {a.asname or a.name: n.module for n in tree.body if isinstance(n, ast.ImportFrom)
                          and n.module in trees for a in n.names}

    def resolve(mod: str, name: str) -> tuple[str, ast.AST] | None:
        for _ in range(4):  # follow re-exports through package __init__ modules
            if name in defs.get(mod, {}):
                return mod, defs[mod][name]
            if name not in reexports.get(mod, {}):
                return None
            mod = reexports[mod][name]
        return None

    missing: set[str] = set()
    for mod, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module in trees):
                continue
            for alias in node.names:
                if package(node.module) != package(mod) and constants[node.module].get(alias.name) is False:
                    missing.add(f"{node.module}.{alias.name}")
                found = resolve(node.module, alias.name)
                if found is None or package(found[0]) == package(mod):
                    continue
                where, d = found
                if ast.get_docstring(d) is None:  # type: ignore[arg-type]
                    missing.add(f"{where}.{alias.name}")
                if isinstance(d, ast.ClassDef):
                    for fn in d.body:
                        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and _public(fn.name) \
                                and not _is_setter(fn) and ast.get_docstring(fn) is None:
                            missing.add(f"{where}.{d.name}.{fn.name}")
    return sorted(missing)


def test_the_cross_layer_api_is_documented():
    assert undocumented_api(SRC) == []


def test_the_check_finds_what_another_package_imports_undocumented(tmp_path):
    root = tmp_path / "fleetwise"
    for pkg in ("core", "sim"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "core" / "api.py").write_text(
        'LIMIT = 3\nSAID = 4\n"""Four."""\n\n'
        'def used(): pass\n\ndef unused(): pass\n\ndef documented():\n    """Said."""\n\n'
        'class Thing:\n    """A thing."""\n\n    def run(self): pass\n\n    @property\n    def x(self):\n'
        '        """Seconds."""\n\n    @x.setter\n    def x(self, v): pass\n\n    def _private(self): pass\n')
    (root / "core" / "__init__.py").write_text("from fleetwise.core.api import used\n")
    (root / "core" / "same.py").write_text("from fleetwise.core.api import unused\n")
    (root / "sim" / "user.py").write_text("from fleetwise.core import used\n"
                                         "from fleetwise.core.api import LIMIT, SAID, Thing, documented\n")
    assert undocumented_api(root) == ["fleetwise.core.api.LIMIT", "fleetwise.core.api.Thing.run",
                                      "fleetwise.core.api.used"]
