"""Every JSON file and `--json` document the tools write is strict JSON: one writer
(`fleetwise.spec.output.write_json` / `strict_json_dumps`), checked here by behaviour and by a
scan of the source that fails when a module writes JSON another way."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hostile_cli import load_strict_json

from fleetwise.cli.scenarios_cmd import dumps as scenarios_dumps
from fleetwise.perf.profile import Profile
from fleetwise.spec.output import strict_json_dumps, write_json

SRC = Path(__file__).resolve().parents[2] / "src" / "fleetwise"
WIRE_PACKAGES = ("emulator", "gateway")
"""Packages that encode HTTP/SSE payloads on the hot path with json.dumps: their values are
request fields already parsed by the strict reader, token text and integer counts, and their
JSON responses go through starlette's JSONResponse, which refuses NaN (allow_nan=False)."""

NON_FINITE = {"a": math.nan, "b": [1.0, math.inf, -math.inf], "c": {"d": np.float64("nan"), "e": np.array([1.5, np.inf])},
              "t": (2.5, float("nan")), 3: "int key"}


def test_strict_json_dumps_writes_null_for_every_non_finite_value():
    doc = load_strict_json(strict_json_dumps(NON_FINITE))
    assert doc == {"a": None, "b": [1.0, None, None], "c": {"d": None, "e": [1.5, None]}, "t": [2.5, None],
                   "3": "int key"}


def test_write_json_is_strict_and_ends_with_a_newline(tmp_path):
    p = write_json(tmp_path / "x.json", NON_FINITE)
    text = p.read_text(encoding="utf-8")
    assert text.endswith("}\n")
    assert "NaN" not in text and "Infinity" not in text
    assert load_strict_json(text)["b"] == [1.0, None, None]


def test_scenarios_document_is_strict():
    text = scenarios_dumps({"series": [1.0, 2.0, 3.0], "p99_s": math.nan, "delta": -math.inf})
    assert load_strict_json(text) == {"series": [1.0, 2.0, 3.0], "p99_s": None, "delta": None}
    assert '"series": [1.0, 2.0, 3.0]' in text  # number lists stay on one line


def test_a_saved_profile_is_strict_and_loads_back(tmp_path):
    prof = Profile(fit={"median_abs_pct": 1.5, "points": 12})
    prof.save(tmp_path / "p.json")
    load_strict_json((tmp_path / "p.json").read_text())
    assert Profile.load(tmp_path / "p.json") == prof  # read back strictly: written numbers keep their types


def _json_writes(tree: ast.AST) -> list[ast.Call]:
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("dump", "dumps") and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "json"):
            out.append(node)
    return out


def _strict(call: ast.Call) -> bool:
    return any(k.arg == "allow_nan" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords)


def test_no_module_writes_json_past_the_strict_writer():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.as_posix() == "spec/output.py" or rel.parts[0] in WIRE_PACKAGES:
            continue
        for call in _json_writes(ast.parse(path.read_text(encoding="utf-8"))):
            if not _strict(call):
                offenders.append(f"{rel}:{call.lineno}")
    assert not offenders, ("json.dump(s) without allow_nan=False; write files with spec.output.write_json and "
                           f"documents with strict_json_dumps: {offenders}")


@pytest.mark.parametrize("bad", ["json.dumps(x)", "json.dump(x, f)", "json.dumps(x, allow_nan=True)"])
def test_the_scan_catches_a_loose_writer(bad):
    assert [c for c in _json_writes(ast.parse(bad)) if not _strict(c)]
    assert not [c for c in _json_writes(ast.parse("json.dumps(x, allow_nan=False)")) if not _strict(c)]


def test_python_json_alone_would_write_invalid_json():
    """Why the writer exists: the standard library writes NaN, which strict parsers refuse."""
    with pytest.raises(AssertionError):
        load_strict_json(json.dumps({"x": math.nan}))


def test_write_json_replaces_a_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    """A reader polling the path sees the old document or the new one, never a part: the new text
    is written beside it and renamed over it, and nothing else is left in the directory."""
    import os

    from fleetwise.spec.output import write_json

    target = tmp_path / "endpoints.json"
    write_json(target, {"replicas": ["a"]})
    inode_before = os.stat(target).st_ino
    write_json(target, {"replicas": ["a", "b"]})
    assert target.read_text() == '{\n  "replicas": [\n    "a",\n    "b"\n  ]\n}\n'
    assert os.stat(target).st_ino != inode_before  # renamed over, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["endpoints.json"]
