"""Small real runs of each result kind, made once per session through the CLI (with --report)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwise.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PLAN = """\
name: small-pd
model: llama-3.1-8b
accelerators: [{name: h100-sxm}]
workload: {rate_rps: 3, prompt_tokens: {kind: fixed, tokens: 6000}, output_tokens: {kind: fixed, tokens: 128}}
slo: {ttft_s: 0.6, tpot_s: 0.03}
weight_dtypes: [bf16]
headroom: {burst_factor: 1.0}
search: {max_gpus: 16, top_k: 3, refine_top: 1, seeds: 1, sample_requests: 100, disaggregation: auto, bisect_steps: 2}
"""
"""Long prompts at 3 req/s: two colocated replicas serve it, so the equal-cost PD split is run too."""

@pytest.fixture(scope="session")
def sim_run(tmp_path_factory) -> Path:
    """A PD run (2 prefill + 2 decode, 200 requests) under the example faults, with report and trace."""
    out = tmp_path_factory.mktemp("sim")
    rc = main(["simulate", str(ROOT / "examples/plans/pd-70b.yaml"), "--workload",
               str(ROOT / "examples/workloads/poisson-chat.yaml"), "--faults",
               str(ROOT / "examples/plans/pd-70b.faults.yaml"), "--requests", "300", "--tpot-slo", "0.05",
               "--out", str(out), "--report", str(out / "report.html"), "--trace-events", str(out / "trace.json"),
               "--trace-events-requests", "10:60", "--quiet"])
    assert rc == 0
    return out


@pytest.fixture(scope="session")
def scenario_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scenarios")
    rc = main(["scenarios", "--small", "--scenario", "slowdown", "--seeds", "2", "--no-fail", "--quiet",
               "--out", str(out), "--report", str(out / "report.html")])
    assert rc == 0
    return out


@pytest.fixture(scope="session")
def plan_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan")
    spec = out / "tiny.yaml"
    spec.write_text(PLAN, encoding="utf-8")
    rc = main(["plan", str(spec), "--workers", "1", "-o", str(out / "plan.json"), "--quiet",
               "--report", str(out / "report.html")])
    assert rc == 0
    return out


STALE = """\
name: stale-then-crash
faults:
  - {kind: stale_view, start_s: 10, end_s: 25}
  - {kind: crash, replica: mixed-1, at_s: 30, restart_after_s: 10}
"""


@pytest.fixture(scope="session")
def routing_run(tmp_path_factory) -> Path:
    """Three mixed replicas under the default policy: a stale fleet view long enough for safe mode, then a crash."""
    out = tmp_path_factory.mktemp("routing")
    (out / "faults.yaml").write_text(STALE, encoding="utf-8")
    rc = main(["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--replicas", "3", "--policy",
               "fleetwise-default", "--workload", str(ROOT / "examples/workloads/poisson-chat.yaml"), "--faults",
               str(out / "faults.yaml"), "--requests", "400", "--out", str(out), "--report",
               str(out / "report.html"), "--quiet"])
    assert rc == 0
    return out
