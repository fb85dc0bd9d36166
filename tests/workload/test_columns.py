"""Traces with their own column names load through `--trace-columns` (CSV and JSONL, seconds or
timestamps); mistakes name the file, line, column and fix; the unknown-format error points to it."""

from __future__ import annotations

import json

import pytest

from fleetwise.cli.main import main
from fleetwise.errors import SpecError
from fleetwise.spec.workload import TraceColumns
from fleetwise.workload.traces import load_trace, read_trace

MAP = TraceColumns(arrival="t", prompt="in", output="out")


def test_csv_with_seconds_loads_sorted_from_zero(tmp_path):
    f = tmp_path / "mine.csv"
    f.write_text("id,t,in,out\na,12.5,100,7\nb,10.0,200,8\nc,11.0,300,9\n")
    reqs = load_trace(f, columns=MAP)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (0.0, 200, 8), (1.0, 300, 9), (2.5, 100, 7)]
    assert read_trace(f, columns=MAP).format == "columns"


def test_jsonl_with_timestamps_loads_to_the_nanosecond(tmp_path):
    f = tmp_path / "mine.jsonl"
    rows = [{"t": "2024-05-01T12:00:03.250Z", "in": 10, "out": 2}, {"t": "2024-05-01T12:00:01.000Z", "in": 20, "out": 3}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reqs = load_trace(f, columns=MAP)
    assert [(r.arrival_s, r.prompt_tokens) for r in reqs] == [(0.0, 20), (2.25, 10)]


@pytest.mark.parametrize("text,msg", [
    ("arrival=t,prompt=in", "missing output"),
    ("arrival=t,prompt=in,output=out,arrival=x", "arrival is given twice"),
    ("when=t,prompt=in,output=out", "expected arrival=COLUMN,prompt=COLUMN,output=COLUMN"),
    ("arrival=,prompt=in,output=out", "expected arrival=COLUMN"),
])
def test_bad_mappings_say_what_is_expected(text, msg):
    with pytest.raises(SpecError, match=msg):
        TraceColumns.parse(text)


def test_bad_rows_name_file_line_and_column(tmp_path):
    f = tmp_path / "bad.csv"
    f.write_text("t,in,out\n0,10,1\n1,-3,1\n")
    with pytest.raises(SpecError, match=r"bad.csv:3: column 'in' must be a non-negative integer, got '-3'"):
        read_trace(f, columns=MAP)
    g = tmp_path / "bad.jsonl"
    g.write_text('{"t": 0, "in": 1, "out": 1}\n{"t": 1, "out": 1}\n')
    with pytest.raises(SpecError, match=r"bad.jsonl:2: field 'in' missing"):
        read_trace(g, columns=MAP)
    h = tmp_path / "miss.csv"
    h.write_text("time,in,out\n0,1,1\n")
    with pytest.raises(SpecError, match=r"missing \['t'\]"):
        read_trace(h, columns=MAP)


def test_unknown_format_error_points_to_the_mapping(tmp_path):
    f = tmp_path / "mine.csv"
    f.write_text("ts,input_tokens,output_tokens\n0,1,1\n")
    with pytest.raises(SpecError, match=r"--trace-columns arrival=COL,prompt=COL,output=COL"):
        read_trace(f)


def test_simulate_replays_a_mapped_trace(tmp_path, capsys):
    f = tmp_path / "mine.csv"
    f.write_text("ts,input_tokens,output_tokens\n" + "".join(f"{i * 0.5},{256 + i},{8}\n" for i in range(20)))
    out = tmp_path / "run"
    assert main(["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", str(f), "--trace-columns",
                 "arrival=ts,prompt=input_tokens,output=output_tokens", "--out", str(out), "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["requests_total"] == 20 and s["requests_completed"] == 20
    assert main(["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", str(f), "--trace-columns",
                 "arrival=ts", "--out", str(out)]) == 2
    assert "missing prompt, output" in capsys.readouterr().err


def test_errors_quote_long_values_short(tmp_path):
    with pytest.raises(SpecError) as bad_flag:
        TraceColumns.parse("arrival=" + "x" * 5000)
    wide = tmp_path / "wide.jsonl"
    wide.write_text(json.dumps({f"field_{i}": i for i in range(2000)}) + "\n")
    with pytest.raises(SpecError) as bad_row:
        load_trace(str(wide), columns=TraceColumns.parse("arrival=t,prompt=p,output=o"))
    for err in (bad_flag.value, bad_row.value):
        assert len(str(err)) < 300 and "..." in str(err)
