"""The five PD failure points in the simulator, each against a fault-free run of the same request:
prefill replica lost before hand-off, KV link failing mid-transfer, decode replica lost
mid-stream, decode pool full, lease expiry; plus the decisions' limits and the invariants."""

from __future__ import annotations

import pytest

from fleetwise.core.request import Request
from fleetwise.errors import SpecError
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.faults import FaultScenario
from fleetwise.spec.plan import PlanSpec

PROMPT, OUT = 16000, 200
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
"""Llama-3.1-8B, bf16 KV: layers x KV heads x head dim x (K, V) x 2 bytes."""


def pd_plan(**kw) -> PlanSpec:
    pools = [{"name": "prefill", "role": "prefill", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2},
             {"name": "decode", "role": "decode", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2}]
    return PlanSpec(pools=pools, kv_link={"gbps": 50}, **kw)


def one(plan: PlanSpec, faults: list[dict] | None = None):
    res = simulate(plan, [Request("0", 0.0, PROMPT, OUT)], FaultScenario(faults=faults) if faults else None,
                   SimOptions(seed=0))
    fd = res.summary["failure_domains"]
    rec = res.records
    return res, fd, {c: getattr(rec, c)[0] for c in ("prefill_start_s", "prefill_end_s", "kv_start_s", "kv_end_s",
                                                     "first_token_s", "finish_s")}


@pytest.fixture(scope="module")
def base():
    """The fault-free run: prefill-0 -> decode-0, every phase alone on its replica."""
    res, fd, t = one(pd_plan())
    assert (res.records.prefill_worker[0], res.records.worker[0]) == (0, 2)
    assert fd["requests"] == {"completed": 1, "reprefilled": 0, "migrated": 0, "failed": 0}
    t["prefill_s"] = t["prefill_end_s"] - t["prefill_start_s"]  # one lone prefill on one GPU = its GPU-seconds
    t["transfer_s"] = t["kv_end_s"] - t["kv_start_s"]
    t["first_pass_s"] = t["first_token_s"] - t["kv_end_s"]
    return t


def test_prefill_replica_lost_before_hand_off_prefills_again_elsewhere(base):
    crash_s = base["prefill_end_s"] / 2
    res, fd, t = one(pd_plan(), [{"kind": "crash", "replica": "prefill-0", "at_s": crash_s}])
    assert fd["requests"] == {"completed": 1, "reprefilled": 1, "migrated": 0, "failed": 0}
    assert fd["reprefills"] == {"count": 1, "by_reason": {"prefill_lost": 1}}
    assert (res.records.prefill_worker[0], res.records.worker[0]) == (1, 3)
    # The new attempt starts at the crash on an idle pair: same prefill, transfer and first pass.
    assert t["first_token_s"] == pytest.approx(crash_s + base["prefill_s"] + base["transfer_s"] + base["first_pass_s"],
                                               rel=1e-9)
    assert fd["gpu_s"] == {"recovery": pytest.approx(base["prefill_s"], rel=1e-8), "wasted": 0.0}
    assert fd["tokens"] == {"delivered": OUT, "billed_generated": OUT, "billed_prompt": PROMPT,
                            "computed_generated": OUT, "computed_prompt": 2 * PROMPT}
    _, off, _ = one(pd_plan(failure_domains={"max_reprefills": 0}),
                    [{"kind": "crash", "replica": "prefill-0", "at_s": crash_s}])
    assert off["requests"]["failed"] == 1 and off["tokens"]["billed_generated"] == 0


def test_kv_link_failing_mid_transfer_frees_the_kv_and_prefills_again(base):
    fault_s = (base["kv_start_s"] + base["kv_end_s"]) / 2
    res, fd, t = one(pd_plan(), [{"kind": "kv_link", "start_s": fault_s, "end_s": fault_s + 0.01,
                                  "bandwidth_factor": 0.0}])
    assert fd["requests"] == {"completed": 1, "reprefilled": 1, "migrated": 0, "failed": 0}
    assert fd["reprefills"]["by_reason"] == {"kv_transfer_failed": 1}
    nbytes = KV_BYTES_PER_TOKEN * PROMPT
    assert fd["orphaned_kv_byte_s"] == pytest.approx(nbytes * (fault_s - base["kv_start_s"]), rel=1e-8)
    # The KV thrown away cost one whole prefill; the re-prefill costs another.
    assert fd["gpu_s"]["wasted"] == pytest.approx(base["prefill_s"], rel=1e-8)
    assert fd["gpu_s"]["recovery"] == pytest.approx(base["prefill_s"], rel=1e-8)
    assert t["first_token_s"] == pytest.approx(fault_s + base["prefill_s"] + base["transfer_s"] + base["first_pass_s"],
                                               rel=1e-9)


