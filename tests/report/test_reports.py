"""Each report kind from a small real run: every figure is in the page and beside it, the page is
self-contained, and what it states matches the result document."""

from __future__ import annotations

import base64
import csv
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fleetwise.cli.main import main
from fleetwise.report import document_page, write_report
from fleetwise.report.page import num
from fleetwise.report.plan_report import VERDICT_LOOK
from fleetwise.report.plots import CDF_POINTS, cdf_points
from fleetwise.report.sim_report import fault_spans

ROOT = Path(__file__).resolve().parents[2]
EXTERNAL = [
    re.compile(r"""\b(?:src|href|action|poster|data)\s*=\s*["']?(?!data:|#)[^"'\s>]+""", re.I),
    re.compile(r"url\(\s*['\"]?(?!data:|#)", re.I),
    re.compile(r"@import", re.I),
    re.compile(r"<link\b", re.I),
]


def external_refs(page: str) -> list[str]:
    """Anything the browser would fetch: attributes pointing outside the page, CSS urls, imports."""
    out = []
    for pat in EXTERNAL:
        out += [m.group(0) for m in pat.finditer(page)]
    return out


def figures(page: str) -> dict[str, str]:
    """figure name -> the SVG embedded for it."""
    found = re.findall(r'<figure id="fig-([\w-]+)" data-figure="[\w-]+"><img alt="[^"]*" '
                       r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', page)
    return {name: base64.b64decode(data).decode("utf-8") for name, data in found}


def check_figures(html_path: Path, expected: set[str]) -> dict[str, str]:
    page = html_path.read_text(encoding="utf-8")
    figs = figures(page)
    assert set(figs) == expected
    for name, svg in figs.items():
        assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
        beside = html_path.with_name(f"{html_path.stem}_figures")
        assert (beside / f"{name}.svg").read_text(encoding="utf-8") == svg
        assert (beside / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert external_refs(page) == []
    assert "<script" not in page  # reports are static
    return figs


def test_simulation_report_holds_every_figure_and_the_summary_numbers(sim_run):
    figs = check_figures(sim_run / "report.html",
                         {"latency-by-pool", "latency-by-tenant", "replica-timelines", "routing", "kv-transfers"})
    s = json.loads((sim_run / "summary.json").read_text())
    page = (sim_run / "report.html").read_text()
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert f'<td class="num">{num(s[key]["p99"] * 1e3)}</td>' in page
    assert "SLO 50 ms" in figs["latency-by-pool"]  # the TPOT target line
    for r in s["per_replica"]:
        assert f"<td>{r['name']}</td>" in page and r["name"] in figs["replica-timelines"]
    assert "crash decode-0" in figs["replica-timelines"]  # fault periods are marked
    with (sim_run / "requests.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in s["per_replica"]:  # a PD request's decision counts on its prefill and its decode replica
        mine = Counter(row["decision"] for row in rows if r["name"] in (row["worker"], row["prefill_worker"]))
        assert r["decisions"] == dict(sorted(mine.items())) and sum(mine.values()) > 0
    assert "n=" + str(s["requests_completed"]) in figs["latency-by-pool"]


def test_routing_report_shows_selection_reasons_per_replica_and_safe_mode(routing_run):
    figs = check_figures(routing_run / "report.html",
                         {"latency-by-pool", "latency-by-tenant", "replica-timelines", "routing"})
    s = json.loads((routing_run / "summary.json").read_text())
    periods = s["router"]["safe_mode"]["periods"]
    # The view goes stale at 10 s; safe mode starts once it is older than stale_after_s and ends with the fault.
    assert len(periods) == 1 and 15.0 <= periods[0][0] <= 16.0 and 25.0 <= periods[0][1] <= 26.0
    with (routing_run / "requests.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in s["per_replica"]:  # each replica's decision kinds, as the records say
        mine = Counter(row["decision"] for row in rows if row["worker"] == r["name"])
        assert r["decisions"] == dict(sorted(mine.items()))
    assert {k for r in s["per_replica"] for k in r["decisions"]} == {"least-cost", "safe-mode"}
    for kind in ("least-cost", "safe-mode"):
        assert kind in figs["routing"]
    assert "safe mode (stale fleet view)" in figs["replica-timelines"] and "crash mixed-1" in figs["replica-timelines"]
    page = (routing_run / "report.html").read_text()
    assert f"<td class=\"num\">{num(float(periods[0][0]))}</td>" in page  # the period is listed under the timelines


def test_scenario_report_shows_policies_side_by_side_and_the_verdicts(scenario_run):
    figs = check_figures(scenario_run / "report.html", {"slowdown-policies", "slowdown-replicas"})
    doc = json.loads((scenario_run / "scenarios.json").read_text())
    kinds = set()
    for runs in doc["scenarios"]["slowdown"].values():
        for run in runs:  # every request placed is counted once per replica it ran on (mixed fleet: once)
            assert sum(sum(r["decisions"].values()) for r in run["per_replica"]) == run["requests"]
            kinds |= {k for r in run["per_replica"] for k in r["decisions"]}
    assert kinds and all(k in figs["slowdown-replicas"] for k in kinds)
    page = (scenario_run / "report.html").read_text()
    for v in doc["verdicts"]:
        assert v[4:].replace("'", "&#x27;") in page
    assert page.count('class="pass"') + page.count('class="fail"') == len(doc["verdicts"])


def test_plan_report_holds_ranking_steps_frontier_pd_and_verdict(plan_run):
    doc = json.loads((plan_run / "plan.json").read_text())
    assert {p["kind"] for p in doc["plans"]} == {"colocated", "disaggregated"}
    figs = check_figures(plan_run / "report.html", {"frontier", "pd-ratio", "disaggregation"})
    page = (plan_run / "report.html").read_text()
    for p in doc["plans"]:
        for step in p["explanation"]:
            assert f"<li>{_esc(step)}</li>" in page
    greyed = [c for c in doc["candidates"] if c["reason"]]
    assert page.count('<tr class="grey">') == len(doc["rejected"]) + len(greyed)
    assert doc["disaggregation"]["reason"].replace("'", "&#x27;") in page
    # Every candidate is in the table; the rejected ones are on the frontier, marked by their reason.
    for c in doc["candidates"]:
        assert f"<td>{_esc(c['candidate'])}</td>" in page
    verdicts = {c["verdict"] for c in greyed}
    assert {"not_refined", "over_limits", "not_simulated"} <= verdicts
    for v in verdicts:
        assert VERDICT_LOOK[v][1].replace("&", "&amp;") in figs["frontier"]
    # The P:D ratios tried: the refined PD plan's confirmation and full plan, and the equal-cost split.
    pd = next(p for p in doc["plans"] if p["kind"] == "disaggregated")
    stages = {s["stage"] for s in doc["pd_sweep"] if s["ratio"] == pd["pd_ratio"]}
    assert "full plan at target rate, seed 0" in stages
    split = doc["disaggregation"]["pd_split"]
    assert any(s["stage"] == "equal-cost split" and [s["prefill"], s["decode"]] == split for s in doc["pd_sweep"])
    for s in doc["pd_sweep"]:
        assert (s["passed"] is None) == (s["stage"] == "sized")
    assert "P:D tried" in figs["pd-ratio"] and "equal-cost split" in figs["pd-ratio"]
    assert "interference removed" in figs["disaggregation"] and "transfer cost added" in figs["disaggregation"]


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("'", "&#x27;").replace(
        '"', "&quot;")


def test_report_command_defaults_and_document_reports_match(plan_run, tmp_path, capsys):
    src = tmp_path / "p.json"
    src.write_text((plan_run / "plan.json").read_text())
    assert main(["report", str(src)]) == 0
    assert (tmp_path / "p.html").is_file() and (tmp_path / "p_figures" / "frontier.png").is_file()
    doc = json.loads(src.read_text())
    # The same document gives the same page whether read from a file or held in memory.
    assert document_page(doc).html() == (tmp_path / "p.html").read_text()


@pytest.mark.parametrize("argv,needle", [
    (["report", "missing-dir"], "no such file or directory"),
    (["report", "pyproject.toml"], "not JSON"),
])
def test_bad_report_input_is_one_line_and_exit_2(argv, needle, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_unknown_schema_and_non_html_report_name_are_refused(tmp_path, capsys):
    (tmp_path / "x.json").write_text('{"schema": "other/1"}')
    assert main(["report", str(tmp_path / "x.json")]) == 2
    assert "schema='other/1' is not a fleetwise result" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "x.json"), "-o", str(tmp_path / "r.pdf")]) == 2
    assert "name it like r.html" in capsys.readouterr().err
    with pytest.raises(Exception, match="no summary.json or scenarios.json"):
        write_report(tmp_path, tmp_path / "r.html")


def test_fault_log_becomes_periods():
    log = [{"t_s": 10.0, "fault": 0, "kind": "crash", "phase": "crash", "target": "d-0"},
           {"t_s": 30.0, "fault": 1, "kind": "slowdown", "phase": "start", "target": "p-1"},
           {"t_s": 30.0, "fault": 0, "kind": "crash", "phase": "restart", "target": "d-0"},
           {"t_s": 40.0, "fault": 1, "kind": "slowdown", "phase": "end", "target": "p-1"},
           {"t_s": 60.0, "fault": 2, "kind": "rolling_upgrade", "phase": "drain", "target": "p-0"},
           {"t_s": 61.0, "fault": 2, "kind": "rolling_upgrade", "phase": "down", "target": "p-0"},
           {"t_s": 71.0, "fault": 2, "kind": "rolling_upgrade", "phase": "restart", "target": "p-0"},
           {"t_s": 80.0, "fault": 3, "kind": "crash", "phase": "crash", "target": "d-1"}]
    assert fault_spans(log, 100.0) == [(10.0, 30.0, "crash", "crash d-0"), (30.0, 40.0, "slowdown", "slowdown p-1"),
                                       (61.0, 71.0, "rolling_upgrade", "rolling_upgrade p-0"),
                                       (80.0, 100.0, "crash", "crash d-1")]


def test_cdf_points_are_exact_when_small_and_quantiles_when_large():
    x, y = cdf_points(np.array([3.0, 1.0, np.nan, 2.0]))
    assert x.tolist() == [1.0, 2.0, 3.0] and y.tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])
    big = np.arange(10_000, dtype=float)
    x, y = cdf_points(big)
    assert len(x) == CDF_POINTS and x[0] == 0.0 and x[-1] == 9999.0 and y[-1] == 1.0


