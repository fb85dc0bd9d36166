"""`--trace-columns` wherever a trace is read: simulate (--trace or a workload file), plan (a
trace workload) and scenarios --trace; the same mapping as a trace arrival's `columns` key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetwise.cli.main import main
from fleetwise.planner.workload import build_mix
from fleetwise.spec.planning import planning_spec_from_dict
from fleetwise.spec.workload import TraceColumns

MAPPING = "arrival=ts,prompt=input_tokens,output=output_tokens"
N = 60


@pytest.fixture()
def mine(tmp_path) -> Path:
    """A CSV in no registered format: arrivals as timestamps, 0.5 s apart; prompts 300..339 tokens."""
    f = tmp_path / "mine.csv"
    f.write_text("ts,input_tokens,output_tokens,user\n" + "".join(
        f"2024-05-01T12:00:{i // 2:02d}.{5 * (i % 2)}Z,{300 + i},{8 + i % 3},u{i}\n" for i in range(N)))
    return f


def _plan_doc(mine: Path, columns: dict[str, str] | None = None) -> dict:
    arrival: dict = {"kind": "trace", "path": str(mine)}
    if columns:
        arrival["columns"] = columns
    return {"name": "mapped", "model": "llama-3.1-70b", "accelerators": [{"name": "h100-sxm", "max_gpus": 1}],
            "workload": {"rate_rps": 2.0, "arrival": arrival},
            "slo": {"ttft_s": 1.0, "tpot_s": 0.05}, "weight_dtypes": ["bf16"],
            "search": {"max_gpus": 1, "sample_requests": N}}


def test_a_planning_spec_reads_its_trace_through_the_mapping(mine):
    cols = TraceColumns.parse(MAPPING)
    spec = planning_spec_from_dict(_plan_doc(mine, cols.model_dump()))
    mix = build_mix(spec.workload, N)
    assert sorted(mix.prompt.tolist()) == list(range(300, 300 + N))
    assert mix.unit_gaps.mean() == pytest.approx(1.0)


def test_plan_takes_the_flag_for_a_trace_workload(mine, tmp_path, capsys):
    import yaml

    spec = tmp_path / "plan.yaml"
    spec.write_text(yaml.safe_dump(_plan_doc(mine)))
    assert main(["plan", str(spec), "--quiet", "--workers", "1", "--json", "-"]) == 2  # no mapping: unknown format
    err = capsys.readouterr().err
    assert "unknown trace format" in err and "--trace-columns arrival=COL,prompt=COL,output=COL" in err
    # 70B does not fit one H100: infeasible after the workload is read, which is all this checks
    assert main(["plan", str(spec), "--quiet", "--workers", "1", "--json", "-", "--trace-columns", MAPPING]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["workload"]["prompt_mean"] == pytest.approx(300 + (N - 1) / 2)
    assert doc["workload"]["output_mean"] == pytest.approx(sum(8 + i % 3 for i in range(N)) / N)


def test_plan_flag_without_a_trace_workload_is_one_line(tmp_path, capsys):
    assert main(["plan", "--quiet", "--trace-columns", MAPPING]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--trace-columns: the built-in question: workload has a" in err


def test_simulate_reads_a_workload_files_trace_through_flag_or_key(mine, tmp_path, capsys):
    import yaml

    wl = tmp_path / "wl.yaml"
    wl.write_text(yaml.safe_dump({"arrival": {"kind": "trace", "path": str(mine)}}))
    base = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", str(wl), "--quiet"]
    assert main([*base, "--out", str(tmp_path / "a"), "--trace-columns", MAPPING]) == 0
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text(yaml.safe_dump({"arrival": {"kind": "trace", "path": str(mine),
                                                 "columns": TraceColumns.parse(MAPPING).model_dump()}}))
    assert main([*base[:-3], "--workload", str(keyed), "--quiet", "--out", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a["requests_total"] == b["requests_total"] == N and a["ttft_s"] == b["ttft_s"]
    poisson = tmp_path / "poisson.yaml"
    poisson.write_text(yaml.safe_dump({"arrival": {"kind": "poisson", "rate_rps": 1.0}, "num_requests": 5,
                                       "lengths": {"kind": "preset", "name": "sharegpt"}}))
    capsys.readouterr()
    assert main([*base[:-3], "--workload", str(poisson), "--trace-columns", MAPPING, "--out", str(tmp_path / "c")]) == 2
    assert "has a poisson arrival, not a trace" in capsys.readouterr().err


def test_scenarios_replay_a_mapped_trace(mine, tmp_path):
    out = tmp_path / "sc"
    assert main(["scenarios", "--small", "--scenario", "long-short", "--seeds", "1", "--no-fail", "--quiet",
                 "--trace", str(mine), "--trace-columns", MAPPING, "--out", str(out)]) == 0
    doc = json.loads((out / "scenarios.json").read_text())
    assert doc["info"]["long-short"]["workload_source"] == f"override:{mine}"
    for runs in doc["scenarios"]["long-short"].values():
        assert runs[0]["requests"] == N
    assert main(["scenarios", "--small", "--scenario", "long-short", "--quiet", "--trace-columns", MAPPING,
                 "--out", str(out)]) == 2


def test_format_and_columns_together_are_refused(mine):
    from fleetwise.errors import SpecError
    from fleetwise.spec.base import validate
    from fleetwise.spec.workload import TraceArrival

    with pytest.raises(SpecError, match="give either format .* or columns"):
        validate(TraceArrival, {"path": str(mine), "format": "azure", "columns": {"arrival": "ts", "prompt": "a",
                                                                                  "output": "b"}}, "w.yaml")


def _epoch_trace(path: Path, scale: float, start: float = 1_714_564_800.0) -> Path:
    """Arrivals 0.5 s apart from 2024-05-01 12:00 UTC, written in `scale` units per second."""
    path.write_text("ts,input_tokens,output_tokens\n" + "".join(
        f"{(start + 0.5 * i) * scale:.1f},{300 + i},{8 + i % 3}\n" for i in range(N)))
    return path


@pytest.mark.parametrize("scale", [1, 1e3, 1e6, 1e9], ids=["s", "ms", "us", "ns"])
def test_epoch_arrivals_are_read_in_the_unit_their_magnitude_gives(tmp_path, scale):
    from fleetwise.workload.columns import read_mapped

    table = read_mapped(_epoch_trace(tmp_path / "t.csv", scale), TraceColumns.parse(MAPPING))
    assert table.arrival_s.tolist() == pytest.approx([0.5 * i for i in range(N)], abs=1e-6)


@pytest.mark.parametrize("unit,scale", [("s", 1), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)])
def test_an_arrival_unit_in_the_mapping_scales_relative_arrivals(tmp_path, unit, scale):
    from fleetwise.errors import SpecError
    from fleetwise.workload.columns import read_mapped

    f = tmp_path / "rel.csv"
    f.write_text("ts,input_tokens,output_tokens\n" + "".join(f"{250 * i * scale / 1e3:g},300,8\n" for i in range(N)))
    cols = TraceColumns.parse(f"{MAPPING},arrival_unit={unit}")
    assert cols.arrival_unit == unit
    assert read_mapped(f, cols).arrival_s.tolist() == pytest.approx([0.25 * i for i in range(N)], rel=1e-12)
    if unit == "ns":  # as seconds (no unit given) these span over a year: the unit must be given
        with pytest.raises(SpecError, match="over a year as seconds"):
            read_mapped(f, TraceColumns.parse(MAPPING))
    else:  # relative numbers without a unit are seconds, as before
        assert read_mapped(f, TraceColumns.parse(MAPPING)).arrival_s.tolist() == [250 * i * scale / 1e3 for i in range(N)]


def test_arrivals_that_fit_no_unit_are_one_line_errors_naming_the_fix(tmp_path, capsys):
    from fleetwise.errors import SpecError
    from fleetwise.workload.columns import read_mapped

    long = tmp_path / "long.csv"  # 0 .. 5e10: as seconds, over a century; as ms, 1.6 years
    long.write_text("ts,input_tokens,output_tokens\n0,300,8\n50000000000,300,8\n")
    with pytest.raises(SpecError, match=r"column 'ts' spans 5e\+10 in its own unit: over a year as seconds; "
                                        r"give the unit: --trace-columns .*,arrival_unit=ms"):
        read_mapped(long, TraceColumns.parse(MAPPING))
    mixed = _epoch_trace(tmp_path / "mixed.csv", 1e3)
    mixed.write_text(mixed.read_text() + "1714564900,300,8\n")  # one row in seconds among milliseconds
    with pytest.raises(SpecError, match=r"column 'ts' mixes epoch ms \(line 2\) and epoch s \(line 62\)"):
        read_mapped(mixed, TraceColumns.parse(MAPPING))
    stamped = tmp_path / "stamped.csv"
    stamped.write_text("ts,input_tokens,output_tokens\n2024-05-01T12:00:00Z,300,8\n")
    with pytest.raises(SpecError, match=r"arrival_unit=ms applies to numeric arrivals; column 'ts' holds timestamps"):
        read_mapped(stamped, TraceColumns.parse(f"{MAPPING},arrival_unit=ms"))
    assert main(["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", str(long), "--out",
                 str(tmp_path / "o"), "--trace-columns", f"{MAPPING},arrival_unit=min"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "arrival_unit=min: one of s, ms, us, ns" in err


def test_simulate_says_which_unit_it_read_epoch_arrivals_in(tmp_path, capsys):
    trace = _epoch_trace(tmp_path / "ms.csv", 1e3)
    base = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", str(trace), "--quiet"]
    assert main([*base, "--out", str(tmp_path / "a"), "--trace-columns", MAPPING]) == 0
    err = capsys.readouterr().err
    assert f"note: {trace}: column 'ts' read as epoch ms (the magnitude of its values); give arrival_unit" in err
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["requests_total"] == N
    assert main([*base, "--out", str(tmp_path / "b"), "--trace-columns", f"{MAPPING},arrival_unit=ms"]) == 0
    assert "note:" not in capsys.readouterr().err
