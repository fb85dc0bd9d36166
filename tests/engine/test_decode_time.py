"""The decode fast path (`BoundPerf.decode_time_s`) the engine plans fused steps with gives the
same float, bit for bit, as `step_time_s` on the equivalent `BatchShape`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.engine.bundle import decode_shape
from fleetwise.perf.roofline import PerfModel
from fleetwise.perf.types import Deployment
from fleetwise.spec.catalog import get_gpu, get_model
from fleetwise.spec.parallel import ParallelismSpec

DEPLOYMENTS = [
    ("llama-3.1-8b", "h100-sxm", ParallelismSpec(), True),
    ("llama-3.1-8b", "h100-sxm", ParallelismSpec(tp=2), False),
    ("llama-3.1-70b", "h200-sxm", ParallelismSpec(tp=4, pp=2), True),
    ("qwen3-30b-a3b", "h200-sxm", ParallelismSpec(tp=2, ep=2), True),
    ("deepseek-v3", "h200-sxm", ParallelismSpec(tp=8, ep=8), False),
]


@pytest.mark.parametrize(("model", "gpu", "par", "graphs"), DEPLOYMENTS)
@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 512), kv=st.integers(-4, 2_000_000), longest=st.integers(-1, 200_000))
def test_decode_time_equals_step_time(model: str, gpu: str, par: ParallelismSpec, graphs: bool,
                                      n: int, kv: int, longest: int) -> None:
    bound = PerfModel().bind(Deployment(get_model(model), get_gpu(gpu), par, cuda_graphs=graphs))
    assert bound.decode_time_s(n, kv, longest) == bound.step_time_s(decode_shape(n, kv, longest))


@settings(max_examples=400, deadline=None)
@given(cap=st.integers(2, 64), d0=st.floats(1e-5, 0.1), slope=st.sampled_from([0.0, 1e-12, 1e-9, 1e-7, 1e-5]),
       upto=st.integers(1, 64), frac=st.floats(0.0, 1.2))
def test_affine_count_le_matches_the_bisection(cap: int, d0: float, slope: float, upto: int, frac: float) -> None:
    """`Fused.count_le` answers from the quadratic's root for affine steps: the same k as
    bisecting the closed form (the largest k with T(k) <= x)."""
    from fleetwise.engine.bundle import Fused

    upto = min(upto, cap)
    f = Fused(cap, d0, d0 + slope * (cap - 1), slope, None)

    def closed(k: int) -> float:
        return k * d0 + slope * k * (k - 1) / 2

    for x in (frac * f.total(upto), closed(max(1, int(frac * upto))), d0):
        want = 0 if x < d0 else (upto if f.total(upto) <= x else max(
            k for k in range(1, upto) if closed(k) <= x))
        assert f.count_le(x, upto) == want
