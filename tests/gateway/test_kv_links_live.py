"""The KV link seen live: the gateway's fleet view carries each pair's link as its decode
backend's NIXL transfer metrics measure it, so the default policy avoids a degraded link as it
does in the simulator's `pd-degraded-link` (a decode port at 5% of its bandwidth, still healthy)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from gw_harness import FAST_SCRAPE, MODEL, emulators, run, served_gateway

from fleetwise.core.tokens import words_text
from fleetwise.gateway.kv_links import LINK_HALF_LIFE_S, LinkEstimate
from fleetwise.spec.plan import KvLinkSpec

PROMPT = words_text(list(range(2000)))
ROLES = ("prefill", "decode", "decode", "decode")
FAST, SLOW = KvLinkSpec(gbps=100), KvLinkSpec(gbps=5)  # the slow decode's port: 5% of the others'


def test_the_estimate_is_bytes_over_transfer_seconds_and_fades_towards_the_best():
    e = LinkEstimate()
    assert e.at(0.0, 10e9) == 10e9 and e.weight(0.0) == 0.0
    e.scraped(0.0, 0.0, 0.0, 1.0)
    assert e.bytes_per_s is None
    e.scraped(0.5, 2.0, 1e9, 2.0)  # two transfers, 1 GB in 0.5 s of transfer time
    assert e.bytes_per_s == 2e9 and e.measured_at_s == 2.0
    assert e.at(2.0, 10e9) == 2e9
    assert e.at(2.0 + LINK_HALF_LIFE_S, 10e9) == pytest.approx(6e9)  # half-way back to the best
    e.scraped(0.5, 2.0, 1e9, 50.0)  # no new transfer: the old estimate stands, and keeps fading
    assert e.measured_at_s == 2.0
    e.scraped(0.1, 1.0, 1e8, 60.0)  # the engine restarted (counters fell): its totals since count
    assert (e.bytes_per_s, e.measured_at_s) == (1e9, 60.0)


def _simulated_picks(n: int) -> list[str]:
    """The same fleet in the simulator (decode `d-0`'s port at 5% for the whole run), the same
    sequential requests: where the default policy sends each one."""
    from fleetwise.core.request import Request
    from fleetwise.sim.runner import simulate
    from fleetwise.spec.faults import FaultScenario, KvLinkFault
    from fleetwise.spec.plan import PlanSpec

    plan = PlanSpec(kv_link={"gbps": 100}, routing="fleetwise-default", pools=[
        {"name": "p", "role": "prefill", "accelerator": "h100-sxm", "model": MODEL},
        {"name": "d", "role": "decode", "replicas": 3, "accelerator": "h100-sxm", "model": MODEL}])
    faults = FaultScenario(name="slow", faults=[KvLinkFault(replica="d-0", start_s=0, end_s=1e6,
                                                             bandwidth_factor=0.05)])
    res = simulate(plan, [Request(str(k), k * 0.5, 2001, 4) for k in range(n)], faults=faults)
    return [res.replica_names[w] for w in res.records.worker]


def test_the_gateway_avoids_a_degraded_kv_link() -> None:
    async def scenario() -> None:
        each = [{"kv_link": FAST}, {"kv_link": SLOW}, {"kv_link": FAST}, {"kv_link": FAST}]
        async with emulators(ROLES, each=each) as emus, aiohttp.ClientSession() as c:
            doc = {"backends": [{"url": u, "name": f"e{i}", "role": r} for i, ((_, u), r) in
                                enumerate(zip(emus, ROLES, strict=True))],
                   "scrape": FAST_SCRAPE, "routing": {"policy": "fleetwise-default"}}
            async with served_gateway(doc) as (gw, url):
                picks = []
                for k in range(24):
                    async with c.post(url + "/v1/completions",
                                      json={"model": MODEL, "prompt": f"{k} {PROMPT}", "max_tokens": 4}) as r:
                        assert r.status == 200, await r.text()
                        picks.append(r.headers["x-fleetwise-backend"])
                    if k < 6:
                        await asyncio.sleep(0.12)  # let a scrape land between the first few
                links = {(lk.src, lk.dst): lk for lk in gw.backends.links(gw.now())}
                raw = {n: gw.backends.get(n).kv_link.bytes_per_s for n in ("e1", "e2", "e3")}
        # the slow port measured at about 5% of a fast one; the view fades it back towards the
        # best with the estimate's age, but well under half of it
        assert raw["e1"] is not None and raw["e2"] is not None
        assert raw["e1"] < 0.07 * raw["e2"]
        assert links[("e0", "e1")].bandwidth_bytes_per_s < 0.5 * links[("e0", "e2")].bandwidth_bytes_per_s
        assert "e1" in picks[:6]  # it was tried before anything was known
        assert "e1" not in picks[12:]  # then skipped: below half the best healthy link
        # the simulator, whose router sees the link from the start, never sends it anything
        assert set(_simulated_picks(24)) == {"d-1", "d-2"}
    run(scenario)


def test_the_link_view_counts_the_gateways_hand_offs_in_flight_per_pair():
    from fleetwise.gateway.backends import Backends
    from fleetwise.gateway.config import BackendSpec, BreakerSpec

    bs = Backends(BreakerSpec(), 4)
    for name, role in (("p0", "prefill"), ("d0", "decode"), ("d1", "decode")):
        bs.upsert(BackendSpec(url=f"http://127.0.0.1:1/{name}", name=name, role=role))
    assert bs.links(0.0) == ()  # nothing measured yet: no link data
    bs.get("d0").kv_link.scraped(0.1, 1.0, 1e9, 1.0)  # 10 GB/s
    bs.get("d1").kv_link.scraped(1.0, 1.0, 1e9, 1.0)  # 1 GB/s
    bs.handoff_started("r1", "p0", "d1")
    bs.handoff_started("r2", "p0", "d1")
    links = {lk.dst: lk for lk in bs.links(1.0)}
    assert (links["d0"].bandwidth_bytes_per_s, links["d0"].active_transfers) == (1e10, 0)
    assert (links["d1"].bandwidth_bytes_per_s, links["d1"].active_transfers) == (1e9, 2)
    bs.handoff_ended("r1")
    bs.handoff_ended("r1")  # idempotent
    assert {lk.dst: lk.active_transfers for lk in bs.links(1.0)} == {"d0": 0, "d1": 1}
