"""Memory fit: what one card of a replica holds, and which layouts leave room for KV cache.

Owns the per-card memory model (weights, activations at the engine's token budget, a fixed
reserve, KV cache) for a layout (tp, pp, ep), the search for the smallest layouts that fit, and
`kv_capacity_tokens(deployment)` for the simulator and planner. Does not model time.

Per card, for the pipeline stage that holds it (layers split as evenly as possible, earlier
stages take the remainder; the worst stage decides):
- usable   = hbm_bytes * gpu_memory_utilization
- weights  = stage layers * (attention/tp + dense FFN/tp | MoE experts, see below) + norms
             + embedding/tp on the first stage + LM head/tp on the last (vocab-parallel).
  GQA k/v projections hold max(1, kv_heads/tp) heads per rank (replicated when kv_heads < tp);
  MLA's down-projections (q_a, kv_a) are replicated, its up/out projections split by tp.
  Routed experts: ep == 1 -> TP-sharded (stage MoE layers * E * P_e / tp); 1 < ep <= tp ->
  ceil(E/ep) whole experts per EP rank, each split over tp/ep ranks; ep > tp -> the EP group
  spans the replica's stages, each card holding ceil(E/ep) experts of every MoE layer.
  Linear weights are stored at `weight_dtype`; embeddings, LM head and norms stay bf16
  (as `ModelSpec.weight_bytes`).
- activations = T*2B*(4*hidden + q/k/v width per card + 2*FFN width per card)
                + (MoE) T*top_k*hidden*2B dispatch buffer + logits min(T, max_num_seqs)*vocab/tp*4B
  with T = max_num_batched_tokens (the profile run's peak, as vLLM measures it).
- reserve  = cuda_graph_bytes + workspace_bytes.
- KV per token per card: GQA stage_layers*2*max(1, kv_heads/tp)*head_dim*kv_bytes;
  MLA stage_layers*(kv_lora_rank + rope_dim)*kv_bytes (the latent is replicated on every TP rank).
- KV capacity (tokens) = floor((usable - weights - activations - reserve) / KV per token per card),
  the minimum over stages. A layout fits when that is at least one request at full context.
- Sliding-window layers (`ModelSpec.sliding_window`) keep at most the window: capacity stays in
  tokens at the full per-token cost (what a sequence inside the window pays), and a sequence of n
  tokens needs `(full_stage_layers*n + window_stage_layers*min(n, window)) / stage_layers` of them
  (`kv_request_tokens`): a request at full context fits in less, and more requests fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fleetwise.errors import SpecError
from fleetwise.perf.types import Deployment
from fleetwise.spec import engine_defaults as ed
from fleetwise.spec.dtypes import KV_DTYPES, WEIGHT_DTYPES, dtype_bytes
from fleetwise.spec.hardware import AcceleratorSpec
from fleetwise.spec.model import ModelSpec
from fleetwise.spec.parallel import ParallelismSpec

ACT_BYTES = 2.0  # activations run in bf16 whatever the weight format
KEPT_BYTES = 2.0  # embeddings, LM head and norms stay bf16 under fp8/int4
LOGIT_BYTES = 4.0  # logits are materialised in fp32


@dataclass(frozen=True)
class FitOptions:
    """Engine knobs that decide the minimal runtime state beside the weights."""

    max_num_batched_tokens: int = ed.MAX_NUM_BATCHED_TOKENS
    """Token budget of one step (vLLM's max_num_batched_tokens): sizes the activation peak."""
    max_num_seqs: int = ed.MAX_NUM_SEQS
    """Most sequences in a step: rows of the fp32 logits."""
    gpu_memory_utilization: float = ed.GPU_MEMORY_UTILIZATION
    """Fraction of HBM the engine may use (vLLM's gpu_memory_utilization)."""
    cuda_graph_bytes: float = 1.0e9
    """Memory held by captured CUDA graphs, per card."""
    workspace_bytes: float = 1.0e9
    """GEMM/NCCL workspaces and allocator slack, per card."""
    context_tokens: int | None = None
    """KV the minimum must hold for one request; None means the model's max_context_tokens."""
    max_gpus: int = 256
    """Largest replica the layout search considers."""

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise SpecError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]; e.g. 0.9")
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_gpus"):
            if getattr(self, name) < 1:
                raise SpecError(f"{name}={getattr(self, name)} must be at least 1")
        if self.context_tokens is not None and self.context_tokens < 1:
            raise SpecError(f"context_tokens={self.context_tokens} must be at least 1 (or None for the model's)")
        if self.cuda_graph_bytes < 0 or self.workspace_bytes < 0:
            raise SpecError("cuda_graph_bytes and workspace_bytes must be >= 0")

    @property
    def reserve_bytes(self) -> float:
        """Bytes per card kept off the KV cache: CUDA graphs plus the runtime's workspace."""
        return self.cuda_graph_bytes + self.workspace_bytes


