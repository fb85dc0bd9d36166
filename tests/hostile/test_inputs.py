"""The shared input layer (`fleetwise.spec.inputs`): every hostile file or body becomes one SpecError line."""

from __future__ import annotations

import json
import math
import time

import pytest
from hostile_cli import ALIAS_BOMB

from fleetwise.errors import SpecError, UnknownNameError, quote
from fleetwise.spec import inputs, output


def _err(fn, *args, **kw) -> str:
    with pytest.raises(SpecError) as info:
        fn(*args, **kw)
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


def test_alias_bomb_is_refused_before_expansion():
    assert len(ALIAS_BOMB) < 500
    t0 = time.process_time()
    msg = _err(inputs.parse_yaml, ALIAS_BOMB, "bomb.yaml")
    assert time.process_time() - t0 < 1.0
    assert msg.startswith("bomb.yaml: expands to more than 200,000 nodes")


def test_recursive_alias_is_refused():
    assert "recursive alias" in _err(inputs.parse_yaml, "a: &a [*a]\n", "r.yaml")


def test_shared_aliases_within_budget_still_load():
    assert inputs.parse_yaml("x: &x [1]\ny: [*x, *x]\n", "ok.yaml") == {"x": [1], "y": [[1], [1]]}
    assert inputs.parse_yaml("b: &b {x: 1}\no:\n  <<: *b\n  x: 2\n", "m.yaml") == {"b": {"x": 1}, "o": {"x": 2}}


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "a:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(500))])
def test_deep_yaml_is_refused_not_recursion_error(text):
    assert "nested more than 64 levels deep" in _err(inputs.parse_yaml, text, "deep.yaml")


def test_deep_json_is_refused_not_recursion_error():
    assert _err(inputs.parse_json, "[" * 100_000 + "]" * 100_000, "body") == \
        "body: nested more than 64 levels deep; flatten the document"
    assert inputs.json_depth('{"a\\"[": [[], {"b": "]]]"}]}') == 3
    assert inputs.parse_json("[" * 64 + "]" * 64, "body") is not None


def test_duplicate_keys_are_refused():
    assert "duplicate key 'model'; give each key once (line 2, column 1)" in _err(inputs.parse_yaml, "model: llama-3.1-8b\nmodel: llama-3.1-405b\n", "p.yaml")
    assert "duplicate key 'a'" in _err(inputs.parse_json, b'{"a": 1, "a": 2}', "b.json")


@pytest.mark.parametrize("doc", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e999}'])
def test_json_non_finite_numbers_are_refused(doc):
    assert "finite" in _err(inputs.parse_json, doc, "b.json")


@pytest.mark.parametrize("doc", ["x: .nan\n", "x: [1, .inf]\n", "x: {y: -.inf}\n", "x: 1.0e+999\n"])
def test_yaml_non_finite_numbers_are_refused_with_their_path(doc):
    msg = _err(inputs.parse_yaml, doc, "n.yaml")
    assert msg.startswith("n.yaml: x") and "is not a finite number" in msg


def test_huge_integer_literals_are_refused():
    assert "5001 digits" in _err(inputs.parse_json, '{"x": 1' + "0" * 5000 + "}", "b")


@pytest.mark.parametrize("data,needle", [
    ("model: x\n".encode("utf-16"), "UTF-16"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary data"),
    (b"a: 1\nb: \xff\xfe\n", "b.yaml:2: byte 0xff at offset 8 is not UTF-8"),
])
def test_undecodable_files_are_refused(tmp_path, data, needle):
    p = tmp_path / "b.yaml"
    p.write_bytes(data)
    assert needle in _err(inputs.read_document, p)


def test_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert inputs.read_document(p) == {"a": 1}


def test_size_limit_is_checked_before_reading(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_bytes(b"a: 1\n" * 1000)
    assert "5,000 bytes is over the 100-byte limit" in _err(inputs.read_document, p, max_bytes=100)
    assert "over the 10-byte limit" in _err(inputs.parse_json, b"[1, 2, 3, 4, 5]", "body", max_bytes=10)


def test_missing_paths_and_directories(tmp_path):
    assert "not found" in _err(inputs.read_document, tmp_path / "nope.yaml")
    assert "is a directory" in _err(inputs.read_document, tmp_path)
    assert "not found" in _err(inputs.read_document, "a\x00b.yaml")
    assert "cannot read" in _err(inputs.read_document, "x" * 5000 + ".yaml")


def test_quote_is_short_for_any_value():
    assert quote("x" * 10_000) == "'" + "x" * 56 + "..."
    assert quote(list(range(10**6))) == "list of 1000000 [0, 1, 2, ...]"
    assert quote(1.5) == "1.5"
    assert len(quote({str(i): i for i in range(10**5)})) <= 60


def test_unknown_name_message_is_short_and_points_to_a_real_command():
    msg = str(UnknownNameError("model", "x" * 8_000_000, ["llama-3.1-8b"]))
    assert len(msg) < 300
    msg = str(UnknownNameError("routing policy", "fastest", ["round-robin", "fleetwise-default"]))
    assert "catalog" not in msg and "known: fleetwise-default, round-robin" in msg


def test_finite_and_whole():
    assert inputs.finite(2, "rate", minimum=0) == 2.0
    assert _err(inputs.finite, math.nan, "rate") == "rate: nan is not a finite number; give a finite value"
    assert _err(inputs.finite, -1.0, "rate", minimum=0) == "rate: must be at least 0, got -1.0"
    assert _err(inputs.finite, 0.0, "rate", strictly_positive=True) == "rate: must be greater than 0, got 0.0"
    assert _err(inputs.finite, True, "rate") == "rate: expected a number, got True"
    assert _err(inputs.finite, "1", "rate") == "rate: expected a number, got '1'"
    assert _err(inputs.finite, 10**400, "rate").startswith("rate: 1000000")
    assert inputs.whole(3, "n", minimum=1) == 3
    for bad in (3.0, "3", True):
        assert _err(inputs.whole, bad, "n").startswith("n: expected a whole number")
    assert "at most 5" in _err(inputs.whole, 6, "n", maximum=5)


def test_strict_json_dumps_never_writes_nan():
    text = output.strict_json_dumps({"a": math.nan, "b": [math.inf, 1.5], "c": (1, 2), 3: -math.inf}, indent=None)
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": [1, 2], "3": None}
    assert "NaN" not in text and "Infinity" not in text


def test_writable_checks(tmp_path):
    (tmp_path / "f").write_text("x")
    assert output.check_writable_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert "exists and is not a directory" in _err(output.check_writable_dir, tmp_path / "f")
    assert "is a file" in _err(output.check_writable_dir, tmp_path / "f" / "sub")
    assert output.check_writable_file(tmp_path / "out.json") == tmp_path / "out.json"
    assert "does not exist" in _err(output.check_writable_file, tmp_path / "missing" / "out.json")
    assert "is a directory" in _err(output.check_writable_file, tmp_path)
    assert output.check_writable_file(tmp_path / "new" / "out.html", make_folders=True) == tmp_path / "new" / "out.html"
    assert "is a file" in _err(output.check_writable_file, tmp_path / "f" / "sub" / "r.html", make_folders=True)
