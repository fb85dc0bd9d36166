"""Built-in model architectures: the data behind `fleetwise.spec.catalog`.

Owns the figures only (each with its source); lookups, suggestions and file resolution live in
`fleetwise.spec.catalog`. Sizes follow each model's released Hugging Face `config.json`.
`max_context_tokens` is the context length the model card advertises for serving.
"""

from __future__ import annotations

from fleetwise.spec.model import MLASpec, ModelSpec, MoESpec

_HF = "https://huggingface.co/{}/blob/main/config.json"

# DeepSeek-V3's MLA block, reused by Kimi-K2 and the 2.8T example (same attention design).
_DEEPSEEK_MLA = MLASpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536)


def _llama(name: str, repo: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    return ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=8,
        head_dim=hidden // heads, ffn_size=ffn, vocab_size=128256, max_context_tokens=131072,
        source=_HF.format(repo),
    )


GEMMA3_LOCAL_PER_GLOBAL = 6
"""Gemma3TextConfig's `sliding_window_pattern`: layer i is global when (i + 1) % 6 == 0, local otherwise."""


def _build() -> list[ModelSpec]:
    """Every built-in model, dense first, then mixture-of-experts, then MLA (the catalog's order)."""
    return [*_dense(), *_moe(), *_mla()]


def _dense() -> list[ModelSpec]:
    return [
        _llama("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 32, 4096, 32, 14336),
        _llama("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", 80, 8192, 64, 28672),
        _llama("llama-3.1-405b", "meta-llama/Llama-3.1-405B-Instruct", 126, 16384, 128, 53248),
        ModelSpec(
            name="qwen2.5-32b", num_layers=64, hidden_size=5120, num_attention_heads=40, num_kv_heads=8,
            head_dim=128, ffn_size=27648, vocab_size=152064, max_context_tokens=32768,
            source=_HF.format("Qwen/Qwen2.5-32B-Instruct"),
        ),
        ModelSpec(
            name="qwen3-32b", num_layers=64, hidden_size=5120, num_attention_heads=64, num_kv_heads=8,
            head_dim=128, ffn_size=25600, vocab_size=151936, max_context_tokens=32768,
            source=_HF.format("Qwen/Qwen3-32B"),
        ),
        ModelSpec(  # a 4,096-token sliding window on every layer
            name="mistral-7b-v0.1", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
            head_dim=128, ffn_size=14336, vocab_size=32000, max_context_tokens=32768, sliding_window=4096,
            source=_HF.format("mistralai/Mistral-7B-v0.1"),
        ),
        ModelSpec(  # 5 local layers (1,024-token window) per global one; the language model of Gemma 3 27B
            name="gemma-3-27b", num_layers=62, hidden_size=5376, num_attention_heads=32, num_kv_heads=16,
            head_dim=128, ffn_size=21504, vocab_size=262208, tie_embeddings=True, max_context_tokens=131072,
            sliding_window=1024, window_layers=tuple(i for i in range(62) if (i + 1) % GEMMA3_LOCAL_PER_GLOBAL),
            source=_HF.format("google/gemma-3-27b-it") + " (text_config; Gemma3TextConfig defaults)",
        ),
    ]


def _moe() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_attention_heads=32, num_kv_heads=4,
            head_dim=128, ffn_size=0, vocab_size=151936, max_context_tokens=32768,
            moe=MoESpec(num_experts=128, experts_per_token=8, expert_ffn_size=768),
            source=_HF.format("Qwen/Qwen3-30B-A3B"),
        ),
        ModelSpec(
            name="qwen3-235b-a22b", num_layers=94, hidden_size=4096, num_attention_heads=64, num_kv_heads=4,
            head_dim=128, ffn_size=0, vocab_size=151936, max_context_tokens=32768,
            moe=MoESpec(num_experts=128, experts_per_token=8, expert_ffn_size=1536),
            source=_HF.format("Qwen/Qwen3-235B-A22B"),
        ),
        ModelSpec(  # 128-token sliding window / full attention layers alternate (layer_types)
            name="gpt-oss-120b", num_layers=36, hidden_size=2880, num_attention_heads=64, num_kv_heads=8,
            head_dim=64, ffn_size=0, vocab_size=201088, max_context_tokens=131072,
            moe=MoESpec(num_experts=128, experts_per_token=4, expert_ffn_size=2880),
            sliding_window=128, window_layers=tuple(range(0, 36, 2)),
            source=_HF.format("openai/gpt-oss-120b"),
        ),
        ModelSpec(
            name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
            head_dim=128, ffn_size=0, vocab_size=32000, max_context_tokens=32768,
            moe=MoESpec(num_experts=8, experts_per_token=2, expert_ffn_size=14336),
            source=_HF.format("mistralai/Mixtral-8x7B-v0.1"),
        ),
    ]


def _mla() -> list[ModelSpec]:
    """DeepSeek-style models: multi-head latent attention over a mixture of experts."""
    return [
        ModelSpec(
            name="deepseek-v3", num_layers=61, hidden_size=7168, num_attention_heads=128, num_kv_heads=128,
            head_dim=128, ffn_size=18432, vocab_size=129280, max_context_tokens=131072,
            attention="mla", mla=_DEEPSEEK_MLA,
            moe=MoESpec(num_experts=256, experts_per_token=8, expert_ffn_size=2048, num_shared_experts=1,
                        first_dense_layers=3),
            source=_HF.format("deepseek-ai/DeepSeek-V3") + " ; arXiv:2412.19437 (671B total, 37B active)",
        ),
        ModelSpec(
            name="kimi-k2", num_layers=61, hidden_size=7168, num_attention_heads=64, num_kv_heads=64,
            head_dim=128, ffn_size=18432, vocab_size=163840, max_context_tokens=131072,
            attention="mla", mla=_DEEPSEEK_MLA,
            moe=MoESpec(num_experts=384, experts_per_token=8, expert_ffn_size=2048, num_shared_experts=1,
                        first_dense_layers=1),
            source=_HF.format("moonshotai/Kimi-K2-Instruct") + " ; arXiv:2507.20534 (1.04T total, 32.6B active)",
        ),
        # A 2.8T-parameter MoE with 896 experts and ~104B active parameters has been described in
        # public, but no config is released. This is our DeepSeek-style reading of it: 64 layers,
        # hidden 8192, 128 MLA heads (DeepSeek-V3 ranks), 896 routed experts of FFN 2048 with 26
        # routed + 2 shared per token, first 3 layers dense (FFN 24576), vocab 163840. Derived:
        # ~2.775T total, ~104.1B active (ratio ~1/26.7).
        ModelSpec(
            name="moe-2.8t-a104b", num_layers=64, hidden_size=8192, num_attention_heads=128, num_kv_heads=128,
            head_dim=128, ffn_size=24576, vocab_size=163840, max_context_tokens=131072,
            attention="mla", mla=_DEEPSEEK_MLA,
            moe=MoESpec(num_experts=896, experts_per_token=26, expert_ffn_size=2048, num_shared_experts=2,
                        first_dense_layers=3),
            source="published description, not a released config",
            verified=False,
        ),
    ]


MODELS: dict[str, ModelSpec] = {m.name: m for m in _build()}
