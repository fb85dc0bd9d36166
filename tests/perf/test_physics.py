"""The step-cost model's physics swept over every catalog model and card (hypothesis, derandomized).

Checked for any model, card, layout, dtype and shape: a step is finite and positive; more rows, more
context or a longer prompt never make it cheaper; TP splits the work of a big model (its all-reduces
priced); fp8 weights halve the bytes of the quantised weights, and a small dense decode is never
slower at fewer weight bytes (int4 <= fp8 <= bf16); MoE compute follows the active experts
and memory the total; a card with more HBM bandwidth is not slower on decode.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.perf import BatchShape, Deployment, PerfModel, SeqWork
from fleetwise.perf.memory import tp_candidates
from fleetwise.perf.roofline import BoundPerf
from fleetwise.spec.catalog import get_gpu, get_model, list_gpus, list_models
from fleetwise.spec.model import ModelSpec, MoESpec
from fleetwise.spec.parallel import ParallelismSpec

MODELS = [m.name for m in list_models()]
GPUS = [g.name for g in list_gpus()]
SWEEP = settings(max_examples=150, deadline=None, derandomize=True)


@st.composite
def deployments(draw: st.DrawFn, with_pp: bool = True) -> Deployment:
    """A catalog model on a catalog card, at a TP the card's node allows, PP 1-4, any weight/KV dtype."""
    m, g = get_model(draw(st.sampled_from(MODELS))), get_gpu(draw(st.sampled_from(GPUS)))
    tp = draw(st.sampled_from(tp_candidates(m, g)))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if p <= m.num_layers] if with_pp else [1]))
    wd = draw(st.sampled_from(["bf16", "fp8", "int4"] if "fp8" in g.flops_per_s else ["bf16", "int4"]))
    return Deployment(m, g, ParallelismSpec(tp=tp, pp=pp), weight_dtype=wd,
                      kv_dtype=draw(st.sampled_from(["bf16", "fp8"])), cuda_graphs=draw(st.booleans()))


def finite_positive(t: float) -> bool:
    return math.isfinite(t) and t > 0


@SWEEP
@given(dep=deployments(), b=st.integers(1, 1024), ctx=st.integers(1, 131072),
       seq=st.integers(1, 32768), chunk=st.integers(2, 8192))
