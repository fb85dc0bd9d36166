"""Pipeline parallelism with micro-batches in flight: a PP replica gains throughput."""

from __future__ import annotations

from dataclasses import replace

from fleetwise.perf.roofline import PerfModel
from fleetwise.planner.fit import resolve_hardware
from fleetwise.planner.latency import estimate
from fleetwise.planner.layout import Layout
from fleetwise.planner.workload import build_mix


def test_pp_layout_capacity_gains_from_micro_batches(spec_factory) -> None:
    spec = spec_factory(model="llama-3.1-70b", workload={"rate_rps": 1.0},
                        slo={"ttft_s": 4.0, "tpot_s": 0.1, "percentile": 90, "attainment": 0.9})
    stats = build_mix(spec.workload, 500).stats
    hw = resolve_hardware(spec, 4096)
    lay = Layout("h100-sxm", "bf16", tp=4, pp=2)
    dep = hw.deployment(lay, "bf16")
    pm = PerfModel()
    piped = estimate(pm.bind(dep), lay, 10**6, stats, spec.slo, 0.0)
    serial = estimate(pm.bind(replace(dep, pp_microbatches=1)), lay, 10**6, stats, spec.slo, 0.0)
    # Same single-prompt latency floor (one sequence is not split) ...
    assert piped.ttft_alone_slo_s == serial.ttft_alone_slo_s
    assert piped.tpot_floor_s == serial.tpot_floor_s
    # ... but two micro-batches in flight: a full decode batch steps faster, and packed prompts
    # go through in about half the time.
    assert piped.decode_batch == serial.decode_batch == 256
    assert piped.tpot_at_batch_s < 0.85 * serial.tpot_at_batch_s
    assert piped.mu_decode_rps > 1.2 * serial.mu_decode_rps
    assert piped.mu_prefill_rps > 1.5 * serial.mu_prefill_rps