@dataclass(frozen=True)
class LayoutFit:
    """Memory of the tightest card of one layout, with the terms that produced each number."""

    tp: int
    pp: int
    ep: int
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    reserve_bytes: float
    kv_bytes_per_token: float
    """KV bytes one token costs on this card (its share of heads/layers)."""
    kv_free_bytes: float
    """Memory left for KV cache on this card (may be negative)."""
    kv_capacity_tokens: int
    context_tokens: int
    terms: dict[str, float] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    request_tokens: float = 0.0
    """KV tokens (at the full per-token cost) one request at `context_tokens` needs: the context itself
    without a sliding window, less when windowed layers cap theirs (0: `context_tokens`)."""

    @property
    def gpus(self) -> int:
        """GPUs of one replica: TP x PP (EP reuses them)."""
        return self.tp * self.pp

    @property
    def fits(self) -> bool:
        """Weights and runtime state fit, with KV for one request at full context."""
        return self.kv_capacity_tokens >= (self.request_tokens or self.context_tokens)

    @property
    def label(self) -> str:
        """`TP=.. PP=..` (and `EP=..` when used), as reports print a layout."""
        return f"TP={self.tp} PP={self.pp}" + (f" EP={self.ep}" if self.ep > 1 else "")

    def as_dict(self) -> dict[str, object]:
        """The layout's fit as a JSON-ready mapping (bytes per card, KV tokens per replica)."""
        return {"tp": self.tp, "pp": self.pp, "ep": self.ep, "gpus": self.gpus, "fits": self.fits,
                "usable_bytes": self.usable_bytes, "weight_bytes": self.weight_bytes,
                "activation_bytes": self.activation_bytes, "reserve_bytes": self.reserve_bytes,
                "kv_free_bytes": self.kv_free_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
                "kv_capacity_tokens": self.kv_capacity_tokens, "context_tokens": self.context_tokens,
                "request_tokens": self.request_tokens or float(self.context_tokens),
                "terms": dict(self.terms), "explanation": list(self.lines)}


@dataclass(frozen=True)
class FitReport:
    """Answer to "does this model fit this card, and if not, on what?"."""

    model: str
    gpu: str
    weight_dtype: str
    kv_dtype: str
    params_total: int
    params_active: int
    single: LayoutFit
    min_tp: LayoutFit | None
    min_tp_pp: LayoutFit | None
    min_tp_ep: LayoutFit | None
    lines: list[str]

    @property
    def fits_one_card(self) -> bool:
        """The model fits on a single card (TP=PP=1)."""
        return self.single.fits

    @property
    def compute_ratio(self) -> float:
        """Active / total parameters: the share of a dense model of the same size that one token computes."""
        return self.params_active / self.params_total

    def as_dict(self) -> dict[str, object]:
        """The report as a JSON-ready mapping (what `fleetwise fit --json` writes)."""

        def opt(x: LayoutFit | None) -> dict[str, object] | None:
            return None if x is None else x.as_dict()

        return {"model": self.model, "gpu": self.gpu, "weight_dtype": self.weight_dtype,
                "kv_dtype": self.kv_dtype, "params_total": self.params_total,
                "params_active": self.params_active, "compute_ratio": self.compute_ratio,
                "fits_one_card": self.fits_one_card, "single": self.single.as_dict(),
                "min_tp": opt(self.min_tp), "min_tp_pp": opt(self.min_tp_pp), "min_tp_ep": opt(self.min_tp_ep),
                "explanation": list(self.lines)}


