"""The router sees the KV links of a P/D fleet: bandwidth, active transfers and health, end to end."""

from __future__ import annotations

import pytest

from fleetwise.core.request import Request
from fleetwise.routing.registry import make_policy
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.faults import FaultScenario
from fleetwise.spec.plan import PlanSpec

GBPS = 50.0
PORT_BW = GBPS * 1e9 / 8  # bytes/s: one NIC per KV shard, tp=1


def pd_plan(routing: str = "round-robin", **kw) -> PlanSpec:
    pools = [{"name": "p", "role": "prefill", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2},
             {"name": "d", "role": "decode", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2}]
    return PlanSpec(pools=pools, kv_link={"gbps": GBPS}, routing=routing, **kw)


class LinkSpy:
    """Wraps a policy and records the links of every view it is shown."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.seen = inner, inner.name, []

    def route(self, req, fleet):
        self.seen.append((fleet.now_s, fleet.links))
        return self.inner.route(req, fleet)

    def observe(self, fb):
        self.inner.observe(fb)

    def report(self):
        return self.inner.report()


NO_RECOVERY = {"max_reprefills": 0, "on_decode_failure": "fail"}
"""A lost transfer fails its request (no re-prefill): every route call is a first decision."""


def run(policy: str, faults, n: int = 120, gap_s: float = 0.05, delay_s: float = 0.0):
    spy = LinkSpy(make_policy(policy, seed=1))
    reqs = [Request(str(i), i * gap_s, 4000, 32) for i in range(n)]
    res = simulate(pd_plan(policy, failure_domains=NO_RECOVERY), reqs, FaultScenario(faults=faults) if faults else None,
                   SimOptions(seed=1, policy=spy, feedback_delay_s=delay_s))
    return spy, res


@pytest.mark.parametrize("delay_s", [0.0, 0.25], ids=["exact", "delayed"])
def test_every_view_carries_every_prefill_decode_path(delay_s):
    spy, _ = run("round-robin", None, delay_s=delay_s)
    assert len(spy.seen) == 120
    for _, links in spy.seen:
        assert [(lk.src, lk.dst) for lk in links] == [("p-0", "d-0"), ("p-0", "d-1"), ("p-1", "d-0"), ("p-1", "d-1")]
        assert all(lk.healthy and lk.bandwidth_bytes_per_s == PORT_BW for lk in links)
        assert all(lk.latency_s == pd_plan().kv_link.latency_s for lk in links)
    # 4000-token prompts every 50 ms over 50 Gb/s ports: transfers overlap routing decisions.
    assert max(lk.active_transfers for _, links in spy.seen for lk in links) >= 1


def test_degraded_and_failed_links_show_in_the_view():
    faults = [{"kind": "kv_link", "replica": "d-1", "start_s": 1.0, "end_s": 2.0, "bandwidth_factor": 0.25},
              {"kind": "kv_link", "replica": "d-1", "start_s": 3.0, "end_s": 4.0, "bandwidth_factor": 0.0}]
    spy, _ = run("round-robin", faults)
    for now, links in spy.seen:
        by = {(lk.src, lk.dst): lk for lk in links}
        for src in ("p-0", "p-1"):
            d1, d0 = by[(src, "d-1")], by[(src, "d-0")]
            assert d0.healthy and d0.bandwidth_bytes_per_s == PORT_BW
            if 1.0 <= now < 2.0:
                assert d1.healthy and d1.bandwidth_bytes_per_s == pytest.approx(PORT_BW * 0.25)
            elif 3.0 <= now < 4.0:
                assert not d1.healthy and d1.bandwidth_bytes_per_s == 0.0
            else:
                assert d1.healthy and d1.bandwidth_bytes_per_s == PORT_BW


@pytest.mark.parametrize("policy", ["round-robin", "fleetwise-default"])
def test_a_down_link_is_excluded_so_no_transfer_fails(policy):
    """While d-1's port is down every policy routes around it: only requests routed to d-1
    before the link failed can lose their transfer."""
    faults = [{"kind": "kv_link", "replica": "d-1", "start_s": 2.0, "end_s": 4.0, "bandwidth_factor": 0.0}]
    spy, res = run(policy, faults)
    s = res.summary
    down = [i for i, (now, _) in enumerate(spy.seen) if 2.0 <= now < 4.0]
    assert len(down) == 40
    workers = res.records.worker
    names = res.replica_names
    assert all(names[workers[i]] == "d-0" for i in down)
    failed = set(res.records.failure)
    assert failed and set(s["failure_reasons"]) == {"kv_transfer_failed"}
    assert all(spy.seen[i][0] < 2.0 and names[workers[i]] == "d-1" for i in failed)