@pytest.mark.parametrize("first_token", ["decode", "prefill"])
def test_decode_replica_lost_mid_stream_migrates_without_duplicate_or_missing_tokens(base, first_token):
    crash_s = (base["first_token_s"] + base["finish_s"]) / 2
    fault = [{"kind": "crash", "replica": "decode-0", "at_s": crash_s}]
    res, fd, t = one(pd_plan(pd_first_token=first_token), fault)
    assert fd["requests"] == {"completed": 1, "reprefilled": 0, "migrated": 1, "failed": 0}
    assert fd["migrations"] == {"count": 1, "by_reason": {"decode_lost": 1}}
    streamed = fd["tokens"]["computed_prompt"] - 2 * PROMPT  # the continuation prefilled prompt + streamed
    assert 0 < streamed < OUT
    # Same stream: its first token is the original one, then `streamed` + the continuation's rest = OUT.
    _, _, bt = one(pd_plan(pd_first_token=first_token))
    assert t["first_token_s"] == bt["first_token_s"]
    assert res.records.tokens[0] == OUT and fd["tokens"]["delivered"] == OUT
    assert t["finish_s"] > bt["finish_s"]
    assert fd["gpu_s"]["wasted"] == pytest.approx(base["prefill_s"], rel=1e-8)
    assert fd["gpu_s"]["recovery"] > base["prefill_s"]  # a longer context than the prompt
    # Configured to fail instead: a clean failure with exactly the tokens streamed before the crash.
    fres, failed, _ = one(pd_plan(pd_first_token=first_token, failure_domains={"on_decode_failure": "fail"}), fault)
    assert failed["requests"] == {"completed": 0, "reprefilled": 0, "migrated": 0, "failed": 1}
    assert fres.summary["failure_reasons"] == {"decode_lost": 1}
    assert fres.records.tokens[0] == streamed and failed["tokens"]["delivered"] == streamed
    assert failed["tokens"]["billed_generated"] == 0 and failed["tokens"]["billed_prompt"] == 0
    _, billed, _ = one(pd_plan(pd_first_token=first_token,
                               failure_domains={"on_decode_failure": "fail", "bill_failed": "delivered"}), fault)
    assert billed["tokens"]["billed_generated"] == streamed and billed["tokens"]["billed_prompt"] == PROMPT


def test_decode_pool_full_fails_admission_and_bounds_the_reprefills(base):
    res, fd, t = one(pd_plan(), [{"kind": "decode_full", "replica": "decode-0", "start_s": 0, "end_s": 10}])
    assert fd["requests"] == {"completed": 1, "reprefilled": 1, "migrated": 0, "failed": 0}
    assert fd["reprefills"]["by_reason"] == {"decode_pool_full": 1}
    assert res.records.worker[0] == 3
    assert t["first_token_s"] == pytest.approx(2 * base["prefill_s"] + base["transfer_s"] + base["first_pass_s"],
                                               rel=1e-9)
    assert fd["orphaned_kv_byte_s"] == 0.0  # refused at the hand-off: freed at once
    # Every decode replica full: the first prefill and two re-prefills, all thrown away, then failure.
    res, fd, _ = one(pd_plan(), [{"kind": "decode_full", "start_s": 0, "end_s": 10}])
    assert fd["requests"] == {"completed": 0, "reprefilled": 1, "migrated": 0, "failed": 1}
    assert fd["reprefills"] == {"count": 2, "by_reason": {"decode_pool_full": 2}}
    assert res.summary["failure_reasons"] == {"decode_pool_full": 1}
    assert fd["gpu_s"]["wasted"] == pytest.approx(3 * base["prefill_s"], rel=1e-8)
    assert fd["gpu_s"]["recovery"] == pytest.approx(2 * base["prefill_s"], rel=1e-8)
    assert fd["tokens"]["computed_prompt"] == 3 * PROMPT and fd["tokens"]["delivered"] == 0


