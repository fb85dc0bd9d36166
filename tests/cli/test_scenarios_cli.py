"""`fleetwise scenarios`: arguments, output files, verdict printing and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from fleetwise.cli.main import main

REPO = Path(__file__).resolve().parents[2]
SCEN_DIR = REPO / "examples" / "scenarios"


def _tiny_dir(tmp_path: Path) -> Path:
    """A copy of the heterogeneous scenario cut to 150 requests (runs in about a second)."""
    d = tmp_path / "scen"
    d.mkdir()
    text = (SCEN_DIR / "heterogeneous.yaml").read_text().replace("num_requests: 1200", "num_requests: 150")
    (d / "heterogeneous.yaml").write_text(text)
    return d


def test_scenarios_writes_json_markdown_and_verdicts(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["scenarios", "--scenario", "heterogeneous", "--small", "--seeds", "2", "--dir",
               str(_tiny_dir(tmp_path)), "--no-fail", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "scenarios.json").read_text())
    assert doc["default_policy"] == "fleetwise-default"
    assert list(doc["scenarios"]) == ["heterogeneous"]
    runs = doc["scenarios"]["heterogeneous"]
    assert sorted(runs) == ["fleetwise-default", "round-robin"]
    first = runs["round-robin"][0]
    assert {"seed", "ttft_p99_s", "ttft_p50_s", "tpot_p99_s", "goodput_rps", "slo_attainment"} <= set(first)
    assert [r["seed"] for r in runs["fleetwise-default"]] == [0, 1]
    assert first["requests"] == 150
    st = doc["stats"]["heterogeneous"]["fleetwise-default"]
    assert set(st["vs_baseline"]["ttft_p99_s"]) == {"mean", "ci95_lo", "ci95_hi", "n"}
    printed = capsys.readouterr().out
    assert "heterogeneous" in printed and "TTFT p99 s" in printed
    assert [ln for ln in printed.splitlines() if ln.startswith(("PASS", "FAIL"))] == doc["verdicts"]
    assert len(doc["verdicts"]) == 2
    assert (out / "scenarios.md").read_text().startswith("# fleetwise scenarios")


def test_unknown_scenario_and_policy_are_one_line_errors(tmp_path, capsys):
    assert main(["scenarios", "--scenario", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetwise scenarios: error: scenario 'nope'") and err.count("\n") == 1
    assert main(["scenarios", "--policy", "fastest", "--scenario", "heterogeneous", "--small",
                 "--out", str(tmp_path)]) == 2
    assert "unknown routing policy 'fastest'" in capsys.readouterr().err
    assert main(["scenarios", "--trace-rate", "3", "--out", str(tmp_path)]) == 2
    assert "only with --trace" in capsys.readouterr().err


def test_trace_option_replaces_the_workload(tmp_path, capsys):
    trace = tmp_path / "stats.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(f"{300 + 7 * i},{20 + i % 5}\n"
                                                                       for i in range(120)))
    out = tmp_path / "out"
    rc = main(["scenarios", "--scenario", "heterogeneous", "--trace", str(trace), "--trace-rate", "20",
               "--seeds", "2", "--dir", str(_tiny_dir(tmp_path)), "--no-fail", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "scenarios.json").read_text())
    assert doc["info"]["heterogeneous"]["workload_source"] == f"override:{trace}"
    assert [r["requests"] for r in doc["scenarios"]["heterogeneous"]["round-robin"]] == [60, 60]


def test_a_trace_with_fewer_requests_than_seeds_is_refused(tmp_path, capsys):
    trace = tmp_path / "three.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:17:0{i}.0,{100 + i},10\n" for i in range(3)))
    rc = main(["scenarios", "--scenario", "heterogeneous", "--trace", str(trace), "--seeds", "5",
               "--dir", str(_tiny_dir(tmp_path)), "--no-fail", "--out", str(tmp_path / "out")])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"fleetwise scenarios: error: --trace {trace}: 3 requests for --seeds 5: each seed replays its own window "
        "of the trace, so 5 seeds need at least 5 requests; give --seeds 3 or fewer, or a longer trace"]
