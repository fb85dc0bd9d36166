"""Small real runs of each result kind, made once per session through the CLI (with --report)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwise.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PLAN = """\
name: tiny
model: llama-3.1-8b
accelerators: [{name: h100-sxm}]
workload: {rate_rps: 0.2, prompt_tokens: {kind: fixed, tokens: 256}, output_tokens: {kind: fixed, tokens: 64}}
slo: {ttft_s: 1.0, tpot_s: 0.05}
weight_dtypes: [bf16]
headroom: {burst_factor: 1.0}
search: {max_gpus: 8, top_k: 3, refine_top: 1, seeds: 1, sample_requests: 100, disaggregation: auto, bisect_steps: 2}
"""


@pytest.fixture(scope="session")
def sim_run(tmp_path_factory) -> Path:
    """A PD run (2 prefill + 2 decode, 200 requests) under the example faults, with report and trace."""
    out = tmp_path_factory.mktemp("sim")
    rc = main(["simulate", str(ROOT / "examples/plans/pd-70b.yaml"), "--workload",
               str(ROOT / "examples/workloads/poisson-chat.yaml"), "--faults",
               str(ROOT / "examples/plans/pd-70b.faults.yaml"), "--requests", "300", "--tpot-slo", "0.05",
               "--out", str(out), "--report", str(out / "report.html"), "--trace-events", str(out / "trace.json"),
               "--trace-requests", "10:60", "--quiet"])
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
    rc = main(["plan", str(spec), "--workers", "1", "--json", str(out / "plan.json"), "--quiet",
               "--report", str(out / "report.html")])
    assert rc == 0
    return out
