"""`ModelSpec`: the architecture of a decoder-only transformer, dense or MoE, GQA/MQA or MLA.

Owns the derived figures every layer above asks for: parameter counts (total and active per
token), weight bytes at a storage dtype, and KV-cache bytes per token. Does not know about
hardware, parallelism or timing (see `fleetwise.perf`).

Counting rules (per decoder layer, biases ignored, norms counted):
- GQA/MQA attention: q = hidden*heads*head_dim, k and v = hidden*kv_heads*head_dim each,
  o = heads*head_dim*hidden.
- MLA (DeepSeek-V2/V3): q = hidden*q_lora_rank + q_lora_rank*heads*(nope+rope) (or
  hidden*heads*(nope+rope) without a q LoRA), kv_a = hidden*(kv_lora_rank+rope),
  kv_b = kv_lora_rank*heads*(nope+v_head_dim), o = heads*v_head_dim*hidden.
- Gated FFN (SwiGLU): 3*hidden*ffn. MoE layer: router hidden*experts, routed experts
  experts*3*hidden*expert_ffn, shared experts shared*3*hidden*shared_ffn.
- Embedding vocab*hidden, plus an LM head of the same size unless embeddings are tied.
- Active parameters count the top-k routed experts and every shared expert.

KV bytes per token: GQA 2*layers*kv_heads*head_dim*bytes; MLA layers*(kv_lora_rank+rope)*bytes
(the compressed latent is cached, which is why MLA shrinks the cache).

Sliding-window attention (Mistral-7B-v0.1, Gemma 2/3, gpt-oss, Qwen2 with `use_sliding_window`): a
windowed layer attends to, and keeps cached, only the last `sliding_window` positions. A sequence of
n tokens holds `full_layers*n + window_layers*min(n, sliding_window)` layer-tokens of KV
(`kv_layer_tokens`), so its per-token KV equals the all-layer figure up to the window and falls
toward the full layers' share beyond it. `window_layers` lists which layers are windowed (None:
every layer, Mistral's layout) so pipeline stages count their own.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Literal

from pydantic import Field, model_validator

from fleetwise.spec.base import Spec
from fleetwise.spec.dtypes import dtype_bytes


class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2)."""

    kv_lora_rank: int = Field(gt=0)
    """Rank of the compressed KV latent that is cached per token and layer."""
    qk_rope_head_dim: int = Field(gt=0)
    """Decoupled RoPE key dimension, cached alongside the latent."""
    qk_nope_head_dim: int = Field(gt=0)
    """Per-head query/key dimension without RoPE."""
    v_head_dim: int = Field(gt=0)
    """Per-head value dimension."""
    q_lora_rank: int | None = Field(default=None, gt=0)
    """Rank of the query LoRA compression; None when queries are projected directly."""


class MoESpec(Spec):
    """Mixture-of-experts feed-forward layers."""

    num_experts: int = Field(gt=0)
    """Routed experts per MoE layer."""
    experts_per_token: int = Field(gt=0)
    """Routed experts each token is sent to (top-k)."""
    expert_ffn_size: int = Field(gt=0)
    """Intermediate size of one routed expert."""
    num_shared_experts: int = Field(default=0, ge=0)
    """Experts every token goes through, in addition to the routed ones."""
    shared_expert_ffn_size: int | None = Field(default=None, gt=0)
    """Intermediate size of one shared expert; defaults to expert_ffn_size."""
    first_dense_layers: int = Field(default=0, ge=0)
    """The first N layers use the dense FFN (ffn_size) instead of experts (DeepSeek's first_k_dense_replace)."""

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}; "
                "top-k must be at most the number of experts"
            )
        return self

    @property
    def shared_ffn(self) -> int:
        """Intermediate size of a shared expert (the routed experts' when not given)."""
        return self.shared_expert_ffn_size or self.expert_ffn_size