def test_disaggregation_breakdown_of_the_kept_default_plan(tmp_path):
    # `fleetwise plan` on the built-in question (kept: the equal-cost comparison needs a plan too big
    # for a test run): colocated vs PD on the same GPUs.
    src = ROOT / "benchmarks/results/report_examples/plan_default.json"
    doc = json.loads(src.read_text())
    figs = check_figures(write_report(src, tmp_path / "plan.html"),
                         {"frontier", "pd-ratio", "disaggregation"})
    dg = doc["disaggregation"]
    svg = figs["disaggregation"]
    assert "interference removed" in svg and "transfer cost added" in svg
    for side in ("colocated", "disaggregated"):
        assert f"{dg[side]['slo_attainment']:.1%} attain." in svg


def test_parquet_only_records_are_refused_with_the_fix(sim_run, tmp_path, capsys):
    (tmp_path / "summary.json").write_text((sim_run / "summary.json").read_text())
    (tmp_path / "requests.parquet").write_bytes(b"PAR1")
    assert main(["report", str(tmp_path)]) == 2
    assert "rerun the simulation with --records csv" in capsys.readouterr().err


def test_an_infeasible_plan_still_shows_every_candidate_tried(plan_run, tmp_path):
    doc = json.loads((plan_run / "plan.json").read_text())
    doc["plans"], doc["infeasible"] = [], "no candidate met the SLO in simulation within the limits"
    for c in doc["candidates"]:
        if c["verdict"] in ("ranked", "demoted"):
            c["verdict"], c["rank"], c["reason"] = "missed_slo", None, "missed the SLO in simulation at the target rate"
    src = tmp_path / "inf.json"
    src.write_text(json.dumps(doc))
    figs = check_figures(write_report(src, tmp_path / "inf.html"), {"frontier", "pd-ratio", "disaggregation"})
    assert VERDICT_LOOK["missed_slo"][1] in figs["frontier"]