# ---- weights per card ------------------------------------------------------------------------
def _stage_ranges(num_layers: int, pp: int) -> list[range]:
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def kv_heads_per_card(model: ModelSpec, tp: int) -> float:
    """GQA KV heads one TP rank holds: kv_heads/tp, at least one (a head is replicated when kv_heads < tp)."""
    return max(1.0, model.num_kv_heads / tp)


def _attn_params_per_card(model: ModelSpec, tp: int) -> float:
    h, nh = model.hidden_size, model.num_attention_heads
    if model.attention == "mla":
        m = model.mla
        assert m is not None
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            replicated = h * m.q_lora_rank + m.q_lora_rank
            sharded = m.q_lora_rank * nh * qk
        else:
            replicated, sharded = 0, h * nh * qk
        replicated += h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        sharded += m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim) + nh * m.v_head_dim * h
        return replicated + sharded / tp
    qo = 2 * h * nh * model.head_dim / tp
    return qo + 2 * h * kv_heads_per_card(model, tp) * model.head_dim


def _experts_params_per_card(model: ModelSpec, p: ParallelismSpec, stage_moe_layers: int) -> float:
    m = model.moe
    assert m is not None
    shared = m.num_shared_experts * 3 * model.hidden_size * m.shared_ffn / p.tp
    router = model.hidden_size * m.num_experts
    per_layer_fixed = stage_moe_layers * (shared + router)
    if p.ep == 1:
        return per_layer_fixed + stage_moe_layers * m.num_experts * model.expert_params / p.tp
    local = math.ceil(m.num_experts / p.ep)
    if p.ep <= p.tp:
        return per_layer_fixed + stage_moe_layers * local * model.expert_params * p.ep / p.tp
    return per_layer_fixed + model.num_moe_layers * local * model.expert_params


def _stage_weight_terms(model: ModelSpec, p: ParallelismSpec, stage: int, layers: range,
                        wbytes: float) -> dict[str, float]:
    """Bytes of each weight group on one card of `stage`."""
    dense_cut = model.num_layers - model.num_moe_layers  # MoE models keep their dense layers first
    n_dense = sum(1 for i in layers if i < dense_cut)
    n_moe = len(layers) - n_dense
    emb = model.vocab_size * model.hidden_size / p.tp * KEPT_BYTES
    terms = {
        "attention": len(layers) * _attn_params_per_card(model, p.tp) * wbytes,
        "dense_ffn": n_dense * model.dense_ffn_params / p.tp * wbytes,
        "norms": (2 * len(layers) + (1 if stage == p.pp - 1 else 0)) * model.hidden_size * KEPT_BYTES,
        "embedding": emb if stage == 0 else 0.0,
        "lm_head": emb if stage == p.pp - 1 and not (model.tie_embeddings and p.pp == 1) else 0.0,
    }
    if model.moe is not None:
        terms["experts"] = _experts_params_per_card(model, p, n_moe) * wbytes
    return terms


def weight_bytes_per_gpu(model: ModelSpec, parallelism: ParallelismSpec, weight_dtype: str = "bf16") -> float:
    """Weight bytes on the fullest card of the layout (the worst pipeline stage)."""
    wbytes = _weight_bytes(weight_dtype)
    stages = _stage_ranges(model.num_layers, parallelism.pp)
    return max(sum(_stage_weight_terms(model, parallelism, s, r, wbytes).values()) for s, r in enumerate(stages))


# ---- activations and KV ----------------------------------------------------------------------
def _activation_terms(model: ModelSpec, p: ParallelismSpec, last_stage: bool, o: FitOptions) -> dict[str, float]:
    t, h = o.max_num_batched_tokens, model.hidden_size
    if model.attention == "mla":
        m = model.mla
        assert m is not None
        qkv = model.num_attention_heads / p.tp * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        qkv += m.kv_lora_rank + m.qk_rope_head_dim
    else:
        qkv = (model.num_attention_heads / p.tp + 2 * kv_heads_per_card(model, p.tp)) * model.head_dim
    ffn_width = model.ffn_size / p.tp
    terms = {"hidden": t * ACT_BYTES * 4 * h, "qkv": t * ACT_BYTES * qkv}
    if model.moe is not None:
        m2 = model.moe
        moe_width = (m2.experts_per_token * m2.expert_ffn_size + m2.num_shared_experts * m2.shared_ffn) / p.tp
        ffn_width = max(ffn_width, moe_width)
        terms["moe_dispatch"] = t * m2.experts_per_token * h * ACT_BYTES
    terms["ffn"] = t * ACT_BYTES * 2 * ffn_width
    terms["logits"] = min(t, o.max_num_seqs) * model.vocab_size / p.tp * LOGIT_BYTES if last_stage else 0.0
    return terms


