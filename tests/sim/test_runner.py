"""Request lifecycle through simulate(): colocated and PD, exact and delayed routing, rejection."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from fleetwise.core.compiled import PURE_ENV
from fleetwise.core.request import Request
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec


def pd_plan(gbps=100.0, prefill=1, decode=1):
    return PlanSpec(kv_link={"gbps": gbps, "latency_s": 1e-3}, pools=[
        {"name": "p", "role": "prefill", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": prefill},
        {"name": "d", "role": "decode", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": decode}])


def test_pd_request_goes_prefill_then_transfer_then_decode():
    reqs = [Request("0", 0.0, 4096, 32)]
    res = simulate(pd_plan(), reqs)
    rec, s = res.records, res.summary
    assert res.replica_names[rec.prefill_worker[0]] == "p-0" and res.replica_names[rec.worker[0]] == "d-0"
    assert 0 < rec.prefill_end_s[0] == rec.kv_start_s[0] < rec.kv_end_s[0] <= rec.first_token_s[0] < rec.finish_s[0]
    kv_bytes = 4096 * 2 * 32 * 8 * 128 * 2  # llama-3.1-8b: 128 KiB per token in bf16
    assert rec.kv_end_s[0] - rec.kv_start_s[0] == pytest.approx(kv_bytes / (100e9 / 8) + 1e-3)
    assert s["kv_transfer"]["count"] == 1 and s["kv_transfer"]["bytes_total"] == kv_bytes
    assert s["disaggregated"] is True


def test_one_prefill_feeding_two_decodes_shares_its_egress():
    reqs = [Request("0", 0.0, 4096, 8), Request("1", 0.0, 4096, 8)]
    alone = simulate(pd_plan(gbps=10, decode=2), reqs[:1]).summary["kv_transfer"]["p50_s"]
    both = simulate(pd_plan(gbps=10, decode=2), reqs).summary["kv_transfer"]
    # Both prompts finish in one prefill step, so the two transfers start together and share the port.
    assert both["p50_s"] == pytest.approx(2 * alone - 1e-3, rel=1e-6)
    assert both["mean_queue_s"] == pytest.approx(alone - 1e-3, rel=1e-6)


@pytest.mark.parametrize("delay_s", [0.0, 0.05, 1.0], ids=["exact", "50ms", "1s"])
def test_round_robin_results_do_not_depend_on_feedback_delay(delay_s):
    reqs = [Request(str(i), i * 0.037, 700, 50) for i in range(200)]
    plan = PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 3}])
    exact = simulate(plan, reqs)
    other = simulate(plan, reqs, options=SimOptions(feedback_delay_s=delay_s))
    assert list(other.records.worker) == list(exact.records.worker)
    for a, b in zip(exact.records.finish_s, other.records.finish_s, strict=True):
        assert b == pytest.approx(a, rel=1e-9)


def test_rejected_requests_are_recorded_as_failed():
    # Requests pinned to a model version no replica serves are rejected by the router.
    reqs = [Request("0", 0.0, 100, 10), Request("1", 0.1, 100, 10, model_version="v9")]
    plan = PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b"}])
    res = simulate(plan, reqs)
    assert res.summary["requests_completed"] == 1 and res.summary["requests_failed"] == 1
    assert res.records.failure[1].startswith("rejected: ") and res.records.failure[1].count("rejected") == 1
    assert math.isnan(res.records.first_token_s[1])


@pytest.mark.parametrize("delay_s", [0.0, 0.25], ids=["exact", "fast"])
def test_prefill_start_and_queue_time_are_recorded(delay_s):
    # One replica, requests arriving while it decodes: each waits for the pass in flight.
    reqs = [Request(str(i), i * 0.05, 600, 40) for i in range(40)]
    plan = PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b"}])
    res = simulate(plan, reqs, options=SimOptions(feedback_delay_s=delay_s))
    rec = res.records
    waits = []
    for i, r in enumerate(reqs):
        assert r.arrival_s <= rec.prefill_start_s[i] < rec.first_token_s[i] == rec.prefill_end_s[i]
        waits.append(rec.prefill_start_s[i] - r.arrival_s)
    assert waits[0] == 0.0 and max(waits) > 0  # the first finds the replica idle
    q = res.summary["queue_s"]
    assert q["mean"] == pytest.approx(sum(waits) / len(waits), abs=1e-9) and q["p99"] <= max(waits)
    assert res.write  # the CSV column queue_s is prefill_start_s - arrival_s
    from fleetwise.sim.results import record_rows
    rows = record_rows(rec, res.replica_names)
    assert [row[7] for row in rows] == [round(w, 9) for w in waits]


def test_pd_prefill_start_is_on_the_prefill_replica():
    reqs = [Request("0", 0.0, 4096, 32), Request("1", 0.001, 2048, 8)]
    rec = simulate(pd_plan(), reqs).records
    for i in range(2):
        assert reqs[i].arrival_s <= rec.prefill_start_s[i] < rec.prefill_end_s[i] <= rec.kv_start_s[i]


@pytest.mark.parametrize("first_token", ["decode", "prefill"])
def test_pd_first_token_source(first_token):
    """`decode`: the first token comes from the decode replica's first pass after the KV lands;
    `prefill`: the prefill replica streams it at prefill end, the decode replica makes the rest,
    and a one-token request never moves its KV."""
    plan = PlanSpec(name="pd", pd_first_token=first_token, pools=[
        {"name": "p", "role": "prefill", "replicas": 1, "accelerator": "h200-sxm", "model": "llama-3.1-8b"},
        {"name": "d", "role": "decode", "replicas": 1, "accelerator": "h200-sxm", "model": "llama-3.1-8b"}])
    res = simulate(plan, [Request("0", 0.0, 2000, 5), Request("1", 5.0, 2000, 1)])
    rec = res.records
    assert res.summary["requests_completed"] == 2
    assert rec.prefill_end_s[0] < rec.kv_end_s[0] < rec.finish_s[0]
    if first_token == "decode":
        assert rec.kv_end_s[0] < rec.first_token_s[0]
        assert rec.kv_end_s[1] < rec.first_token_s[1] == rec.finish_s[1]
    else:
        assert rec.first_token_s[0] == rec.prefill_end_s[0]
        assert rec.first_token_s[1] == rec.prefill_end_s[1] == rec.finish_s[1]
        assert math.isnan(rec.kv_start_s[1]) and math.isnan(rec.kv_end_s[1])


STALLED = """
import json
from fleetwise.core.request import Request
from fleetwise.core.compiled import PURE_ENV
from fleetwise.engine.scheduler import Engine
from fleetwise.sim.runner import simulate
from fleetwise.spec.plan import PlanSpec

