"""One vocabulary on the command line: docs/cli.md is what the parsers say, a flag name shared by
commands means one thing and takes one kind of value, renamed flags keep their old spelling."""

from __future__ import annotations

import sys
from pathlib import Path

from fleetwise.cli.doc_cmd import SHARED_FLAGS, commands, options, renamed, render, takes_value
from fleetwise.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_docs_cli_md_is_generated_from_the_current_parsers():
    assert (ROOT / "docs/cli.md").read_text(encoding="utf-8") == render(), \
        "docs/cli.md is stale: run `fleetwise cli-doc -o docs/cli.md`"


def test_a_shared_flag_name_has_one_declared_meaning_and_one_kind_of_value():
    users: dict[str, list[tuple[str, object]]] = {}
    for prog, parser in commands():
        for a in options(parser):
            for o in a.option_strings:
                if o.startswith("--"):
                    users.setdefault(o, []).append((prog, a))
    shared = {f: us for f, us in users.items() if len(us) > 1}
    assert sorted(shared) == sorted(SHARED_FLAGS), "declare each shared flag's meaning in SHARED_FLAGS, once"
    for flag, us in shared.items():
        kinds = {(takes_value(a), getattr(a.type, "__name__", None)) for _, a in us}  # type: ignore[arg-type]
        assert len(kinds) == 1, f"{flag} takes different values in {[p for p, _ in us]}: {kinds}"
        choices = {tuple(a.choices) for _, a in us if a.choices is not None}  # type: ignore[attr-defined]
        assert len(choices) <= 1, f"{flag} accepts different choices: {choices}"
    # the names the issue found meaning two things now mean one
    assert "--dtype" not in users and "--time-scale" in SHARED_FLAGS
    assert "fleetwise simulate" not in [p for p, _ in users["--time-scale"]]  # there it was the arrival stretch
    assert [p for p, _ in users["--records"]] == ["fleetwise ledger verify"]


def test_renamed_flags_keep_working_and_say_the_new_name(capsys):
    parser = build_parser()
    base = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", __file__, "--out", "x"]
    pairs = [(["fit", "--model", "m", "--gpu", "g", "--dtype", "fp8"],
              ["fit", "--model", "m", "--gpu", "g", "--weight-dtype", "fp8"]),
             ([*base, "--time-scale", "2", "--records", "parquet", "--trace-requests", "0:5"],
              [*base, "--arrival-stretch", "2", "--records-format", "parquet", "--trace-events-requests", "0:5"]),
             ([*base, "--trace-window", "1:2"], [*base, "--trace-events-window", "1:2"]),
             (["report", "r", "--out", "a.html"], ["report", "r", "-o", "a.html"]),
             (["gateway", "--model", "a", "--model", "b"], ["gateway", "--served-model-name", "a",
                                                            "--served-model-name", "b"])]
    for old, new in pairs:
        assert vars(parser.parse_args(old)) == vars(parser.parse_args(new))
    lines = capsys.readouterr().err.splitlines()
    assert "fleetwise fit: --dtype is deprecated, use --weight-dtype (same meaning)" in lines
    assert "fleetwise simulate: --time-scale is deprecated, use --arrival-stretch (same meaning)" in lines
    assert len(lines) == 8  # one line per old spelling used
    assert ("--records", "--records-format") in renamed(next(p for n, p in commands() if n == "fleetwise simulate"))


def test_parquet_records_without_pyarrow_is_one_line_saying_how_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed: importing it raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    rc = main(["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload",
               str(ROOT / "examples/workloads/poisson-chat.yaml"), "--requests", "5", "--out", str(tmp_path / "o"),
               "--records-format", "parquet", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert err == ("fleetwise simulate: error: --records-format parquet: Parquet records need pyarrow, which is not "
                   "installed; install it with `pip install 'fleetwise[parquet]'` (or `pip install pyarrow`), "
                   "or write CSV")
    assert not (tmp_path / "o" / "requests.csv").exists()  # nothing silently written instead


def test_plan_json_switch_and_the_older_json_file_spelling():
    parser = build_parser()
    assert parser.parse_args(["plan", "--json"]).json_out == "-"
    assert parser.parse_args(["plan", "--json", "out.json"]).json_out == "out.json"  # run() maps it to -o
    assert parser.parse_args(["plan", "-o", "out.json"]).output == "out.json"