def _kv_bytes_per_token_card(model: ModelSpec, tp: int, stage_layers: int, kv_dtype: str) -> float:
    b = _kv_bytes(kv_dtype)
    if model.attention == "mla":
        assert model.mla is not None
        return stage_layers * (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * b
    return stage_layers * 2 * kv_heads_per_card(model, tp) * model.head_dim * b


def kv_request_tokens(model: ModelSpec, layers: range, tokens: float) -> float:
    """KV tokens at the full per-token cost of `layers` that one sequence of `tokens` positions holds
    (`tokens` without a sliding window; windowed layers keep at most the window)."""
    if not layers or model.window_layers_in(layers) == 0:
        return float(tokens)
    return model.kv_layer_tokens(tokens, layers) / len(layers)


def _weight_bytes(dtype: str) -> float:
    if dtype not in WEIGHT_DTYPES:
        raise SpecError(f"weight dtype {dtype!r} is not supported; use one of {', '.join(WEIGHT_DTYPES)}")
    return dtype_bytes(dtype)


def _kv_bytes(dtype: str) -> float:
    if dtype not in KV_DTYPES:
        raise SpecError(f"kv dtype {dtype!r} is not supported; use one of {', '.join(KV_DTYPES)}")
    return dtype_bytes(dtype)


# ---- one layout ------------------------------------------------------------------------------
def _gb(x: float) -> str:
    return f"{x / 1e9:.2f} GB"


def _stage_fit(model: ModelSpec, gpu: AcceleratorSpec, p: ParallelismSpec, stage: int, layers: range,
               dtypes: tuple[str, str], o: FitOptions) -> LayoutFit:
    wterms = _stage_weight_terms(model, p, stage, layers, _weight_bytes(dtypes[0]))
    aterms = _activation_terms(model, p, stage == p.pp - 1, o)
    usable = gpu.hbm_bytes * o.gpu_memory_utilization
    weights, acts = sum(wterms.values()), sum(aterms.values())
    kv_tok = _kv_bytes_per_token_card(model, p.tp, len(layers), dtypes[1])
    free = usable - weights - acts - o.reserve_bytes
    capacity = max(0, math.floor(free / kv_tok)) if kv_tok > 0 else 0
    ctx = o.context_tokens or model.max_context_tokens
    need = kv_request_tokens(model, layers, ctx)
    terms = {f"weights.{k}": v for k, v in wterms.items() if v} | {f"activations.{k}": v for k, v in aterms.items() if v}
    terms |= {"hbm_bytes": gpu.hbm_bytes, "gpu_memory_utilization": o.gpu_memory_utilization,
              "cuda_graph_bytes": o.cuda_graph_bytes, "workspace_bytes": o.workspace_bytes,
              "stage": stage, "stage_layers": len(layers), "max_num_batched_tokens": o.max_num_batched_tokens}
    lines = [
        f"usable = {_gb(gpu.hbm_bytes)} HBM x {o.gpu_memory_utilization} utilization = {_gb(usable)}",
        f"weights ({dtypes[0]}, stage {stage}: {len(layers)} of {model.num_layers} layers, /tp={p.tp}) = {_gb(weights)}"
        f" [{', '.join(f'{k} {_gb(v)}' for k, v in wterms.items() if v)}]",
        f"activations at {o.max_num_batched_tokens} batched tokens = {_gb(acts)}"
        f" [{', '.join(f'{k} {_gb(v)}' for k, v in aterms.items() if v)}]",
        f"reserve = CUDA graphs {_gb(o.cuda_graph_bytes)} + workspace {_gb(o.workspace_bytes)} = {_gb(o.reserve_bytes)}",
        f"free for KV = {_gb(usable)} - {_gb(weights)} - {_gb(acts)} - {_gb(o.reserve_bytes)} = {_gb(free)}",
        f"KV per token per card ({dtypes[1]}) = {_kv_formula(model, p.tp, len(layers), dtypes[1])} = {kv_tok:.0f} B",
        f"KV capacity = {_gb(max(free, 0.0))} / {kv_tok:.0f} B = {capacity:,} tokens "
        f"({'>=' if capacity >= need else '<'} {need:,.0f} for one request at full context)",
    ]
    if model.window_layers_in(layers):
        terms["sliding_window"] = float(model.sliding_window or 0)
        lines.insert(-1, _window_line(model, layers, ctx, need, capacity))
    return LayoutFit(p.tp, p.pp, p.ep, usable, weights, acts, o.reserve_bytes, kv_tok, free, capacity, ctx,
                     terms, lines, need)


def _window_line(model: ModelSpec, layers: range, ctx: int, need: float, capacity: int) -> str:
    w = model.window_layers_in(layers)
    return (f"sliding window: {w} of {len(layers)} layers keep at most {model.sliding_window:,} tokens, so a "
            f"request at {ctx:,} tokens needs {need:,.0f} tokens of KV ({capacity / need:,.1f} such requests fit)")


def _kv_formula(model: ModelSpec, tp: int, layers: int, kv_dtype: str) -> str:
    b = _kv_bytes(kv_dtype)
    if model.attention == "mla":
        assert model.mla is not None
        return f"{layers} layers x ({model.mla.kv_lora_rank} latent + {model.mla.qk_rope_head_dim} rope) x {b:g} B"
    heads = kv_heads_per_card(model, tp)
    note = " (replicated: kv_heads < tp)" if model.num_kv_heads < tp else ""
    return f"{layers} layers x 2 (k,v) x {heads:g} kv heads{note} x {model.head_dim} head_dim x {b:g} B"


def layout_fit(model: ModelSpec, gpu: AcceleratorSpec, parallelism: ParallelismSpec, weight_dtype: str = "bf16",
               kv_dtype: str = "bf16", options: FitOptions | None = None) -> LayoutFit:
    """Memory of the tightest card (the stage with the fewest KV tokens) of one layout."""
    o = options or FitOptions()
    stages = _stage_ranges(model.num_layers, parallelism.pp)
    fits = [_stage_fit(model, gpu, parallelism, s, r, (weight_dtype, kv_dtype), o) for s, r in enumerate(stages)]
    return min(fits, key=lambda f: (f.kv_capacity_tokens, f.kv_free_bytes))


def kv_capacity_tokens(deployment: Deployment, options: FitOptions | None = None) -> int:
    """KV tokens one replica can hold: every card stores its share of each token, so the tightest card decides."""
    d = deployment
    return layout_fit(d.model, d.accelerator, d.parallelism, d.weight_dtype, d.kv_dtype, options).kv_capacity_tokens


# ---- layout search ---------------------------------------------------------------------------
def tp_candidates(model: ModelSpec, gpu: AcceleratorSpec) -> list[int]:
    """TP degrees inside one node that divide the attention heads and fit the KV-head grouping."""
    out = []
    for tp in range(1, gpu.gpus_per_node + 1):
        if model.num_attention_heads % tp:
            continue
        kv = model.num_kv_heads
        if model.attention == "gqa" and kv % tp and tp % kv:
            continue
        out.append(tp)
    return out


def _first_fit(cands: list[ParallelismSpec], model: ModelSpec, gpu: AcceleratorSpec, dtypes: tuple[str, str],
               o: FitOptions) -> LayoutFit | None:
    for p in sorted(cands, key=lambda c: (c.gpus, c.pp, c.ep)):
        f = layout_fit(model, gpu, p, dtypes[0], dtypes[1], o)
        if f.fits:
            return f
    return None


def _search(model: ModelSpec, gpu: AcceleratorSpec, dtypes: tuple[str, str],
            o: FitOptions) -> tuple[LayoutFit | None, ...]:
    tps = tp_candidates(model, gpu)
    pps = [pp for pp in range(2, model.num_layers + 1) if max(tps) * pp <= o.max_gpus or pp * min(tps) <= o.max_gpus]
    tp_only = [ParallelismSpec(tp=t) for t in tps if t <= o.max_gpus]
    tp_pp = [ParallelismSpec(tp=t, pp=pp) for t in tps for pp in pps if t * pp <= o.max_gpus]
    tp_ep: list[ParallelismSpec] = []
    if model.moe is not None:
        e = model.moe.num_experts
        tp_ep = [ParallelismSpec(tp=t, pp=pp, ep=t * pp) for t in tps for pp in [1, *pps]
                 if 1 < t * pp <= min(o.max_gpus, e) and e % (t * pp) == 0]
    return (_first_fit(tp_only, model, gpu, dtypes, o), _first_fit(tp_pp, model, gpu, dtypes, o),
            _first_fit(tp_ep, model, gpu, dtypes, o) if tp_ep else None)


def fit(model: ModelSpec, gpu: AcceleratorSpec, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
        options: FitOptions | None = None) -> FitReport:
    """Does `model` fit one `gpu` with its minimal runtime state? If not, the smallest layouts that do.

    `min_tp`: smallest TP inside a node (pp=1); `min_tp_pp`: fewest GPUs with pp >= 2 (ties: fewer
    stages); `min_tp_ep` (MoE only): fewest GPUs with experts spread over all of them (ep = tp*pp).
    All three are None when one card fits.
    """
    o = options or FitOptions()
    _weight_bytes(weight_dtype), _kv_bytes(kv_dtype)
    dtypes = (weight_dtype, kv_dtype)
    single = layout_fit(model, gpu, ParallelismSpec(), weight_dtype, kv_dtype, o)
    found: tuple[LayoutFit | None, ...] = (None, None, None)
    if not single.fits:  # the search answers "on what, then?"; a model that fits one card needs none
        found = _search(model, gpu, dtypes, o)
    min_tp, min_tp_pp, min_tp_ep = found
    lines = _summary(model, gpu, dtypes, single, (min_tp, min_tp_pp, min_tp_ep), o)
    return FitReport(model.name, gpu.name, weight_dtype, kv_dtype, model.params_total, model.params_active,
                     single, min_tp, min_tp_pp, min_tp_ep, lines)


def _summary(model: ModelSpec, gpu: AcceleratorSpec, dtypes: tuple[str, str], single: LayoutFit,
             found: tuple[LayoutFit | None, ...], o: FitOptions) -> list[str]:
    total_w = model.weight_bytes(dtypes[0])
    lines = [f"{model.name}: {model.params_total / 1e9:.2f}B parameters -> {_gb(total_w)} of {dtypes[0]} weights "
             f"(embeddings and norms kept bf16)"]
    if model.moe is not None:
        lines.append(
            f"MoE: memory follows total params ({model.params_total / 1e9:.1f}B), compute follows active "
            f"({model.params_active / 1e9:.1f}B, {model.moe.experts_per_token} of {model.moe.num_experts} experts"
            f" + {model.moe.num_shared_experts} shared): compute ratio {model.params_active / model.params_total:.4f}"
            f" = 1/{model.params_total / model.params_active:.1f} of a dense model this size")
    verdict = "fits" if single.fits else "does not fit"
    lines.append(f"one {gpu.name} ({_gb(gpu.hbm_bytes)}): {verdict} "
                 f"(free for KV {_gb(single.kv_free_bytes)}, {single.kv_capacity_tokens:,} tokens)")
    if not single.fits:
        names = ("smallest TP in a node", f"smallest TP x PP (PP >= 2, <= {o.max_gpus} GPUs)",
                 "smallest TP x EP (experts over all GPUs of the replica)")
        for name, f in zip(names, found, strict=False):
            if f is None:
                if name.endswith("replica)") and model.moe is None:
                    continue
                lines.append(f"{name}: none fits")
            else:
                lines.append(f"{name}: {f.label} on {f.gpus} GPUs, KV free {_gb(f.kv_free_bytes)} per card "
                             f"= {f.kv_capacity_tokens:,} tokens")
    return lines
