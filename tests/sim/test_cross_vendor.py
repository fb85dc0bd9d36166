"""Hand-offs between vendors and formats in the simulator: a cross-vendor pair stages the KV
through host memory on both sides, a format conversion is a memory pass on the receiver, and a
pair with no common format is never made."""

from __future__ import annotations

import pytest

from fleetwise.core.request import Request
from fleetwise.perf.kv import STAGING_COPY_BYTES_PER_S
from fleetwise.sim.runner import simulate
from fleetwise.spec.catalog import get_gpu, get_model
from fleetwise.spec.plan import PlanSpec

PROMPT = 2048


def _kv_p50(p_gpu: str, d_gpu: str, p_kv: str = "bf16", d_kv: str = "bf16") -> float:
    plan = PlanSpec(kv_link={"gbps": 100, "latency_s": 1e-4}, pools=[
        {"name": "p", "role": "prefill", "accelerator": p_gpu, "model": "llama-3.1-8b", "kv_dtype": p_kv},
        {"name": "d", "role": "decode", "accelerator": d_gpu, "model": "llama-3.1-8b", "kv_dtype": d_kv}])
    s = simulate(plan, [Request("0", 0.0, PROMPT, 8)]).summary
    assert s["requests_completed"] == 1 and s["kv_transfer"]["count"] == 1
    return float(s["kv_transfer"]["p50_s"])


def test_a_cross_vendor_hand_off_pays_a_staging_copy_on_each_side():
    nbytes = PROMPT * get_model("llama-3.1-8b").kv_bytes_per_token("bf16")
    same, cross = _kv_p50("h200-sxm", "h200-sxm"), _kv_p50("h200-sxm", "mi300x")
    assert cross - same == pytest.approx(2 * nbytes / STAGING_COPY_BYTES_PER_S, abs=2e-9)


def test_a_format_conversion_is_a_memory_pass_on_the_receiver():
    # fp8 KV (OCP E4M3FN) into a bf16 decode pool on the same card: read + write the bytes once
    nbytes = PROMPT * get_model("llama-3.1-8b").kv_bytes_per_token("bf16")
    direct, converted = _kv_p50("h200-sxm", "h200-sxm"), _kv_p50("h200-sxm", "h200-sxm", p_kv="fp8")
    assert converted - direct == pytest.approx(2 * nbytes / get_gpu("h200-sxm").hbm_bytes_per_s, abs=2e-9)  # figures rounded to ns