def test_drawing_tells_its_progress_figure_by_figure_up_to_one(sim_run, scenario_run, plan_run, routing_run):
    from fleetwise.report import report_page

    for result in (sim_run, scenario_run, plan_run / "plan.json", routing_run):
        got: list[float] = []
        page = report_page(result, progress=got.append)
        n = len(page.figures)
        assert got == pytest.approx([(i + 1) / n for i in range(n)]), result  # the builder said how many


def test_a_run_where_no_request_completed_shows_no_latency_or_cost(tmp_path, recwarn):
    """Every hand-off over a 1 kbit/s KV link outlives its lease: the summary's statistics of no
    requests are zeros, which the report shows as "-", not as latencies of 0 ms and a cost of $0."""
    plan = tmp_path / "slow-link.yaml"
    plan.write_text((ROOT / "examples" / "plans" / "pd-70b.yaml").read_text().replace("gbps: 400 ", "gbps: 0.000001 "))
    out = tmp_path / "run"
    assert main(["simulate", str(plan), "--workload", str(ROOT / "examples" / "workloads" / "poisson-chat.yaml"),
                 "--requests", "5", "--out", str(out), "--report", str(out / "report.html"), "--quiet"]) == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    for name in ("TTFT", "TPOT", "E2E"):
        assert f"<tr><td>{name}</td>" + "<td>-</td>" * 5 + "</tr>" in page
    assert "0/5 requests completed" in page and "lease_expired" in page
    assert '<td>0.0%</td><td class="num">16</td><td class="num">60.8</td><td>-</td></tr>' in page
    assert not [w for w in recwarn if "legend" in str(w.message)]