Engine.schedule = lambda self, *a, **k: None  # a stalled engine
plan = PlanSpec(name="one", pools=[{"name": "m", "replicas": 1, "accelerator": "h100-sxm",
                                    "model": "llama-3.1-8b"}])
s = simulate(plan, [Request(str(i), 0.1 * i, 500, 40) for i in range(10)]).summary
print(json.dumps([s["requests_completed"], s["requests_failed"], s["failure_reasons"]]))
"""


def test_requests_still_held_at_the_end_are_failed_not_lost():
    """If an engine ever stalls (schedule() answers None with work held), its requests end as
    failures with a reason when the events run out, never silently missing. The stall is a
    patched `Engine.schedule`, so it runs on the pure Python sources (compiled classes cannot
    be patched), in a process of its own."""
    env = {**os.environ, PURE_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", STALLED], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [0, 10, {"unfinished_at_end": 10}]


@pytest.mark.parametrize("delay_s", [0.0, 0.25], ids=["exact", "delayed"])
@pytest.mark.parametrize("policy", ["fleetwise-default", "least-outstanding"])
def test_a_request_a_minute_is_routed_on_a_fresh_view_not_in_safe_mode(policy, delay_s):
    plan = PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2}],
                    routing=policy)
    reqs = [Request(str(i), 60.0 * i, 512, 16) for i in range(6)]
    s = simulate(plan, reqs, options=SimOptions(seed=0, feedback_delay_s=delay_s)).summary
    assert s["requests_completed"] == 6
    assert "safe-mode" not in s["router"]["by_reason"]
    assert (s["router"]["safe_mode"]["entries"], s["router"]["safe_mode"]["time_s"]) == (0, 0.0)


def _small_kv_plan(**engine) -> PlanSpec:
    """llama-3.1-8b on one H100 at 30% memory: a KV cache of 3,159 blocks of 16 (50,544 tokens),
    under the model's 131,072-token context."""
    return PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b",
                            "gpu_memory_utilization": 0.3, "engine": engine}])


