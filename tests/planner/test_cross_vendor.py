"""The heterogeneous search across vendors: a P/D pair of two vendors is explained with what
crossing costs, and a pair with no common KV format is refused with the reason."""

from __future__ import annotations

from fleetwise.planner import fit, latency
from fleetwise.planner.layout import Layout
from fleetwise.planner.sizing import handoff_line
from fleetwise.spec.planning import planning_spec_from_dict

SPEC = {
    "name": "xv", "model": "llama-3.1-8b", "accelerators": [{"name": "h200-sxm"}, {"name": "mi300x"}],
    "workload": {"rate_rps": 3, "prompt_tokens": {"kind": "uniform", "min_tokens": 1000, "max_tokens": 3000},
                 "output_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 250}},
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "percentile": 90, "attainment": 0.9},
    "weight_dtypes": ["bf16"], "kv_link": {"bandwidth_bytes_per_s": 12.5e9},
    "search": {"max_gpus": 4, "disaggregation": "only", "heterogeneous": True, "sample_requests": 200},
}


def _search(kv_dtype: str):
    s = fit.prepare(planning_spec_from_dict({**SPEC, "kv_dtype": kv_dtype}))
    latency.run(s)
    return s


def test_a_cross_vendor_pair_is_explained_with_its_staging_cost():
    s = _search("bf16")
    h200, mi300 = Layout("h200-sxm", "bf16", 1), Layout("mi300x", "bf16", 1)
    assert handoff_line(s, h200, h200) == (True, None)
    ok, line = handoff_line(s, mi300, h200)
    assert ok and line is not None
    assert line.startswith("KV hand-off v1 bf16 b16 tp1 amd -> v1 bf16 b16 tp1 nvidia: no device-to-device path "
                           "between amd and nvidia: each side stages the KV through host memory: +")
    # 2 x bytes / 50 GB/s of staging for a mean prompt of ~2000 tokens of 128 kB: about 10 ms
    extra_ms = float(line.split("+")[1].split(" ms")[0])
    assert 8.0 < extra_ms < 12.0


def test_fp8_kv_between_ocp_and_fnuz_cards_is_refused():
    s = _search("fp8")
    ok, why = handoff_line(s, Layout("h200-sxm", "bf16", 1), Layout("mi300x", "bf16", 1))
    assert not ok and why is not None
    assert "kv_dtype 'fp8_e4m3fn' -> 'fp8_e4m3fnuz': no common KV format" in why
