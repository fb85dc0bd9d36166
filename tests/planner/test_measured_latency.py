"""A card's measured step-time factor prices the analytical phase too: floors, capacities and the
latency verdicts see the speed the simulator runs the card's pools at."""

from __future__ import annotations

import pytest

from fleetwise.perf.types import BatchShape
from fleetwise.planner import fit, latency
from fleetwise.planner.latency import MeasuredPerf


def _estimates(spec_factory, factor: float | None):
    over = {} if factor is None else {"measured_service": [
        {"accelerator": "h100-sxm", "step_time_factor": factor, "ci95": [factor * 0.9, factor * 1.1]}]}
    search = fit.prepare(spec_factory(**over))
    latency.run(search)
    return search.estimates


def test_a_measured_factor_scales_every_priced_step(spec_factory) -> None:
    plain, slow = _estimates(spec_factory, None), _estimates(spec_factory, 3.0)
    assert plain.keys() == slow.keys() and plain
    for lay, e in plain.items():
        s = slow[lay]
        assert s.ttft_alone_p50_s == pytest.approx(3.0 * e.ttft_alone_p50_s, rel=1e-12)
        assert s.ttft_alone_slo_s == pytest.approx(3.0 * e.ttft_alone_slo_s, rel=1e-12)
        assert s.tpot_floor_s == pytest.approx(3.0 * e.tpot_floor_s, rel=1e-12)
        assert s.prefill_s_per_request == pytest.approx(3.0 * e.prefill_s_per_request, rel=1e-12)
        assert s.decode_batch <= e.decode_batch and s.mu_decode_rps < e.mu_decode_rps
        assert s.mu_prefill_rps < e.mu_prefill_rps
    # a factor of 1 is the model itself, exactly
    assert _estimates(spec_factory, 1.0) == plain


def test_measured_perf_keeps_what_bounds_the_step(spec_factory) -> None:
    search = fit.prepare(spec_factory())
    lay = search.enumeration.fitting[0][0]
    bound = search.perf.bind(search.hw.deployment(lay, "bf16"))
    shape = BatchShape.decode(8, 1024)
    c, m = bound.step_cost(shape), MeasuredPerf(bound, 2.0).step_cost(shape)
    assert m.bound == c.bound and m.total_s == 2.0 * c.total_s and m.kv_memory_s == 2.0 * c.kv_memory_s
    assert MeasuredPerf(bound, 2.0).step_time_s(shape) == 2.0 * bound.step_time_s(shape)
