"""Derived parameter counts and KV bytes per token of catalog models against published figures."""

from __future__ import annotations

import pytest

from fleetwise.spec.catalog import get_model

# (name, published total, published active): model cards / papers.
PUBLISHED = [
    ("llama-3.1-8b", 8.03e9, 8.03e9),
    ("llama-3.1-70b", 70.6e9, 70.6e9),
    ("llama-3.1-405b", 405.9e9, 405.9e9),
    ("qwen2.5-32b", 32.8e9, 32.8e9),
    ("qwen3-32b", 32.8e9, 32.8e9),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),
    ("qwen3-235b-a22b", 235e9, 22e9),
    ("mixtral-8x7b", 46.7e9, 12.9e9),
    ("deepseek-v3", 671e9, 37e9),
    # Model card: "1.04T total, 32B activated" (two significant digits; our count, with both
    # embedding tables, is 32.86B: checked against 32B within 3%, see ACTIVE_TOLERANCE).
    ("kimi-k2", 1.04e12, 32e9),
    ("moe-2.8t-a104b", 2.8e12, 104e9),
]


# A published figure rounded to two digits can be up to 1/64 off by itself.
ACTIVE_TOLERANCE = {"kimi-k2": 0.03}


@pytest.mark.parametrize(("name", "total", "active"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_params_within_2_percent_of_published(name: str, total: float, active: float) -> None:
    m = get_model(name)
    assert abs(m.params_total / total - 1) < 0.02, m.params_total
    assert abs(m.params_active / active - 1) < ACTIVE_TOLERANCE.get(name, 0.02), m.params_active


def test_llama_8b_exact_count() -> None:
    # 32 * (attn 4096*(4096+2*1024+4096) + ffn 3*4096*14336 + 2 norms*4096) + 2*128256*4096 + 4096
    expected = 32 * (4096 * (4096 + 2048 + 4096) + 3 * 4096 * 14336 + 2 * 4096) + 2 * 128256 * 4096 + 4096
    assert get_model("llama-3.1-8b").params_total == expected == 8_030_261_248


KV = [
    ("llama-3.1-8b", "bf16", 131072.0),  # 2 * 32 layers * 8 kv heads * 128 * 2 B
    ("llama-3.1-8b", "fp8", 65536.0),
    ("llama-3.1-70b", "bf16", 327680.0),  # 2 * 80 * 8 * 128 * 2
    ("qwen3-30b-a3b", "bf16", 98304.0),  # 2 * 48 * 4 * 128 * 2
    ("deepseek-v3", "bf16", 70272.0),  # 61 * (512 + 64) * 2
    ("deepseek-v3", "fp8", 35136.0),
    ("kimi-k2", "bf16", 70272.0),
]


@pytest.mark.parametrize(("name", "dtype", "expected"), KV, ids=[f"{k[0]}-{k[1]}" for k in KV])
def test_kv_bytes_per_token(name: str, dtype: str, expected: float) -> None:
    assert get_model(name).kv_bytes_per_token(dtype) == expected


def test_moe_example_compute_ratio_is_about_one_27th() -> None:
    m = get_model("moe-2.8t-a104b")
    assert m.moe is not None and m.moe.num_experts == 896
    assert not m.verified and m.source == "published description, not a released config"
    assert 26 <= m.params_total / m.params_active <= 28


def test_deepseek_v3_architecture() -> None:
    m = get_model("deepseek-v3")
    assert m.attention == "mla" and m.mla is not None and m.moe is not None
    assert (m.mla.kv_lora_rank, m.mla.qk_rope_head_dim, m.mla.qk_nope_head_dim, m.mla.v_head_dim,
            m.mla.q_lora_rank) == (512, 64, 128, 128, 1536)
    assert (m.moe.num_experts, m.moe.experts_per_token, m.moe.num_shared_experts, m.moe.first_dense_layers) == (
        256, 8, 1, 3)
    assert (m.num_layers, m.hidden_size, m.moe.expert_ffn_size, m.ffn_size, m.vocab_size) == (
        61, 7168, 2048, 18432, 129280)