def test_step_time_is_finite_positive_and_monotone(dep: Deployment, b: int, ctx: int, seq: int, chunk: int) -> None:
    bound = PerfModel().bind(dep)
    dec = bound.step_time_s(BatchShape.decode(b, ctx))
    pre = bound.step_time_s(BatchShape.prefill(1, seq))
    mixed = BatchShape.decode(b, ctx) + BatchShape.prefill(1, chunk)
    assert all(finite_positive(t) for t in (dec, pre, bound.step_time_s(mixed)))
    assert all(v >= 0 for k, v in bound.step_cost(mixed).as_dict().items() if k != "bound")
    assert bound.step_time_s(BatchShape.decode(b + 1, ctx)) >= dec
    assert bound.step_time_s(BatchShape.decode(b, ctx + 1)) >= dec
    assert bound.step_time_s(BatchShape.decode(b, 2 * ctx)) >= dec
    assert bound.step_time_s(BatchShape.prefill(1, seq + 1)) >= pre
    assert bound.step_time_s(BatchShape.prefill(2, seq)) >= pre
    assert bound.step_time_s(mixed + BatchShape.prefill(1, 1 + chunk // 2)) >= bound.step_time_s(mixed)
    assert bound.decode_time_s(b, b * ctx, ctx) == dec


def test_pp_step_is_not_cheaper_with_one_more_sequence() -> None:
    """Under PP=4 a step of S <= 4 sequences is priced as the whole model at 1/S of its sums; a 5-token
    chunk and a decode (1/2: 3 tokens) plus a 3-token chunk (1/3: 3 tokens, fewer prompt pairs) was
    priced lower than without the chunk, though the round still waits for the 5-token chunk."""
    bound = PerfModel().bind(Deployment(get_model("llama-3.1-8b"), get_gpu("a100-80g"), ParallelismSpec(pp=4),
                                        cuda_graphs=False))
    base = BatchShape.decode(1, 1) + BatchShape.prefill(1, 5)
    assert bound.step_time_s(base + BatchShape.prefill(1, 3)) >= bound.step_time_s(base)


def test_a_row_that_computes_more_tokens_is_not_cheaper() -> None:
    """qwen3-32b TP8 on gaudi3: a decode at 52,036 tokens of context streams its KV at one (row x KV head)
    unit's share of the bandwidth; the same row computing 104 tokens at that context streams the same
    cached KV and computes more (it was priced 36.8 ms against the decode's 60.6 ms while a chunk's
    cached context stayed out of the longest-row bound)."""
    bound = PerfModel().bind(Deployment(get_model("qwen3-32b"), get_gpu("gaudi3"), ParallelismSpec(tp=8),
                                        weight_dtype="fp8", cuda_graphs=False))
    base = BatchShape.decode(1, 8943)
    assert bound.step_time_s(base + BatchShape.of([SeqWork(104, 52036)])) >= bound.step_time_s(
        base + BatchShape.decode(1, 52037))


BIG = ["llama-3.1-70b", "llama-3.1-405b", "qwen2.5-32b", "qwen3-32b", "qwen3-235b-a22b", "mixtral-8x7b",
       "deepseek-v3"]


@SWEEP
@given(name=st.sampled_from(BIG), gpu=st.sampled_from(GPUS), b=st.integers(1, 256), ctx=st.integers(1, 32768),
       seq=st.integers(256, 16384))
def test_tp2_splits_a_big_models_work_and_prices_its_all_reduces(name: str, gpu: str, b: int, ctx: int,
                                                                  seq: int) -> None:
    m, g = get_model(name), get_gpu(gpu)
    one, two = Deployment(m, g), Deployment(m, g, ParallelismSpec(tp=2))
    pm = PerfModel()
    for shape in (BatchShape.decode(b, ctx), BatchShape.prefill(1, seq)):
        c1, c2 = pm.step_cost(shape, one), pm.step_cost(shape, two)
        assert c1.tp_comm_s == 0 < c2.tp_comm_s
        assert c2.total_s < c1.total_s


@SWEEP
@given(name=st.sampled_from(MODELS), gpu=st.sampled_from([g for g in GPUS if "fp8" in get_gpu(g).flops_per_s]),
       tp=st.sampled_from([1, 2, 8]))
def test_fp8_weights_halve_the_quantised_weight_reads(name: str, gpu: str, tp: int) -> None:
    """Linear layers' weights are read at 1 byte instead of 2; the LM head stays bf16 (as the memory
    fit and `ModelSpec.weight_bytes` store it), so its read does not change."""
    m, g = get_model(name), get_gpu(gpu)
    par = ParallelismSpec(tp=tp)
    b16 = BoundPerf(Deployment(m, g, par), PerfModel().profile)
    b8 = BoundPerf(Deployment(m, g, par, weight_dtype="fp8"), PerfModel().profile)
    assert b8.w_dense == b16.w_dense / 2
    assert b8.w_lm == b16.w_lm and b8.c_lm == b16.c_lm
    if m.moe is not None:
        group = m.num_moe_layers * PerfModel().profile.expert_group_s
        assert math.isclose(b8.w_exp - group, (b16.w_exp - group) / 2, rel_tol=1e-12)


@SWEEP
@given(name=st.sampled_from([n for n in MODELS if get_model(n).moe is None]), gpu=st.sampled_from(GPUS),
       tp=st.sampled_from([1, 2, 8]), b=st.integers(1, 16), ctx=st.integers(1, 32768))
def test_fewer_weight_bytes_never_slow_a_small_dense_decode(name: str, gpu: str, tp: int, b: int, ctx: int) -> None:
    """A decode of up to 16 rows is bound by the weight read: int4 (bf16 tensor work, 0.5 bytes) is never
    slower than fp8 (1 byte), nor fp8 than bf16 (the GEMM pads at most its own rows, `roofline`). Before the
    tile-padding cap int4 was compute-bound on gemm_m_half_tokens rows and slower than fp8."""
    m, g = get_model(name), get_gpu(gpu)
    pm, par, shape = PerfModel(), ParallelismSpec(tp=tp), BatchShape.decode(b, ctx)
    dtypes = ["int4", "fp8", "bf16"] if "fp8" in g.flops_per_s else ["int4", "bf16"]
    times = [pm.step_time_s(shape, Deployment(m, g, par, weight_dtype=w)) for w in dtypes]
    assert times == sorted(times)


def _with_experts(m: ModelSpec, experts: int) -> ModelSpec:
    assert m.moe is not None
    moe = MoESpec(**(m.moe.model_dump() | {"num_experts": experts}))
    return m.model_copy(update={"moe": moe, "name": f"{m.name}-{experts}"})


@SWEEP
@given(name=st.sampled_from([n for n in MODELS if get_model(n).moe is not None]), gpu=st.sampled_from(GPUS))
def test_moe_compute_follows_active_experts_and_memory_total_ones(name: str, gpu: str) -> None:
    """Doubling the experts at the same top-k: one token touches k experts either way (the same expert
    time), while a prompt large enough to touch them all reads twice the expert weights."""
    m, g = get_model(name), get_gpu(gpu)
    assert m.moe is not None
    small = PerfModel().bind(Deployment(m, g))
    big = PerfModel().bind(Deployment(_with_experts(m, 2 * m.moe.num_experts), g))
    assert math.isclose(big.routed_experts_s(1), small.routed_experts_s(1), rel_tol=1e-12)
    t = 1 << 20  # every expert touched
    exp_small, exp_big = small.w_exp * small.n_exp, big.w_exp * big.n_exp
    assert math.isclose(exp_big, 2 * exp_small, rel_tol=1e-12)
    assert big.routed_experts_s(t) > small.routed_experts_s(t)


@SWEEP
@given(dep=deployments(), b=st.integers(1, 512), ctx=st.integers(1, 131072), scale=st.floats(1.0, 4.0))
def test_more_bandwidth_is_not_slower_on_decode(dep: Deployment, b: int, ctx: int, scale: float) -> None:
    acc = dep.accelerator
    fast = Deployment(dep.model, acc.model_copy(update={"hbm_bytes_per_s": acc.hbm_bytes_per_s * scale}),
                      dep.parallelism, dep.weight_dtype, dep.kv_dtype, dep.cuda_graphs)
    pm = PerfModel()
    assert pm.step_time_s(BatchShape.decode(b, ctx), fast) <= pm.step_time_s(BatchShape.decode(b, ctx), dep)