def test_lease_expiry_frees_the_kv_after_the_lease_and_prefills_again(base):
    lease_s = 1.0
    res, fd, t = one(pd_plan(failure_domains={"kv_lease_s": lease_s}),
                     [{"kind": "kv_link", "replica": "decode-0", "start_s": 0, "end_s": 100, "bandwidth_factor": 0.01}])
    assert fd["leases_expired"] == 1 and fd["reprefills"]["by_reason"] == {"lease_expired": 1}
    assert fd["requests"] == {"completed": 1, "reprefilled": 1, "migrated": 0, "failed": 0}
    assert fd["orphaned_kv_byte_s"] == pytest.approx(KV_BYTES_PER_TOKEN * PROMPT * lease_s, rel=1e-12)
    expiry_s = base["prefill_end_s"] + lease_s
    assert t["first_token_s"] == pytest.approx(expiry_s + base["prefill_s"] + base["transfer_s"] + base["first_pass_s"],
                                               rel=1e-9)
    assert res.summary["kv_transfer"]["count"] == 1  # the cancelled transfer never completed


def test_colocated_replica_lost_mid_stream_migrates_to_another_replica():
    plan = PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2}])
    reqs = [Request("0", 0.0, 4000, 300)]
    base = simulate(plan, reqs).records
    crash_s = (base.first_token_s[0] + base.finish_s[0]) / 2
    res = simulate(plan, reqs, FaultScenario(faults=[{"kind": "crash", "replica": "m-0", "at_s": crash_s}]))
    fd = res.summary["failure_domains"]
    assert fd["migrations"]["by_reason"] == {"replica_crashed": 1}
    assert res.records.worker[0] == 1 and res.records.tokens[0] == 300
    assert res.records.first_token_s[0] == base.first_token_s[0]


def test_a_second_decode_loss_beyond_max_migrations_fails_cleanly(base):
    t1 = (base["first_token_s"] + base["finish_s"]) / 2
    faults = [{"kind": "crash", "replica": "decode-0", "at_s": t1},
              {"kind": "crash", "replica": "decode-1", "at_s": t1 + 1.5}]
    res, fd, _ = one(pd_plan(), faults)
    assert fd["requests"] == {"completed": 0, "reprefilled": 0, "migrated": 1, "failed": 1}
    assert res.summary["failure_reasons"] == {"decode_lost": 1}
    assert 0 < res.records.tokens[0] < OUT and fd["tokens"]["delivered"] == res.records.tokens[0]


def test_a_decode_replica_restarted_before_the_hand_off_still_owns_the_request(base):
    # decode-0 crashes and is back while request 0 still prefills on prefill-0: the KV lands on the
    # new process, and decode-0 keeps the request, so its second crash mid-stream migrates it
    # (before: the first crash forgot it, the second dropped it silently, `unfinished_at_end`).
    mid = (base["first_token_s"] + base["finish_s"]) / 2
    res, fd, t = one(pd_plan(), [{"kind": "crash", "replica": "decode-0", "at_s": base["prefill_end_s"] / 2,
                                  "restart_after_s": base["prefill_end_s"] / 4},
                                 {"kind": "crash", "replica": "decode-0", "at_s": mid}])
    assert fd["requests"] == {"completed": 1, "reprefilled": 0, "migrated": 1, "failed": 0}
    assert fd["migrations"] == {"count": 1, "by_reason": {"decode_lost": 1}}
    assert res.records.worker[0] == 3 and res.records.tokens[0] == OUT
    assert t["first_token_s"] == base["first_token_s"]


