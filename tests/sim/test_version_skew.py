"""A KV hand-off across model versions is refused and the request prefilled again."""

from __future__ import annotations

import math

from fleetwise.core.request import Request
from fleetwise.sim.runner import simulate
from fleetwise.spec.plan import PlanSpec


def _plan(prefill_versions: list[str], decode_version: str) -> PlanSpec:
    pools = [{"name": f"p{k}", "role": "prefill", "accelerator": "h100-sxm", "model": "llama-3.1-8b",
              "model_version": v} for k, v in enumerate(prefill_versions)]
    pools.append({"name": "d", "role": "decode", "accelerator": "h100-sxm", "model": "llama-3.1-8b",
                  "model_version": decode_version})
    return PlanSpec(kv_link={"gbps": 100, "latency_s": 1e-3}, pools=pools)


def test_no_prefill_replica_is_paired_across_versions():
    reqs = [Request(str(i), i * 0.5, 1024, 16) for i in range(4)]
    res = simulate(_plan(["v1"], "v2"), reqs)
    s = res.summary
    # No pair of matching versions exists: the router rejects each request before any prefill,
    # rather than prefilling KV the decode side would refuse.
    assert s["kv_transfer"]["count"] == 0
    assert s["requests_retried"] == 0
    assert s["failure_reasons"] == {"rejected": 4}
    assert all(math.isnan(t) for t in res.records.kv_start_s)


def test_pairs_form_within_a_version():
    # Two prefill replicas, one per version, and a v2 decode replica: every request is paired
    # p1 (v2) -> d (v2) at once; nothing is refused, nothing prefilled twice.
    reqs = [Request(str(i), i * 0.5, 1024, 16) for i in range(4)]
    res = simulate(_plan(["v1", "v2"], "v2"), reqs)
    s = res.summary
    assert s["requests_completed"] == 4 and s["requests_failed"] == 0
    assert s["kv_transfer"]["count"] == 4
    assert s["requests_retried"] == 0
    assert list(res.records.prefill_worker) == [1, 1, 1, 1]


def test_pools_with_no_common_kv_format_are_never_paired():
    # H100 prefill stores fp8 as OCP E4M3FN; MI300X decode reads only bf16 and E4M3FNUZ.
    pools = [{"name": "p", "role": "prefill", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "kv_dtype": "fp8"},
             {"name": "d", "role": "decode", "accelerator": "mi300x", "model": "llama-3.1-8b", "kv_dtype": "fp8"}]
    res = simulate(PlanSpec(kv_link={"gbps": 100}, pools=pools), [Request(str(i), i * 0.5, 1024, 16) for i in range(3)])
    assert res.summary["failure_reasons"] == {"rejected": 3}
    assert res.summary["kv_transfer"]["count"] == 0


def test_same_version_handoff_is_untouched():
    reqs = [Request(str(i), i * 0.5, 1024, 16) for i in range(4)]
    s = simulate(_plan(["v2"], "v2"), reqs).summary
    assert (s["requests_completed"], s["requests_retried"], s["kv_transfer"]["count"]) == (4, 0, 4)


def test_a_draining_prefill_replica_goes_down_once_its_kv_is_released():
    from fleetwise.spec.faults import FaultScenario, RollingUpgrade

    # Requests are in flight on p0-0 when its upgrade starts: it must go down once the last KV it
    # holds has been transferred and released, not stay draining for the rest of the run.
    plan = _plan(["v1", "v1"], "v1")
    reqs = [Request(str(i), i * 0.05, 2048, 64) for i in range(8)]
    scen = FaultScenario(name="up", faults=[RollingUpgrade(pool="p0", start_s=0.06, new_model_version="v1",
                                                           restart_after_s=1.0)])
    s = simulate(plan, reqs, faults=scen).summary
    phases = [(f["phase"], f["target"]) for f in s["faults"]]
    assert phases[:3] == [("drain", "p0-0"), ("down", "p0-0"), ("restart", "p0-0")]
    assert s["requests_completed"] == 8
