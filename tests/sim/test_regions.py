"""Regions end to end: a request naming a region stays there, and a client served from another
region sees its tokens one inter-region round trip later (TTFT and E2E, not TPOT)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fleetwise.core.request import Request
from fleetwise.errors import SpecError
from fleetwise.sim import scenarios as sc
from fleetwise.sim.results import request_metrics
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec

SCEN_DIR = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def two_region_plan(routing: str, latency_s: float = 0.05, clients: str | None = "us") -> PlanSpec:
    return PlanSpec(pools=[
        {"name": "us", "replicas": 1, "accelerator": "h200-sxm", "model": "llama-3.1-8b", "region": "us"},
        {"name": "eu", "replicas": 1, "accelerator": "h200-sxm", "model": "llama-3.1-8b", "region": "eu"},
    ], routing=routing, regions={"latency_s": latency_s, "clients": clients})


def run(plan: PlanSpec, reqs: list[Request]):
    res = simulate(plan, reqs, None, SimOptions(seed=0))
    names = [r["name"] for r in res.summary["per_replica"]]
    workers = [names[k] for k in np.frombuffer(res.records.worker, dtype=np.int64)]
    return res, workers


def test_a_client_served_in_another_region_pays_the_round_trip():
    # one request every second: nothing queues, so every difference is the network's
    reqs = [Request(str(i), float(i), 500, 20, region="eu" if i % 4 == 3 else None) for i in range(12)]
    far, _ = run(two_region_plan("round-robin"), reqs)
    near, workers = run(two_region_plan("round-robin", latency_s=0.0), reqs)
    assert workers == run(two_region_plan("round-robin"), reqs)[1]
    net = far.records.column("network_s")
    # unpinned clients are in `us`: round-robin serves some of them in `eu` (round trip 0.1 s);
    # requests naming `eu` are kept there and pay nothing
    expect = [0.1 if (w == "eu-0" and r.region is None) else 0.0 for r, w in zip(reqs, workers, strict=True)]
    assert net.tolist() == expect
    assert all(w == "eu-0" for r, w in zip(reqs, workers, strict=True) if r.region == "eu")
    assert 0.1 in expect and sum(expect) < 0.1 * len(reqs)
    (t_far, p_far, e_far, _), (t_near, p_near, e_near, _) = request_metrics(far.records), request_metrics(near.records)
    assert np.allclose(t_far - t_near, expect, atol=1e-12) and np.allclose(e_far - e_near, expect, atol=1e-12)
    assert np.allclose(p_far, p_near, atol=1e-12)
    assert far.summary["ttft_s"]["mean"] == pytest.approx(near.summary["ttft_s"]["mean"] + np.mean(expect), abs=1e-9)


def test_clients_default_to_the_first_pools_region():
    reqs = [Request(str(i), float(i), 500, 20) for i in range(4)]
    res, workers = run(two_region_plan("round-robin", clients=None), reqs)
    assert res.records.column("network_s").tolist() == [0.0 if w == "us-0" else 0.1 for w in workers]


@pytest.mark.parametrize("policy", ["fleetwise-default", "round-robin"])
def test_two_regions_keeps_the_pinned_tenant_in_its_region(policy):
    s = sc.load_scenario(SCEN_DIR / "two-regions.yaml", small=True)
    reqs = s.requests(0)
    tenants = [r.tenant for r in reqs]
    assert {r.region for r in reqs if r.tenant == "eu-bank"} == {"eu"}
    assert {r.region for r in reqs if r.tenant == "us-web"} == {None}
    assert 0.25 < tenants.count("eu-bank") / len(reqs) < 0.35
    res, workers = run(s.spec.plan.model_copy(update={"routing": policy}), reqs)
    by_id = dict(zip((r.request_id for r in res.records.requests), workers, strict=True))
    net = dict(zip((r.request_id for r in res.records.requests), res.records.column("network_s"), strict=True))
    assert {by_id[r.request_id] for r in reqs if r.tenant == "eu-bank"} == {"eu-0"}
    assert all(net[r.request_id] == 0.0 for r in reqs if r.tenant == "eu-bank")
    spilled = [r for r in reqs if r.tenant == "us-web" and by_id[r.request_id] == "eu-0"]
    assert spilled and all(net[r.request_id] == pytest.approx(0.08) for r in spilled)
    us = [r for r in reqs if r.tenant == "us-web" and by_id[r.request_id] != "eu-0"]
    assert us and all(net[r.request_id] == 0.0 for r in us)


def test_tenant_regions_are_checked(tmp_path):
    text = (SCEN_DIR / "two-regions.yaml").read_text()
    (tmp_path / "two-regions.yaml").write_text(text.replace("tenant_regions: {eu-bank: eu}", "tenant_regions: {eu-bank: asia}"))
    with pytest.raises(SpecError, match=r"tenant_regions.eu-bank='asia': no pool is in that region; regions of the plan: eu, us"):
        sc.load_scenario(tmp_path / "two-regions.yaml")
    (tmp_path / "two-regions.yaml").write_text(text.replace("tenant_regions: {eu-bank: eu}", "tenant_regions: {eu-bnk: eu}"))
    with pytest.raises(SpecError, match=r"tenant_regions.eu-bnk: no such tenant in workload.tenants \(eu-bank, us-web\)"):
        sc.load_scenario(tmp_path / "two-regions.yaml")
