"""Memory fit: per-card weights, KV per card, layout search, kv_capacity_tokens."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.errors import SpecError
from fleetwise.perf.memory import (
    FitOptions,
    fit,
    kv_capacity_tokens,
    layout_fit,
    tp_candidates,
    weight_bytes_per_gpu,
)
from fleetwise.perf.types import Deployment
from fleetwise.spec.catalog import get_gpu, get_model, list_models
from fleetwise.spec.parallel import ParallelismSpec

H100, H200 = get_gpu("h100-sxm"), get_gpu("h200-sxm")


@pytest.mark.parametrize("name", [m.name for m in list_models()])
@pytest.mark.parametrize("dtype", ["bf16", "fp8", "int4"])
def test_one_card_weights_equal_model_weight_bytes(name: str, dtype: str) -> None:
    m = get_model(name)
    assert weight_bytes_per_gpu(m, ParallelismSpec(), dtype) == pytest.approx(m.weight_bytes(dtype), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["llama-3.1-70b", "qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"]),
       tp=st.sampled_from([1, 2, 4, 8]), pp=st.integers(1, 6))
def test_sharding_never_loses_weights(name: str, tp: int, pp: int) -> None:
    """All cards together hold at least the model; the fullest card at least its even share."""
    m = get_model(name)
    if tp not in tp_candidates(m, H100):
        return
    per_card = weight_bytes_per_gpu(m, ParallelismSpec(tp=tp, pp=pp), "bf16")
    assert per_card * tp * pp >= m.weight_bytes("bf16") * (1 - 1e-12)
    assert per_card <= m.weight_bytes("bf16")


def test_llama_70b_tp4_weights_exact() -> None:
    m = get_model("llama-3.1-70b")
    h, L = 8192, 80
    attn = 2 * h * 64 * 128 / 4 + 2 * h * 2 * 128  # q,o split by 4; 8 kv heads -> 2 per rank
    expected = (L * (attn + 3 * h * 28672 / 4)) * 2 + (2 * L + 1) * h * 2 + 2 * 128256 * h / 4 * 2
    assert weight_bytes_per_gpu(m, ParallelismSpec(tp=4)) == pytest.approx(expected, rel=1e-12)


def test_gqa_kv_heads_replicate_past_kv_heads() -> None:
    m = get_model("qwen3-30b-a3b")  # 4 kv heads
    f4 = layout_fit(m, H100, ParallelismSpec(tp=4))
    f8 = layout_fit(m, H100, ParallelismSpec(tp=8))
    assert f4.kv_bytes_per_token == 48 * 2 * 1 * 128 * 2
    assert f8.kv_bytes_per_token == f4.kv_bytes_per_token  # one head per rank either way


def test_mla_latent_replicated_on_every_tp_rank() -> None:
    m = get_model("deepseek-v3")
    for tp in (1, 8):
        assert layout_fit(m, H200, ParallelismSpec(tp=tp), "fp8").kv_bytes_per_token == 61 * 576 * 2


def test_pp_splits_layers_and_kv() -> None:
    m = get_model("llama-3.1-70b")
    f = layout_fit(m, H100, ParallelismSpec(tp=1, pp=3))
    assert f.terms["stage_layers"] in (26, 27)
    assert f.kv_bytes_per_token == f.terms["stage_layers"] * 2 * 8 * 128 * 2


def test_llama_70b_bf16_on_h100_needs_tp4() -> None:
    r = fit(get_model("llama-3.1-70b"), H100, "bf16")
    assert not r.fits_one_card
    assert r.single.weight_bytes == pytest.approx(141.1e9, rel=1e-3)
    assert r.min_tp is not None and (r.min_tp.tp, r.min_tp.pp) == (4, 1)
    assert r.min_tp_ep is None  # dense model: no EP layout
    assert r.min_tp_pp is not None and r.min_tp_pp.pp >= 2 and r.min_tp_pp.fits
    assert "does not fit" in r.lines[1]


def test_llama_70b_fp8_on_h100_tp2() -> None:
    r = fit(get_model("llama-3.1-70b"), H100, "fp8")
    assert not r.fits_one_card and r.min_tp is not None and r.min_tp.tp == 2
    f = r.min_tp
    assert f.kv_capacity_tokens == math.floor(f.kv_free_bytes / f.kv_bytes_per_token)
    assert f.kv_free_bytes == pytest.approx(f.usable_bytes - f.weight_bytes - f.activation_bytes - 2e9)


def test_llama_8b_fits_one_h100_with_exact_capacity() -> None:
    m = get_model("llama-3.1-8b")
    r = fit(m, H100)
    assert r.fits_one_card and r.min_tp is None
    s = r.single
    usable = 0.9 * 81559 * 2**20  # 90% of what nvidia-smi reports for an H100 80GB
    assert s.usable_bytes == pytest.approx(usable, rel=1e-12) and s.kv_bytes_per_token == 131072
    t = 8192
    acts = t * 2 * 4 * 4096 + t * 2 * (32 + 16) * 128 + t * 2 * 2 * 14336 + 256 * 128256 * 4
    assert s.activation_bytes == acts
    assert s.kv_capacity_tokens == math.floor((usable - m.weight_bytes() - acts - 2e9) / 131072)


def test_moe_report_ratio_and_ep_layout() -> None:
    m = get_model("moe-2.8t-a104b")
    r = fit(m, H200, "fp8")
    assert r.compute_ratio == pytest.approx(1 / 26.66, rel=0.01)
    assert any("1/26.7" in line for line in r.lines)
    assert r.min_tp is None  # 2.8 TB of fp8 weights cannot fit 8 cards of 141 GB
    assert r.min_tp_ep is not None and r.min_tp_ep.ep == r.min_tp_ep.gpus and r.min_tp_ep.fits
    assert r.min_tp_pp is not None and r.min_tp_pp.gpus * H200.hbm_bytes * 0.9 > m.weight_bytes("fp8")


def test_deepseek_fp8_fits_one_h200_node() -> None:
    r = fit(get_model("deepseek-v3"), H200, "fp8")
    assert r.min_tp is not None and r.min_tp.tp == 8
    assert r.min_tp_ep is not None and r.min_tp_ep.gpus <= 8


def test_ep_within_tp_holds_same_expert_bytes() -> None:
    m = get_model("deepseek-v3")
    assert weight_bytes_per_gpu(m, ParallelismSpec(tp=8, ep=8), "fp8") == pytest.approx(
        weight_bytes_per_gpu(m, ParallelismSpec(tp=8), "fp8"))


def test_kv_capacity_of_deployment() -> None:
    d = Deployment(get_model("llama-3.1-8b"), H100)
    assert kv_capacity_tokens(d) == fit(d.model, H100).single.kv_capacity_tokens
    small = kv_capacity_tokens(d, FitOptions(gpu_memory_utilization=0.5))
    assert small < kv_capacity_tokens(d)
    fp8 = Deployment(d.model, H100, kv_dtype="fp8")
    assert kv_capacity_tokens(fp8) in (2 * kv_capacity_tokens(d), 2 * kv_capacity_tokens(d) + 1)


def test_kv_capacity_zero_when_weights_overflow() -> None:
    assert kv_capacity_tokens(Deployment(get_model("llama-3.1-405b"), H100)) == 0


def test_bad_dtypes_and_options() -> None:
    m = get_model("llama-3.1-8b")
    with pytest.raises(SpecError, match="weight dtype 'fp4' is not supported"):
        fit(m, H100, "fp4")
    with pytest.raises(SpecError, match="kv dtype 'int4'"):
        fit(m, H100, "bf16", "int4")
    with pytest.raises(SpecError, match="gpu_memory_utilization=1.5"):
        FitOptions(gpu_memory_utilization=1.5)


def test_context_tokens_option_changes_the_verdict() -> None:
    m = get_model("llama-3.1-70b")
    tight = fit(m, H100, "fp8", options=FitOptions(context_tokens=10_000_000))
    assert tight.min_tp is None or tight.min_tp.kv_capacity_tokens >= 10_000_000
    assert tight.single.context_tokens == 10_000_000