@pytest.mark.parametrize(("crashed", "reason"), [("p-0", "prefill_lost"), ("d-0", "decode_lost")])
def test_a_crash_while_the_kv_lands_fails_the_transfer(crashed, reason):
    # A cross-vendor hand-off lands latency + staging copies after its last byte leaves the port. A
    # crash of either end in that window fails it like one mid-transfer (before: the sender's crash
    # missed it, and its landing on the restarted sender's empty engine raised KeyError; the
    # receiver's crash let the KV land on the new process).
    plan = PlanSpec(kv_link={"gbps": 100, "latency_s": 1e-4}, pools=[
        {"name": "p", "role": "prefill", "accelerator": "h200-sxm", "model": "llama-3.1-8b", "replicas": 2},
        {"name": "d", "role": "decode", "accelerator": "mi300x", "model": "llama-3.1-8b", "replicas": 2}])
    reqs = [Request("0", 0.0, 2048, 8)]
    base = simulate(plan, reqs).records
    crash_s = base.kv_end_s[0] - 5e-5  # after the last byte left (its landing takes > 1e-4 s)
    res = simulate(plan, reqs, FaultScenario(faults=[{"kind": "crash", "replica": crashed, "at_s": crash_s,
                                                      "restart_after_s": 0.0}]))
    fd, rec = res.summary["failure_domains"], res.records
    assert fd["requests"] == {"completed": 1, "reprefilled": 1, "migrated": 0, "failed": 0}
    assert fd["reprefills"] == {"count": 1, "by_reason": {reason: 1}}
    assert (rec.prefill_worker[0], rec.worker[0]) == (1, 3)
    prefill_s, transfer_s = base.prefill_end_s[0], base.kv_end_s[0] - base.kv_start_s[0]
    assert rec.first_token_s[0] == pytest.approx(crash_s + prefill_s + transfer_s
                                                 + base.first_token_s[0] - base.kv_end_s[0], rel=1e-9)
    assert fd["gpu_s"]["wasted"] == pytest.approx(prefill_s, rel=1e-8)


def test_many_requests_under_every_failure_point_end_accounted():
    reqs = [Request(str(i), i * 0.05, 2000 + 37 * (i % 11), 64 + (i % 7) * 9) for i in range(300)]
    faults = [{"kind": "crash", "replica": "prefill-0", "at_s": 2.0, "restart_after_s": 2.0},
              {"kind": "kv_link", "start_s": 5.0, "end_s": 5.2, "bandwidth_factor": 0.0},
              {"kind": "crash", "replica": "decode-1", "at_s": 8.0, "restart_after_s": 3.0},
              {"kind": "decode_full", "replica": "decode-0", "start_s": 11.0, "end_s": 11.5},
              {"kind": "kv_link", "replica": "decode-0", "start_s": 13.0, "end_s": 14.0, "bandwidth_factor": 0.001}]
    res = simulate(pd_plan(failure_domains={"kv_lease_s": 0.5}), reqs, FaultScenario(faults=faults),
                   SimOptions(seed=1))
    s, fd, rec = res.summary, res.summary["failure_domains"], res.records
    assert s["requests_completed"] + s["requests_failed"] == len(reqs)
    assert fd["requests"]["completed"] == s["requests_completed"] and fd["requests"]["failed"] == s["requests_failed"]
    for reason in ("prefill_lost", "kv_transfer_failed", "decode_pool_full", "lease_expired"):
        assert fd["reprefills"]["by_reason"].get(reason, 0) >= 1, reason
    assert fd["migrations"]["by_reason"].get("decode_lost", 0) >= 1
    done = [i for i in range(len(reqs)) if rec.finish_s[i] == rec.finish_s[i]]
    assert all(rec.tokens[i] == reqs[i].output_tokens for i in done)
    assert all(0 <= rec.tokens[i] <= reqs[i].output_tokens for i in range(len(reqs)))
    assert fd["tokens"]["billed_generated"] == sum(reqs[i].output_tokens for i in done)
    assert fd["tokens"]["delivered"] == sum(rec.tokens)
    again = simulate(pd_plan(failure_domains={"kv_lease_s": 0.5}), reqs, FaultScenario(faults=faults),
                     SimOptions(seed=1))
    assert again.summary["failure_domains"] == fd  # deterministic


def test_moved_plan_fields_name_their_replacement():
    with pytest.raises(ValueError, match="retry_on_crash moved to failure_domains"):
        PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b"}], retry_on_crash=True)
    with pytest.raises(ValueError, match="kv_link.on_failure moved to failure_domains.max_reprefills"):
        pd_plan.__wrapped__ if False else PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm",
                                                           "model": "llama-3.1-8b"}], kv_link={"on_failure": "fail"})
    with pytest.raises(SpecError, match="failure_domains.on_decode_failure"):
        from fleetwise.spec.base import validate
        validate(PlanSpec, {"pools": [{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b"}],
                            "failure_domains": {"on_decode_failure": "retry"}}, "plan")