class ModelSpec(Spec):
    """Architecture of a decoder-only transformer. Sizes are element counts, not bytes."""

    name: str
    """Catalog or user-given name."""
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    """KV heads: equal to attention heads for MHA, fewer for GQA, 1 for MQA. Ignored for MLA."""
    head_dim: int = Field(gt=0)
    ffn_size: int = Field(ge=0)
    """Dense FFN intermediate size (0 when every layer is MoE)."""
    vocab_size: int = Field(gt=0)
    tie_embeddings: bool = False
    max_context_tokens: int = Field(default=8192, gt=0)
    """Longest context the model supports (prompt plus output)."""
    attention: Literal["gqa", "mla"] = "gqa"
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    source: str = ""
    """Where the figures come from (config URL, paper)."""
    verified: bool = True
    """False for published descriptions that are not a released config."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Positions a sliding-window layer attends to and caches (config.json `sliding_window`); None: no window."""
    window_layers: tuple[int, ...] | None = None
    """Indices (0-based) of the layers that use the sliding window; None: every layer when `sliding_window` is set."""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.attention == "mla" and self.mla is None:
            raise ValueError("attention='mla' needs an `mla` block (kv_lora_rank, qk_rope_head_dim, ...)")
        if self.attention == "gqa" and self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}; GQA groups need an integer ratio"
            )
        if self.moe is None and self.ffn_size == 0:
            raise ValueError("ffn_size=0 is only valid for MoE models; set ffn_size or add a `moe` block")
        if self.moe is not None and self.moe.first_dense_layers > 0 and self.ffn_size == 0:
            raise ValueError("moe.first_dense_layers > 0 needs ffn_size for those dense layers")
        if self.window_layers is not None:
            bad = [i for i in self.window_layers if not 0 <= i < self.num_layers]
            if self.sliding_window is None:
                raise ValueError("window_layers is set without sliding_window; set sliding_window or drop window_layers")
            if bad or len(set(self.window_layers)) != len(self.window_layers):
                raise ValueError(f"window_layers={list(self.window_layers)} must list distinct layer indices in "
                                 f"0..{self.num_layers - 1}; fix window_layers")
        return self

    # ---- per-layer parameter counts -------------------------------------------------------
    @cached_property
    def attn_params_per_layer(self) -> int:
        """Attention weights of one layer (q, k, v, o projections; MLA's low-rank ones), in parameters."""
        h, nh = self.hidden_size, self.num_attention_heads
        if self.attention == "mla":
            m = self.mla
            assert m is not None
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = h * m.q_lora_rank + m.q_lora_rank * nh * qk + m.q_lora_rank if m.q_lora_rank else h * nh * qk
            kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
            kv_b = m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim)
            o = nh * m.v_head_dim * h
            return q + kv_a + kv_b + o
        q = h * nh * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = nh * self.head_dim * h
        return q + kv + o

    @property
    def num_moe_layers(self) -> int:
        """Layers with routed experts (0 for a dense model)."""
        return 0 if self.moe is None else self.num_layers - self.moe.first_dense_layers

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense FFN."""
        return self.num_layers - self.num_moe_layers

    @cached_property
    def dense_ffn_params(self) -> int:
        """Weights of one dense gated FFN (gate, up, down: 3 x hidden x ffn), in parameters."""
        return 3 * self.hidden_size * self.ffn_size

    @cached_property
    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        assert self.moe is not None
        return 3 * self.hidden_size * self.moe.expert_ffn_size

    @cached_property
    def moe_layer_params(self) -> tuple[int, int]:
        """(total, active) FFN parameters of one MoE layer, router included."""
        m = self.moe
        assert m is not None
        router = self.hidden_size * m.num_experts
        shared = m.num_shared_experts * 3 * self.hidden_size * m.shared_ffn
        total = router + m.num_experts * self.expert_params + shared
        active = router + m.experts_per_token * self.expert_params + shared
        return total, active

    @cached_property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied), in parameters."""
        e = self.vocab_size * self.hidden_size
        return e if self.tie_embeddings else 2 * e

    @cached_property
    def norm_params(self) -> int:
        """RMSNorm weights: two per layer plus the final one, in parameters."""
        return (2 * self.num_layers + 1) * self.hidden_size

    # ---- totals ----------------------------------------------------------------------------
    @cached_property
    def params_total(self) -> int:
        """All parameters: what must be held in memory."""
        ffn = self.num_dense_layers * self.dense_ffn_params
        if self.moe is not None:
            ffn += self.num_moe_layers * self.moe_layer_params[0]
        return self.num_layers * self.attn_params_per_layer + ffn + self.embedding_params + self.norm_params

    @cached_property
    def params_active(self) -> int:
        """Parameters one token passes through: what compute follows."""
        ffn = self.num_dense_layers * self.dense_ffn_params
        if self.moe is not None:
            ffn += self.num_moe_layers * self.moe_layer_params[1]
        return self.num_layers * self.attn_params_per_layer + ffn + self.embedding_params + self.norm_params

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.moe is not None

    def weight_bytes(self, dtype: str = "bf16") -> float:
        """Bytes of all weights at a storage dtype (embeddings and norms kept at bf16 under int4/fp8)."""
        kept = self.embedding_params + self.norm_params
        return (self.params_total - kept) * dtype_bytes(dtype) + kept * 2.0

    def kv_elements_per_token(self) -> int:
        """KV-cache elements per token over all layers."""
        if self.attention == "mla":
            assert self.mla is not None
            return self.num_layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """KV-cache bytes per token over all layers (a sequence within the sliding window, if any)."""
        return self.kv_elements_per_token() * dtype_bytes(kv_dtype)

    # ---- sliding-window attention --------------------------------------------------------
    def is_window_layer(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) attends over the sliding window only."""
        if self.sliding_window is None:
            return False
        return self.window_layers is None or layer in self.window_layers

    @property
    def num_window_layers(self) -> int:
        """Layers that attend over the sliding window only (0 without a window)."""
        if self.sliding_window is None:
            return 0
        return self.num_layers if self.window_layers is None else len(self.window_layers)

    def window_layers_in(self, layers: range) -> int:
        """How many of `layers` (0-based indices, e.g. one pipeline stage's) are windowed."""
        if self.sliding_window is None:
            return 0
        if self.window_layers is None:
            return len(layers)
        return sum(1 for i in self.window_layers if i in layers)

    def kv_layer_tokens(self, tokens: float, layers: range | None = None) -> float:
        """Layer-tokens of KV one sequence of `tokens` positions keeps in `layers` (default: every layer):
        full layers hold every position, windowed layers at most `sliding_window` (`len(layers) * tokens`
        without a window)."""
        layers = range(self.num_layers) if layers is None else layers
        w = self.window_layers_in(layers)
        if w == 0:
            return len(layers) * tokens
        assert self.sliding_window is not None
        return (len(layers) - w) * tokens + w * min(tokens, self.sliding_window)

    def kv_bytes(self, tokens: float, kv_dtype: str = "bf16") -> float:
        """KV-cache bytes one sequence of `tokens` positions holds, windowed layers capped at their window
        (`tokens * kv_bytes_per_token` exactly for a model without a window)."""
        return self.kv_sizer(kv_dtype)(tokens)

    def kv_sizer(self, kv_dtype: str = "bf16") -> Callable[[float], float]:
        """`kv_bytes` at `kv_dtype` as a function of tokens, its per-token figures worked out once:
        what a caller sizing many sequences of one model keeps (the simulator, per pool)."""
        if self.num_window_layers == 0:
            per_token = self.kv_bytes_per_token(kv_dtype)
            return lambda tokens: tokens * per_token
        per_layer = self.kv_elements_per_token() // self.num_layers * dtype_bytes(kv_dtype)
        return lambda tokens: self.kv_layer_tokens(tokens) * per_layer

    def __hash__(self) -> int:  # frozen models hash by value; cached_property needs a dict
        return hash(self.name) ^ hash(self.params_total)
