"""Acceptance scenarios: statistics with exact numbers, the pass rule on hand-made results,
scenario files, and one small seeded run per scenario kind."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from fleetwise.errors import SpecError
from fleetwise.sim import scenarios as sc
from fleetwise.sim.scenario_stats import mean_ci, paired_ci, t_quantile_975

REPO = Path(__file__).resolve().parents[2]
SCEN_DIR = REPO / "examples" / "scenarios"


def test_t_quantiles_match_student_t():
    # NIST/SEMATECH e-Handbook 1.3.6.7.2, critical values of Student's t (six decimals)
    assert t_quantile_975(1) == pytest.approx(12.706205, abs=5e-7)
    assert t_quantile_975(4) == pytest.approx(2.776445, abs=5e-7)
    assert t_quantile_975(30) == pytest.approx(2.042272, abs=5e-7)
    assert t_quantile_975(60) == pytest.approx(2.000298, abs=5e-7)
    assert t_quantile_975(1000) == pytest.approx(1.962339, abs=5e-7)
    with pytest.raises(ValueError):
        t_quantile_975(0)


def test_mean_ci_exact():
    iv = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    half = t_quantile_975(4) * math.sqrt(2.5 / 5)
    assert iv.mean == 3.0 and iv.n == 5
    assert iv.lo == pytest.approx(3.0 - half, abs=1e-12)
    assert iv.hi == pytest.approx(3.0 + half, abs=1e-12)
    assert iv.excludes_zero
    one = mean_ci([7.0])
    assert (one.mean, one.lo, one.hi, one.excludes_zero) == (7.0, None, None, False)


def test_paired_ci_uses_per_seed_differences():
    # the two samples overlap widely, but every seed's difference is -1 +- 0.1
    xs, ys = [1.0, 5.0, 9.0, 13.0], [2.1, 5.9, 10.1, 13.9]
    d = paired_ci(xs, ys)
    assert d.mean == pytest.approx(-1.0)
    assert d.hi is not None and d.hi < 0
    assert not mean_ci(xs).excludes_zero or mean_ci(ys).lo is not None
    with pytest.raises(ValueError):
        paired_ci([1.0], [1.0, 2.0])


def _runs(ttft, good):
    return [{"seed": k, "ttft_p99_s": t, "ttft_p50_s": t / 4, "tpot_p99_s": 0.05, "tpot_p50_s": 0.02,
             "goodput_rps": g, "slo_attainment": 0.9} for k, (t, g) in enumerate(zip(ttft, good, strict=True))]


def test_pass_rule_lines():
    doc = {
        "default_policy": "fleetwise-default",
        "baseline_policy": "round-robin",
        "scenarios": {
            "heterogeneous": {"fleetwise-default": _runs([1.0, 1.1, 0.9], [10, 10, 10]),
                              "round-robin": _runs([2.0, 2.1, 1.9], [10, 10, 10])},
            "long-short": {"fleetwise-default": _runs([1.0, 3.0, 0.5], [10, 10, 10]),
                           "round-robin": _runs([2.0, 2.0, 2.0], [10, 10, 10])},
            "rolling-upgrade": {"fleetwise-default": _runs([9.0, 9.0, 9.0], [9.4, 9.4, 9.4]),
                                "round-robin": _runs([1.0, 1.0, 1.0], [10, 10, 10])},
            "stale-control-plane": {"fleetwise-default": _runs([1.0], [9.6])},
        },
    }
    assert sc.pass_rule(doc) == [
        "PASS heterogeneous: P99 TTFT fleetwise-default - round-robin = -1.000 s [95% CI -1.000, -1.000] over 3 seeds",
        "PASS heterogeneous: goodput fleetwise-default 10.000 vs round-robin 10.000 req/s (+0.0%, floor -5%)",
        "FAIL long-short: P99 TTFT fleetwise-default - round-robin = -0.500 s [95% CI -3.786, 2.786] over 3 seeds"
        " (CI does not exclude zero)",
        "PASS long-short: goodput fleetwise-default 10.000 vs round-robin 10.000 req/s (+0.0%, floor -5%)",
        "FAIL rolling-upgrade: goodput fleetwise-default 9.400 vs round-robin 10.000 req/s (-6.0%, floor -5%)",
        "SKIP stale-control-plane: needs both fleetwise-default and round-robin runs",
    ]


def test_every_scenario_file_loads_and_names_itself():
    for name in sc.SCENARIO_NAMES:
        for small in (False, True):
            s = sc.load_scenario(SCEN_DIR / f"{name}.yaml", small=small)
            assert s.name == name
    with pytest.raises(SpecError, match="known scenarios"):
        sc.load_scenarios(["no-such-scenario"], SCEN_DIR)
    with pytest.raises(SpecError, match="unknown policy"):
        sc.with_baseline(["round-robbin"])
    assert sc.with_baseline(None) == ["fleetwise-default", "round-robin"]


def test_small_overrides_apply():
    full = sc.load_scenario(SCEN_DIR / "slowdown.yaml")
    small = sc.load_scenario(SCEN_DIR / "slowdown.yaml", small=True)
    assert full.spec.workload.num_requests == 4000
    assert small.spec.workload.num_requests == 1600
    assert [(f.start_s, f.end_s) for f in small.spec.faults.faults] == [(8.0, 22.0)]


def test_cache_mix_falls_back_without_the_trace(tmp_path):
    doc = yaml.safe_load((SCEN_DIR / "cache-mix.yaml").read_text())
    doc["workload"]["arrival"]["path"] = "absent/absent_trace.jsonl"
    (tmp_path / "cache-mix.yaml").write_text(yaml.safe_dump(doc))
    s = sc.load_scenario(tmp_path / "cache-mix.yaml", small=True)
    assert s.workload_source == "generated"
    assert s.notes == ("cache-mix: trace absent/absent_trace.jsonl not found; using the generated "
                       "fallback_workload instead",)
    reqs = s.requests(0)
    assert len(reqs) == 1200
    assert any(len(r.block_hashes) > 0 for r in reqs)


def test_trace_windows_differ_per_seed(tmp_path):
    """Each seed replays its own window of the scenario's trace: a generated Mooncake-format trace
    (seeded, an hour of timestamps in ms) stands in for the public one, which is not shipped."""
    rng = np.random.default_rng(7)
    rows = [{"timestamp": 900 * i, "input_length": int(rng.integers(100, 8000)),
             "output_length": int(rng.integers(10, 800)), "hash_ids": [3 * i, 3 * i + 1]} for i in range(4000)]
    trace = tmp_path / "conversation_trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = yaml.safe_load((SCEN_DIR / "cache-mix.yaml").read_text())
    doc["workload"]["arrival"]["path"] = str(trace)
    (tmp_path / "cache-mix.yaml").write_text(yaml.safe_dump(doc))
    s = sc.load_scenario(tmp_path / "cache-mix.yaml", small=True)
    assert s.workload_source.startswith("trace:") and s.notes == ()
    a, b = s.requests(0), s.requests(1)
    assert len(a) == len(b) == 700
    assert [r.prompt_tokens for r in a[:20]] != [r.prompt_tokens for r in b[:20]]


def test_trace_override_replaces_the_workload(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n" + "\n".join(
        f"{100 + i},{10 + i % 7}" for i in range(40)) + "\n")
    s = sc.load_scenario(SCEN_DIR / "heterogeneous.yaml", trace=str(trace), trace_rate_rps=5.0, seeds=4)
    assert s.workload_source == f"override:{trace}"
    reqs = s.requests(2)
    # length statistics have no timestamps: each seed replays the first 40 / 4 rows, Poisson arrivals
    assert [r.prompt_tokens for r in reqs] == list(range(100, 110))
    assert [r.arrival_s for r in reqs] != [r.arrival_s for r in s.requests(3)]


def test_trace_override_windows_of_a_timed_trace(tmp_path):
    trace = tmp_path / "m.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i * 100}, "input_length": {200 + i}, "output_length": 5, '
                             f'"hash_ids": [{i}]}}\n' for i in range(30)))
    s = sc.load_scenario(SCEN_DIR / "long-short.yaml", trace=str(trace), seeds=3)
    assert [r.prompt_tokens for r in s.requests(0)] == list(range(200, 210))
    assert [r.prompt_tokens for r in s.requests(2)] == list(range(220, 230))
    assert s.requests(1)[0].arrival_s == 0.0


def test_run_one_is_deterministic_and_reports_replicas():
    s = sc.load_scenario(SCEN_DIR / "heterogeneous.yaml", small=True)
    spec = s.spec.model_copy(update={"workload": s.spec.workload.model_copy(update={"num_requests": 200})})
    s = sc.Scenario(spec, s.path)
    a = sc.run_one(sc.Job(s, "fleetwise-default", 1))
    b = sc.run_one(sc.Job(s, "fleetwise-default", 1))
    assert a == b
    assert set(sc.METRICS) <= set(a)
    assert [r["name"] for r in a["per_replica"]] == ["h200-0", "h200-1", "a100-0", "a100-1"]
    assert [r["accelerator"] for r in a["per_replica"]] == ["h200-sxm", "h200-sxm", "a100-80g", "a100-80g"]
    assert sum(r["requests"] for r in a["per_replica"]) == 200
    assert a["router"]["decisions"] == 200
    assert all(len(r["queue_length"]["t_s"]) <= sc.QUEUE_POINTS for r in a["per_replica"])


@pytest.fixture(scope="module")
def small_results():
    scen = sc.load_scenarios(None, SCEN_DIR, small=True)
    return sc.run_scenarios(scen, None, seeds=5, small=True)


def test_small_scenarios_pass_the_rule(small_results):
    doc = small_results
    assert set(doc["scenarios"]) == set(sc.SCENARIO_NAMES)
    assert doc["default_policy"] == "fleetwise-default"
    for name in sc.SCENARIO_NAMES:
        assert [r["seed"] for r in doc["scenarios"][name]["round-robin"]] == [0, 1, 2, 3, 4]
    verdicts = doc["verdicts"]
    assert len(verdicts) == len(sc.SCENARIO_NAMES) + len(sc.TTFT_RULE_SCENARIOS)
    assert [v for v in verdicts if not v.startswith("PASS")] == []
    assert doc["passed"] is True
    md = sc.render_markdown(doc)
    assert "| heterogeneous | fleetwise-default |" in md and "## Verdicts" in md
    # hot-tenant: a per-tenant latency table answers "did the hot tenant hurt the others?"
    hot = doc["scenarios"]["hot-tenant"]["fleetwise-default"][0]["per_tenant"]
    assert set(hot) == {"hot", *(f"cold-{i}" for i in range(10))}
    assert sum(v["requests"] for v in hot.values()) == doc["scenarios"]["hot-tenant"]["fleetwise-default"][0]["requests"]
    assert "| fleetwise-default | hot |" in md and "| round-robin | cold-0 |" in md


def test_stale_control_plane_runs_each_safe_mode_action_side_by_side(small_results):
    doc = small_results
    name = "stale-control-plane"
    assert doc["variants"] == {name: {
        "safe-mode round-robin": {"policy": "fleetwise-default", "safe_mode": {"action": "round_robin"}},
        "safe-mode reject": {"policy": "fleetwise-default", "safe_mode": {"action": "reject"}},
        "safe-mode off": {"policy": "fleetwise-default", "safe_mode": {"enabled": False}},
    }}
    runs = doc["scenarios"][name]
    assert list(runs) == ["fleetwise-default", "round-robin", "safe-mode round-robin", "safe-mode reject",
                          "safe-mode off"]
    assert all(lbl not in doc["scenarios"]["slowdown"] for lbl in doc["variants"][name])
    for label, action in (("fleetwise-default", "last_known"), ("safe-mode round-robin", "round_robin"),
                          ("safe-mode reject", "reject")):
        assert [r["seed"] for r in runs[label]] == [0, 1, 2, 3, 4]
        assert all(r["router"]["safe_mode"]["action"] == action and r["router"]["safe_mode"]["entries"] >= 1
                   for r in runs[label])
    # the view freezes for 10 s and safe mode starts 5 s in: only `reject` sheds requests
    assert all(r["router"]["rejected"] > 0 for r in runs["safe-mode reject"])
    assert all(r["router"]["rejected"] == 0 for r in runs["safe-mode round-robin"] + runs["fleetwise-default"])
    assert all(not r["router"]["safe_mode"]["enabled"] and r["router"]["safe_mode"]["entries"] == 0
               for r in runs["safe-mode off"])
    assert set(doc["stats"][name]) == set(runs) and "vs_baseline" in doc["stats"][name]["safe-mode off"]
    md = sc.render_markdown(doc)
    assert "## stale-control-plane: variants side by side" in md
    assert "| safe-mode reject | safe_mode.action=reject | reject |" in md
    assert "| safe-mode off | safe_mode.enabled=False | off | 0.0 | 0 |" in md


def test_a_variant_label_must_not_be_a_policy_name(tmp_path):
    text = (SCEN_DIR / "stale-control-plane.yaml").read_text().replace("safe-mode off:", "round-robin:")
    (tmp_path / "stale-control-plane.yaml").write_text(text)
    with pytest.raises(SpecError, match=r"variants.*round-robin.*must differ from every policy name"):
        sc.load_scenario(tmp_path / "stale-control-plane.yaml")
    text = (SCEN_DIR / "stale-control-plane.yaml").read_text().replace("action: reject", "action: shed")
    (tmp_path / "stale-control-plane.yaml").write_text(text)
    with pytest.raises(SpecError, match="action"):
        sc.load_scenario(tmp_path / "stale-control-plane.yaml")


def _two_speed_trace(path):
    """Mooncake-style JSONL: 20 requests 1 s apart, then 20 requests 0.1 s apart (ms timestamps)."""
    t = [1000 * i for i in range(20)] + [20_000 + 100 * i for i in range(20)]
    path.write_text("".join(f'{{"timestamp": {ts}, "input_length": {300 + 10 * i}, "output_length": 50, '
                            f'"hash_ids": [{i}]}}\n' for i, ts in enumerate(t)))
    return path


def test_trace_windows_of_very_different_load_are_scaled_to_the_scenarios_load(tmp_path):
    trace = _two_speed_trace(tmp_path / "two.jsonl")
    rec = sc.load_scenario(SCEN_DIR / "long-short.yaml", small=True, trace=str(trace), seeds=2)
    loads = [sc.offered_tokens_per_s(rec.requests(k)) for k in range(2)]
    # window 0: 20 requests of 300..490 + 50 tokens over 19 s; window 1: 500..690 + 50 over 1.9 s
    assert loads == [pytest.approx(8900 / 19, rel=1e-12), pytest.approx(12900 / 1.9, rel=1e-12)]
    s = sc.load_scenario(SCEN_DIR / "long-short.yaml", small=True, trace=str(trace), seeds=2, trace_load="scenario")
    own = sc.load_scenario(SCEN_DIR / "long-short.yaml", small=True)
    assert s.target_tokens_per_s == sc.offered_tokens_per_s(own.requests(0))
    for k in range(2):
        mine, recorded = s.requests(k), rec.requests(k)
        assert sc.offered_tokens_per_s(mine) == pytest.approx(s.target_tokens_per_s, rel=1e-12)
        # the same requests in the same order, every gap scaled by one factor
        assert [r.prompt_tokens for r in mine] == [r.prompt_tokens for r in recorded]
        gaps, rgaps = np.diff([r.arrival_s for r in mine]), np.diff([r.arrival_s for r in recorded])
        assert np.allclose(gaps / rgaps, gaps[0] / rgaps[0], rtol=1e-9)
    # a trace without timestamps (length statistics) needs no --trace-rate at the scenario's load
    stats = tmp_path / "s.csv"
    stats.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(f"{100 + i},{10}\n" for i in range(40)))
    u = sc.load_scenario(SCEN_DIR / "heterogeneous.yaml", trace=str(stats), seeds=4, trace_load="scenario")
    assert sc.offered_tokens_per_s(u.requests(3)) == pytest.approx(u.target_tokens_per_s, rel=1e-12)


def test_trace_load_flags_are_checked(tmp_path):
    trace = _two_speed_trace(tmp_path / "two.jsonl")
    with pytest.raises(SpecError, match="--trace-load=scenario: applies only with --trace FILE"):
        sc.load_scenario(SCEN_DIR / "long-short.yaml", trace_load="scenario")
    with pytest.raises(SpecError, match="--trace-load scenario sets each window's rate itself; drop --trace-rate"):
        sc.load_scenario(SCEN_DIR / "long-short.yaml", trace=str(trace), trace_rate_rps=3.0, trace_load="scenario")
    with pytest.raises(SpecError, match="--trace-load='peak': unknown; use one of recorded, scenario"):
        sc.load_scenario(SCEN_DIR / "long-short.yaml", trace=str(trace), trace_load="peak")


def test_undefined_tpot_of_a_seed_is_left_out_of_the_means():
    """A seed whose outputs are all 1 token has no TPOT (None): the mean is over the others and
    a metric no seed defines aggregates to null and renders as n/a."""
    from fleetwise.sim.scenario_render import table_rows
    from fleetwise.sim.scenario_verdict import aggregate

    def run(seed, tpot):
        return {"seed": seed, "ttft_p50_s": 0.1, "ttft_p99_s": 0.2, "tpot_p50_s": tpot, "tpot_p99_s": tpot,
                "goodput_rps": 1.0, "slo_attainment": 1.0}

    doc = {"baseline_policy": "round-robin", "scenarios": {"s": {
        "round-robin": [run(0, None), run(1, 0.02), run(2, 0.04)],
        "other": [run(0, None), run(1, None), run(2, None)]}}}
    stats = aggregate(doc)
    st = stats["s"]
    assert st["round-robin"]["tpot_p99_s"]["mean"] == 0.03 and st["round-robin"]["tpot_p99_s"]["n"] == 2
    assert st["other"]["tpot_p99_s"] == {"mean": None, "ci95_lo": None, "ci95_hi": None, "n": 0}
    assert st["other"]["vs_baseline"]["tpot_p99_s"]["mean"] is None
    rows = {r.policy: r.cells for r in table_rows({"stats": stats})}
    assert rows["other"]["TPOT p99 ms"] == "n/a" and rows["round-robin"]["TPOT p99 ms"].startswith("30.0 ±")


def test_a_scenario_upgrading_one_side_of_a_pd_plan_carries_a_note(tmp_path):
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples/scenarios/pd-rolling-upgrade.yaml").read_text())
    assert sc.load_scenario(Path(__file__).resolve().parents[2] / "examples/scenarios/pd-rolling-upgrade.yaml").notes == ()
    for f in doc["faults"]["faults"]:
        f.pop("matched_with", None)
    for f in (doc.get("small") or {}).get("faults", {}).get("faults", []):
        f.pop("matched_with", None)
    path = tmp_path / "one-sided.yaml"
    path.write_text(yaml.safe_dump(doc))
    notes = sc.load_scenario(path).notes
    assert len(notes) == 1 and "pool 'p' is the prefill side" in notes[0] and "add matched_with: d" in notes[0]