def test_a_request_longer_than_the_kv_cache_is_rejected_up_front_and_the_run_goes_on():
    """vLLM serves at most max_model_len tokens, by default the model's context lowered to what one
    replica's KV cache holds; a longer request is refused when it arrives and the run continues."""
    reqs = [Request("0", 0.0, 1000, 20), Request("1", 0.5, 50_530, 15), Request("2", 1.0, 50_530, 14),
            Request("3", 1.5, 1000, 20)]
    res = simulate(_small_kv_plan(), reqs)
    s, rec = res.summary, res.records
    assert s["requests_completed"] == 3 and s["failure_reasons"] == {"rejected_max_model_len": 1}
    assert rec.failure == {1: "rejected_max_model_len: 50,545 prompt + output tokens > max_model_len 50,544"}
    assert rec.worker[1] == -1 and math.isnan(rec.first_token_s[1]) and rec.tokens[2] == 14


def test_a_pool_max_model_len_caps_requests_and_must_fit_the_kv_cache():
    from fleetwise.errors import SpecError

    reqs = [Request("0", 0.0, 8000, 192), Request("1", 0.5, 8000, 193)]
    res = simulate(_small_kv_plan(max_model_len=8192), reqs)
    assert res.records.failure == {1: "rejected_max_model_len: 8,193 prompt + output tokens > max_model_len 8,192"}
    with pytest.raises(SpecError, match=r"^plan: pools\.0 \(m\): engine\.max_model_len=60000 does not fit one replica's "
                                        r"KV cache \(50,544 tokens\); lower it to at most 50,544 or give the pool more "
                                        r"KV room \(tp, pp, fp8 KV, gpu_memory_utilization\)$"):
        simulate(_small_kv_plan(max_model_len=60_000), reqs)
    with pytest.raises(SpecError, match=r"engine\.max_model_len=200000 exceeds the context of llama-3\.1-8b \(131,072 "
                                        r"tokens\); lower it to at most 131,072"):
        simulate(_small_kv_plan(max_model_len=200_000), reqs)


def test_pd_prefill_pools_check_the_prompt_and_decode_pools_the_whole_request():
    """A prefill instance computes the prompt and one token (prompt + 1 against its max_model_len);
    the decode instance holds prompt + output against its own, as two vLLM servers of a P/D pair do."""
    pools = [{"name": "p", "role": "prefill", "replicas": 1, "accelerator": "h200-sxm", "model": "llama-3.1-8b",
              "engine": {"max_model_len": 4096}},
             {"name": "d", "role": "decode", "replicas": 1, "accelerator": "h200-sxm", "model": "llama-3.1-8b",
              "engine": {"max_model_len": 16384}}]
    reqs = [Request("0", 0.0, 4000, 1000), Request("1", 0.5, 4096, 10), Request("2", 1.0, 10_000, 7000),
            Request("3", 1.5, 4095, 20)]
    res = simulate(PlanSpec(pools=pools, routing="round-robin"), reqs)
    assert res.records.failure == {
        1: "rejected_max_model_len: 4,096 prompt tokens + 1 > the prefill pools' max_model_len 4,096",
        2: "rejected_max_model_len: 17,000 prompt + output tokens > max_model_len 16,384"}
    assert res.summary["requests_completed"] == 2 and res.records.tokens[0] == 1000
