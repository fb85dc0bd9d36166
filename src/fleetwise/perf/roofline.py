"""`PerfModel`: the roofline step-time model shared by planner, simulator and emulator.

Owns the cost of one engine step (a phase-free batch on one deployment) and its breakdown.
Does not own the factors' values (`Profile`), their fitting (`calibrate`) or KV hand-off
between replicas (`kv`). Everything is per GPU of one pipeline stage; stages run in series for
one step, so a step crosses every layer once.

Notation: T new tokens (GEMM rows), S sequences, P peak FLOP/s at the weight compute dtype,
B peak HBM bytes/s, wb weight bytes/element, ab = 2 activation bytes/element, tp/pp/ep degrees.

- Dense GEMMs (QKV, O, gate/up, down, router, shared experts, MLA projections), aggregated over
  the model's W weights per GPU and A = sum of (N+K) activation widths:
      t = max(2*W*T / (P*eff_c(T)), (W*wb + T*A*ab) / (B*gemm_mem_eff)),
      eff_c(M) = gemm_compute_eff * M / (M + min(M, gemm_m_half_tokens)).
  The padding rows are tile waste: a kernel runs M rows in a tile of at most the next power of two
  from the MMA's 16 rows (cuBLAS/CUTLASS small-M tiles, Marlin's 16-row blocks), so it never computes
  more padding rows than real ones; a GEMV of one row pays about one row, not gemm_m_half_tokens.
  Without the cap a weight-only int4 GEMM (bf16 tensor work, a quarter of the bytes) at batch 1 was
  compute-bound on 109 rows and barely faster than bf16.
  LM head: the same roofline with M = S rows (logits of each sequence's last position only), its
  weights bf16 whatever the weight dtype (quantised checkpoints keep it unquantised).
- Routed experts, per MoE layer and GPU, from what physically drives them: expected experts
  touched by T tokens X = E*(1-(1-k/E)^T), X/ep per rank; routed rows per rank
  R = min(T*k, T*k*imbalance/ep); m = R/(X/ep) tokens per touched expert; expert size 3*h*f/etp;
      t = max(2*3*h*f/etp*(R + (X/ep)*gemm_m_half_tokens) / (P*gemm_compute_eff*g(h, f/etp)),
              (X/ep)*(3*h*f/etp*wb/(B*gemm_mem_eff) + expert_group_s) + R*(2h+3f/etp)*ab/(B*gemm_mem_eff))
          + (moe_row_hidden_passes*h + moe_row_ffn_passes*f/etp)*R*ab/(B*kv_mem_eff).
  Compute: each touched expert's GEMM runs at the dense small-M efficiency m/(m+gemm_m_half_tokens),
  i.e. every touched expert pays about a tensor-core tile of rows on top of its m (the same tile
  physics as the dense GEMMs, no MoE-only constant). g is the grouped kernel's rate relative to a
  dense GEMM, from the expert's shape: a tile of reduction K runs at K/(K + grouped_tile_k), gate/up
  reduce over h (2/3 of the FLOPs) and down over f/etp, so g = 1/(2/3*(1+kt/h) + 1/3*(1+kt/(f/etp))):
  narrow experts (Qwen3-30B-A3B: h 2048, f 768) run far below a dense GEMM, wide ones (Mixtral:
  4096, 14336) close to it. Memory: only touched experts' weights are read, so small decode steps
  are weight-bound on X. Row traffic: the routed rows' passes outside the GEMMs (gather,
  SiLU*mul, routing weights, scatter-add), counted from the implementation, not fitted.
  etp = max(1, tp//ep) shards each expert when tp exceeds ep.
- Attention per layer and GPU: prompt rows (chunks) are compute-bound flash attention,
      t_pre = 2*(H/tp)*(d_qk+d_v)*pairs_pre / (P_bf16*attn_compute_eff)
  (4*H*d*pairs for GQA); decode rows are bandwidth-bound on the KV they read,
      t_dec = max(kvb_layer*max(kv_dec, longest*attn_saturation_units/U_seq) / (B*kv_mem_eff), flops/(P*eff)),
  U = decode sequences x KV heads per GPU (work units; too few leave SMs idle: the longest row then
  streams at 1/attn_saturation_units of the bandwidth per KV head). Decode rows are
  T - prefill_tokens; the streamed KV is kv_read_tokens - prefill_tokens: the decode rows' and the
  prompt chunks' cached context (a chunk reads its cached KV like a decode row, with or without decode
  rows in the step; its longest row counts in the bound), their pairs are the rest of attn_pairs.
  MLA reads the latent.
  Sliding-window layers (`ModelSpec.sliding_window` W) read and attend over at most W positions:
  their decode KV is min(kv_dec, rows*W) (longest row min(longest, W)) and their prompt pairs
  min(pairs_pre, prefill_tokens*W). Both are upper bounds from the batch's sums, exact when every
  decode row sits on one side of the window and every prompt within it; the other layers are priced
  as above, so past the window a decode step grows with context through the full layers only.
- Elementwise traffic, counted per token and layer from the implementation (norms, residual adds,
  RoPE by halves, K/V expanded to the query heads, the attention output's copy, SiLU and gate*up):
      T * (10*h + 13*H*d/tp + 11*K*d/tp [+ 5*ffn/tp, dense layers]) * ab / (B*elementwise_mem_eff)
  (`Profile.elementwise_*_passes`) plus the KV write of the T new tokens at kv_mem_eff.
- TP: 2 all-reduces per layer of T*h*ab bytes: 2*(tp-1)/tp*bytes/link_bw + latency (intra-node;
  the ring all-reduce's bus traffic, NCCL's performance notes). PP: (pp-1) activation sends of
  T*h*ab. EP: dispatch+combine per MoE layer of T*k*h*ab*imbalance*(ep-1)/ep (the busiest rank's
  share of the routed rows) over the intra-node link
  (network when ep exceeds a node): each of the T*k routed rows leaves its rank unless its expert
  is local (probability 1/ep under even placement), once to dispatch and once to combine, as in
  GShard's all-to-all (Lepikhin et al., 2020) and DeepEP's dispatch/combine. None of the TP, PP or
  EP terms is validated against a multi-GPU measurement (the ground truth is one GPU): they are
  textbook volumes at the catalog's link bandwidth, without congestion or kernel overlap.
- Overhead: n = layers*attn_kernels + dense_layers*ffn_kernels + moe_layers*moe_kernels*moe_kernel_weight
  + step_kernels (+2 per layer under TP, +2 per MoE layer under EP). CUDA-graph steps add
  n*kernel_graph_s of GPU time; eager steps are the smooth max of host launch time and GPU time:
      total = (gpu^p + (n*kernel_eager_s)^p)^(1/p),  p = eager_overlap_p.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleetwise.perf.memory import KEPT_BYTES, kv_heads_per_card
from fleetwise.perf.profile import Profile
from fleetwise.perf.types import BatchShape, Deployment, SeqWork, StepCost
from fleetwise.perf.uncertainty import Band, band, residuals_of
from fleetwise.spec.dtypes import COMPUTE_DTYPE_FOR_WEIGHTS, dtype_bytes
from fleetwise.spec.hardware import LinkSpec
from fleetwise.spec.model import ModelSpec

ACT_BYTES = 2.0  # activations stay in bf16
MLA_HEADS_PER_UNIT = 16  # MLA decode kernels split the heads of one latent into blocks of 16
# Collectives per step (each is one kernel and one link latency). TP: the attention output and the
# FFN output all-reduce of every layer (Megatron-LM's layer split, Shoeybi et al. 2019). EP: the
# dispatch and the combine all-to-all of every MoE layer (GShard; DeepEP). PP: a send and a receive
# per stage boundary. Counted from those designs, not measured.
TP_ALLREDUCES_PER_LAYER = 2
EP_ALLTOALLS_PER_MOE_LAYER = 2
PP_KERNELS_PER_BOUNDARY = 2


@dataclass(frozen=True, slots=True)
class _Dense:
    """Aggregated dense GEMMs of one GPU: weight elements W and activation width A per row."""

    weights: float
    act_width: float


def _attn_gemms(m: ModelSpec, tp: int) -> _Dense:
    """QKV/O (GQA) or the MLA projections of one layer; the rank-compressing ones are replicated."""
    h, nh = m.hidden_size, m.num_attention_heads
    if m.attention == "mla" and m.mla is not None:
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        kv_a = h * (a.kv_lora_rank + a.qk_rope_head_dim)
        kv_b = a.kv_lora_rank * nh * (a.qk_nope_head_dim + a.v_head_dim) / tp
        o = nh * a.v_head_dim * h / tp
        if a.q_lora_rank:
            q = h * a.q_lora_rank + a.q_lora_rank * nh * qk / tp
            q_w = h + a.q_lora_rank * 2 + nh * qk / tp
        else:
            q, q_w = h * nh * qk / tp, h + nh * qk / tp
        width = q_w + h + a.kv_lora_rank + a.qk_rope_head_dim + a.kv_lora_rank
        width += nh * (a.qk_nope_head_dim + a.v_head_dim) / tp + nh * a.v_head_dim / tp + h
        return _Dense(q + kv_a + kv_b + o, width)
    qkv_n = (nh / tp + 2 * kv_heads_per_card(m, tp)) * m.head_dim  # K/V heads replicated when kv_heads < tp
    o_k = nh * m.head_dim / tp
    return _Dense(h * qkv_n + o_k * h, h + qkv_n + o_k + h)


def _dense_weights(m: ModelSpec, tp: int) -> _Dense:
    """All dense GEMMs of the model on one GPU (attention, dense FFNs, routers, shared experts)."""
    h = m.hidden_size
    att = _attn_gemms(m, tp)
    w = m.num_layers * att.weights
    a = m.num_layers * att.act_width
    if m.num_dense_layers:
        f = m.ffn_size / tp
        w += m.num_dense_layers * 3 * h * f
        a += m.num_dense_layers * (h + 2 * f + f + h)
    if m.moe is not None:
        mo = m.moe
        fs = mo.num_shared_experts * mo.shared_ffn / tp
        w += m.num_moe_layers * (h * mo.num_experts + 3 * h * fs)
        a += m.num_moe_layers * (h + mo.num_experts + (h + 3 * fs + h if fs else 0.0))
    return _Dense(w, a)


def grouped_efficiency(hidden: float, expert_ffn: float, tile_k: float) -> float:
    """Rate of an expert's grouped GEMMs relative to a dense GEMM (0-1]: gate/up reduce over the hidden
    size (2/3 of the FLOPs), down over the expert FFN (1/3); a tile of reduction K runs at K/(K+tile_k)."""
    return 1.0 / (2.0 / 3.0 * (1.0 + tile_k / hidden) + 1.0 / 3.0 * (1.0 + tile_k / expert_ffn))


def _link_time(bytes_: float, link: LinkSpec) -> float:
    return bytes_ / link.bandwidth_bytes_per_s + link.latency_s


class BoundPerf:
    """The model bound to one deployment: every per-deployment constant precomputed.

    `step_time_s(shape)` is the simulator's hot path (plain float math); `step_cost(shape)`
    returns the same total with its breakdown. Both run `_evaluate`, so they agree exactly.
    """

    def __reduce__(self) -> tuple[type[BoundPerf], tuple[Deployment, Profile]]:
        """Pickled and copied as its two inputs (the compiled class has no default constructor; the
        planner's worker processes receive it): rebuilding gives the same constants."""
        return (BoundPerf, (self.deployment, self.profile))

    def __init__(self, deployment: Deployment, profile: Profile) -> None:
        self.deployment, self.profile = deployment, profile
        d, p, m = deployment, profile, deployment.model
        par, acc = d.parallelism, d.accelerator
        tp = par.tp
        peak = acc.peak_flops(COMPUTE_DTYPE_FOR_WEIGHTS.get(d.weight_dtype, "bf16"))
        bw = acc.hbm_bytes_per_s
        wb, kvb = dtype_bytes(d.weight_dtype), dtype_bytes(d.kv_dtype)
        h = m.hidden_size
        self.layers, self.moe_layers = m.num_layers, m.num_moe_layers

        dense = _dense_weights(m, tp)
        # Dense GEMM roofline: compute = c_dense*(T + min(T, m_half)), memory = w_dense + a_dense*T.
        self.c_dense = 2 * dense.weights / (peak * p.gemm_compute_eff)
        self.m_half = p.gemm_m_half_tokens
        self.w_dense = dense.weights * wb / (bw * p.gemm_mem_eff)
        self.a_dense = dense.act_width * ACT_BYTES / (bw * p.gemm_mem_eff)
        # The LM head stays bf16 under fp8/int4 (as the memory fit and ModelSpec.weight_bytes store it).
        lm, peak_lm = m.vocab_size * h / tp, acc.peak_flops("bf16")
        self.c_lm = 2 * lm / (peak_lm * p.gemm_compute_eff)
        self.w_lm = lm * KEPT_BYTES / (bw * p.gemm_mem_eff)
        self.a_lm = (h + m.vocab_size / tp) * ACT_BYTES / (bw * p.gemm_mem_eff)

        self._bind_experts(d, p, peak, bw, wb)
        self._bind_attention(d, p, bw, kvb)
        # Counted elementwise traffic (norms, residuals, RoPE, K/V expansion, copies) plus the KV write, per token.
        q_w, kv_w = m.num_attention_heads * m.head_dim / tp, kv_heads_per_card(m, tp) * m.head_dim
        elems = (m.num_layers * (p.elementwise_hidden_passes * h + p.elementwise_qhead_passes * q_w
                                 + p.elementwise_kvhead_passes * kv_w)
                 + m.num_dense_layers * p.elementwise_ffn_passes * m.ffn_size / tp)
        self.e_tok = (elems * ACT_BYTES / (bw * p.elementwise_mem_eff)
                      + m.num_layers * self.kv_layer_bytes / (bw * p.kv_mem_eff))
        self._bind_comm(d, h)
        self._bind_overhead(d, p)
        # PP with micro-batches in flight: a batch of S sequences splits into m = min(micro, S)
        # micro-batches; in steady state each stage runs each micro-batch once per round, so every
        # sequence advances one token per round = the whole model's time at 1/m of the batch, and
        # no less than its largest sequence alone (`_largest_row_s`).
        self.micro = (d.pp_microbatches or par.pp) if par.pp > 1 else 1
        self._decode_consts: dict[int, tuple[float, float, float, float, float]] = {}

    # ---- binding phases -------------------------------------------------------------------
    def _bind_experts(self, d: Deployment, p: Profile, peak: float, bw: float, wb: float) -> None:
        m, par = d.model, d.parallelism
        self.has_moe = m.moe is not None and m.num_moe_layers > 0
        if not self.has_moe:
            return
        mo = m.moe
        assert mo is not None
        h, f = m.hidden_size, mo.expert_ffn_size
        ep = par.ep_stage  # a layer's experts are spread over its own stage's EP ranks
        etp = max(1, par.tp // ep)
        self.n_exp, self.topk, self.ep = float(mo.num_experts), float(mo.experts_per_token), float(ep)
        self.miss = 1.0 - mo.experts_per_token / mo.num_experts
        self.imbalance = max(1.0, float(getattr(d, "expert_load_imbalance", 1.0)))
        L = m.num_moe_layers
        geff = grouped_efficiency(h, f / etp, p.grouped_tile_k)
        self.c_exp = L * 2 * 3 * h * f / etp / (peak * p.gemm_compute_eff * geff)
        self.g_half = p.gemm_m_half_tokens  # rows each touched expert's GEMM wastes (small-M tiles)
        self.w_exp = L * (3 * h * f / etp * wb / (bw * p.gemm_mem_eff) + p.expert_group_s)
        self.a_exp = L * (2 * h + 3 * f / etp) * ACT_BYTES / (bw * p.gemm_mem_eff)
        row_bytes = (p.moe_row_hidden_passes * h + p.moe_row_ffn_passes * f / etp) * ACT_BYTES
        self.r_exp = L * row_bytes / (bw * p.kv_mem_eff)

    def _bind_attention(self, d: Deployment, p: Profile, bw: float, kvb: float) -> None:
        m, tp = d.model, d.parallelism.tp
        peak16 = d.accelerator.peak_flops("bf16")
        heads = m.num_attention_heads / tp
        if m.attention == "mla" and m.mla is not None:
            a = m.mla
            self.kv_layer_bytes = (a.kv_lora_rank + a.qk_rope_head_dim) * kvb
            pre_flops = 2 * heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim)
            dec_flops = 2 * heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
            self.units_per_seq = max(1.0, heads / MLA_HEADS_PER_UNIT)
        else:
            kvh = kv_heads_per_card(m, tp)
            self.kv_layer_bytes = 2 * kvh * m.head_dim * kvb
            pre_flops = dec_flops = 4 * heads * m.head_dim
            self.units_per_seq = kvh
        Lw = m.num_window_layers
        L = m.num_layers - Lw  # full-attention layers; the windowed ones below
        self.c_attn_pre = L * pre_flops / (peak16 * p.attn_compute_eff)
        self.c_attn_dec = L * dec_flops / (peak16 * p.attn_compute_eff)
        self.kv_read = L * self.kv_layer_bytes / (bw * p.kv_mem_eff)
        self.seq_per_sat = p.attn_saturation_units / self.units_per_seq
        self.window = float(m.sliding_window or 0) if Lw else 0.0
        self.w_attn_pre = Lw * pre_flops / (peak16 * p.attn_compute_eff)
        self.w_attn_dec = Lw * dec_flops / (peak16 * p.attn_compute_eff)
        self.w_kv_read = Lw * self.kv_layer_bytes / (bw * p.kv_mem_eff)

    def _bind_comm(self, d: Deployment, h: int) -> None:
        par, acc = d.parallelism, d.accelerator
        tp, pp, ep = par.tp, par.pp, par.ep_stage
        intra, net = acc.intra_node_link, acc.network
        tok = h * ACT_BYTES
        # TP: ring all-reduces (bus bytes 2*(tp-1)/tp per byte); per token bytes and a fixed latency per step.
        n_ar = TP_ALLREDUCES_PER_LAYER * self.layers
        self.tp_tok = n_ar * 2 * (tp - 1) / tp * tok / intra.bandwidth_bytes_per_s if tp > 1 else 0.0
        self.tp_fix = n_ar * intra.latency_s if tp > 1 else 0.0
        pp_link = net if par.gpus > acc.gpus_per_node else intra
        self.pp_tok = (pp - 1) * tok / pp_link.bandwidth_bytes_per_s
        self.pp_fix = (pp - 1) * pp_link.latency_s
        ep_link = net if ep > acc.gpus_per_node else intra
        k = d.model.moe.experts_per_token if d.model.moe is not None else 0
        moe_l = self.moe_layers
        n_a2a = EP_ALLTOALLS_PER_MOE_LAYER * moe_l
        # The busiest rank receives `imbalance` times the mean rank's routed rows, and every layer's
        # all-to-all waits for it: the volume comes from the skewed counts, not the balanced average.
        skew = max(1.0, float(d.expert_load_imbalance))
        self.ep_tok = n_a2a * k * tok * skew * (ep - 1) / ep / ep_link.bandwidth_bytes_per_s if ep > 1 else 0.0
        self.ep_fix = n_a2a * ep_link.latency_s if ep > 1 else 0.0

    def _bind_overhead(self, d: Deployment, p: Profile) -> None:
        par = d.parallelism
        dense_l = self.layers - self.moe_layers
        n = (self.layers * p.attn_kernels_per_layer + dense_l * p.ffn_kernels_per_layer
             + self.moe_layers * p.moe_kernels_per_layer * p.moe_kernel_weight + p.step_kernels)
        n += (TP_ALLREDUCES_PER_LAYER * self.layers * (par.tp > 1)
              + EP_ALLTOALLS_PER_MOE_LAYER * self.moe_layers * (par.ep_stage > 1) + PP_KERNELS_PER_BOUNDARY * (par.pp - 1))
        self.kernels = n
        self.graph_s = n * p.kernel_graph_s
        self.eager = not d.cuda_graphs
        self.host_s = n * p.kernel_eager_s
        self.p_exp = p.eager_overlap_p

    # ---- evaluation -----------------------------------------------------------------------
    def step_time_s(self, shape: BatchShape) -> float:
        """Seconds of one step of `shape` (hot path: a few microseconds of float math)."""
        return self._evaluate(shape, None)

    def decode_time_s(self, n: int, kv: int, longest: int = 0) -> float:
        """`step_time_s(BatchShape(n, n, kv, float(kv), 0, 1, longest))`, bit for bit: a
        decode-only step of `n` rows reading `kv` KV positions, the longest row `longest` (0:
        unknown). The engine's fused decode planning evaluates these shapes several times per
        step; what depends on `n` alone is summed once per `n` in `_evaluate`'s order."""
        if n <= 0:
            return 0.0
        c = self._decode_consts.get(n)
        if c is None:
            c = self._decode_consts[n] = self._decode_terms(n)
        head, elem, comm_tp, comm_pp, comm_ep = c
        dec_kv = float(kv) if kv > 0 else 0.0  # float(): what the arithmetic below converts it to
        rows = float(n)
        if self.micro > 1 and n > 1:  # as `_evaluate`: one micro-batch of the round
            f = 1.0 / (self.micro if self.micro < n else n)
            dec_kv, rows = dec_kv * f - 0 * f, n * f
        top = float(longest) if longest > 0 else dec_kv / rows
        sat = top * self.seq_per_sat
        kv_m = self.kv_read * (sat if sat > dec_kv else dec_kv)  # max(): the same value
        a_dec = self.c_attn_dec * dec_kv
        if self.window:
            w_kv_m, w_a_dec = self._window_decode(dec_kv, rows, top)
            kv_m, a_dec = kv_m + w_kv_m, a_dec + w_a_dec
        gpu = head + (a_dec if a_dec > kv_m else kv_m) + elem + comm_tp + comm_pp + comm_ep + self.graph_s
        if self.eager:
            p = self.p_exp
            gpu = (gpu ** p + self.host_s ** p) ** (1.0 / p)
        if self.micro > 1 and n > 1:  # as `_evaluate`: no less than the longest row alone
            floor = self._largest_row_s(1, longest if longest > 0 else kv // n)
            return gpu if gpu >= floor else floor
        return gpu

    def _largest_row_s(self, max_new: int, longest: int) -> float:
        """Pipeline parallelism: seconds of the step's largest sequence alone (its longest prompt chunk, from
        no context; its longest decode row), a floor under the averaged micro-batch: a round waits for the
        micro-batch holding it, so one more sequence never makes a step cheaper."""
        t = 0.0
        if max_new > 1:
            t = self._evaluate_sums(1, max_new, max_new, max_new * (max_new + 1) / 2, max_new, 0, None, max_new)
        if longest > 0:
            d = self.decode_time_s(1, longest, longest)
            t = t if t >= d else d
        return t

    def _window_decode(self, dec_kv: float, rows: float, longest: float) -> tuple[float, float]:
        """Sliding-window layers' decode KV read and attention FLOP time: each row reads at most the window."""
        w = self.window
        kv = min(dec_kv, rows * w)
        top = min(longest, w) * self.seq_per_sat
        return self.w_kv_read * max(kv, top), self.w_attn_dec * kv

    def _gemm_terms(self, T: float, S: float) -> tuple[float, float, float, float, float, float, float]:
        """Roofline sides of the dense GEMMs and LM head (T token rows, S sequence rows) and of
        the routed experts: (dense compute, dense memory, LM compute, LM memory, expert compute,
        expert memory, expert row traffic)."""
        # Tile padding: no more padding rows than real rows (small-M tiles), at most m_half.
        mh = self.m_half
        d_c, d_m = self.c_dense * (T + (T if T < mh else mh)), self.w_dense + self.a_dense * T
        l_c, l_m = self.c_lm * (S + (S if S < mh else mh)), self.w_lm + self.a_lm * S
        x_c = x_m = x_r = 0.0
        if self.has_moe:
            touched = self.n_exp * (1.0 - self.miss ** T) / self.ep
            rows = T * self.topk
            rows = min(rows, rows * self.imbalance / self.ep)
            x_c = self.c_exp * (rows + touched * self.g_half)
            x_m = self.w_exp * touched + self.a_exp * rows
            x_r = self.r_exp * rows
        return d_c, d_m, l_c, l_m, x_c, x_m, x_r

    def _decode_terms(self, n: int) -> tuple[float, float, float, float, float]:
        """For `decode_time_s`: the sum of `_evaluate`'s terms before attention (GEMMs, LM head,
        experts; the prompt-attention term is 0.0 without prompt rows), then elementwise and
        each communication term, evaluated exactly as `_evaluate` does for `n` decode rows."""
        T = float(n)
        if self.micro > 1 and n > 1:
            T = n * (1.0 / (self.micro if self.micro < n else n))
        d_c, d_m, l_c, l_m, x_c, x_m, x_r = self._gemm_terms(T, T)
        head = max(d_c, d_m) + max(l_c, l_m) + max(x_c, x_m) + x_r + 0.0
        return (head, self.e_tok * T, self.tp_tok * T + self.tp_fix, self.pp_tok * T + self.pp_fix,
                self.ep_tok * T + self.ep_fix)

    def routed_experts_s(self, tokens: float) -> float:
        """Seconds of the routed-expert work of `tokens` new tokens (grouped GEMMs and row traffic,
        all MoE layers of this GPU); 0.0 for a dense model."""
        *_, x_c, x_m, x_r = self._gemm_terms(tokens, 1.0)
        return max(x_c, x_m) + x_r

    def step_cost(self, shape: BatchShape) -> StepCost:
        """The step's seconds with the breakdown that explains them."""
        parts: dict[str, float] = {}
        total = self._evaluate(shape, parts)
        return _cost(total, parts)

    def batch_time_s(self, n: int, new: int, kv: int, pairs: float, pre: int, mx: int, longest: int) -> float:
        """`step_time_s(BatchShape(n, new, kv, pairs, pre, mx, longest))`, bit for bit, without
        building the shape (the engine prices every step with prompt chunks this way)."""
        return self._evaluate_sums(n, new, kv, pairs, pre, longest, None, mx)

    def _evaluate(self, s: BatchShape, parts: dict[str, float] | None) -> float:
        return self._evaluate_sums(s.num_seqs, s.new_tokens, s.kv_read_tokens, s.attn_pairs, s.prefill_tokens,
                                   s.max_decode_kv_tokens, parts, s.max_new_tokens)

    def _evaluate_sums(self, num_seqs: int, new_tokens: int, kv_read_tokens: int, attn_pairs: float,
                       prefill_tokens: int, max_decode_kv: int, parts: dict[str, float] | None,
                       max_new: int = 0) -> float:
        # Token counts as floats (exact below 2**53): the values the int arithmetic gave.
        T = float(new_tokens)
        if T <= 0:
            return 0.0
        S = float(num_seqs) if num_seqs > 0 else 1.0
        kv_read = float(kv_read_tokens)
        pairs: float = attn_pairs
        pre = float(prefill_tokens)
        if self.micro > 1 and S > 1:  # one micro-batch of the round (see __init__)
            f = 1.0 / (self.micro if self.micro < S else S)
            T, S, kv_read, pairs, pre = T * f, S * f, kv_read * f, pairs * f, pre * f
        d_c, d_m, l_c, l_m, x_c, x_m, x_r = self._gemm_terms(T, S)
        # Attention: prompt rows compute-bound, decode rows bandwidth-bound on their KV.
        dec = T - pre
        # Streamed KV: decode rows' (context + 1) and prompt chunks' cached context (kv_read - pre).
        dec_kv = kv_read - pre
        if dec_kv < 0:
            dec_kv = 0.0
        pre_pairs = pairs - dec_kv
        a_pre = self.c_attn_pre * pre_pairs if pre_pairs > 0 else 0.0
        kv_m = 0.0
        longest = 0.0
        streams = dec if dec > 0 else S  # rows streaming KV: the decode rows, else the chunks
        if dec > 0 or dec_kv > 0:
            # Saturated: all KV bytes at full bandwidth. Too few (row x KV head) units: the longest
            # row streams at the bandwidth of one unit, 1/attn_saturation_units of the card's.
            longest = max_decode_kv if max_decode_kv > 0 else dec_kv / streams
            kv_m = self.kv_read * max(dec_kv, longest * self.seq_per_sat)
        a_dec = self.c_attn_dec * dec_kv
        if self.window:  # sliding-window layers: at most the window per row and per prompt token
            if pre_pairs > 0:
                a_pre += self.w_attn_pre * min(pre_pairs, pre * self.window)
            w_kv_m, w_a_dec = self._window_decode(dec_kv, streams, longest) if dec > 0 or dec_kv > 0 else (0.0, 0.0)
            kv_m, a_dec = kv_m + w_kv_m, a_dec + w_a_dec
        elem = self.e_tok * T
        comm_tp = self.tp_tok * T + self.tp_fix
        comm_pp = self.pp_tok * T + self.pp_fix
        comm_ep = self.ep_tok * T + self.ep_fix
        work = (max(d_c, d_m) + max(l_c, l_m) + max(x_c, x_m) + x_r + a_pre + max(kv_m, a_dec) + elem
                + comm_tp + comm_pp + comm_ep)
        gpu = work + self.graph_s
        if self.eager:
            p = self.p_exp
            total = (gpu ** p + self.host_s ** p) ** (1.0 / p)
        else:
            total = gpu
        if self.micro > 1 and num_seqs > 1:  # the round waits for its largest micro-batch
            rows = new_tokens - prefill_tokens
            top = max_decode_kv if max_decode_kv > 0 else ((kv_read_tokens - prefill_tokens) // rows if rows > 0 else 0)
            floor = self._largest_row_s(max_new, top)
            total = total if total >= floor else floor
        if parts is not None:
            parts.update(gemm_c=d_c + l_c + x_c, gemm_m=d_m + l_m + x_m, dense=max(d_c, d_m) + max(l_c, l_m),
                         experts=max(x_c, x_m), x_c=x_c, d_c=d_c, l_c=l_c, d_m=d_m, l_m=l_m, x_m=x_m,
                         kv_m=kv_m, a_pre=a_pre, a_dec=a_dec, elem=elem + x_r, tp=comm_tp, pp=comm_pp,
                         ep=comm_ep, overhead=total - work)
        return total


def _cost(total: float, q: dict[str, float]) -> StepCost:
    """Breakdown: each roofline's time goes to the side that bounds it."""
    if total <= 0.0:
        return StepCost(0.0)
    compute = (q["d_c"] if q["d_c"] >= q["d_m"] else 0.0) + (q["l_c"] if q["l_c"] >= q["l_m"] else 0.0)
    compute += q["x_c"] if q["x_c"] >= q["x_m"] else 0.0
    compute += q["a_pre"] + (q["a_dec"] if q["a_dec"] > q["kv_m"] else 0.0)
    memory = (q["d_m"] if q["d_m"] > q["d_c"] else 0.0) + (q["l_m"] if q["l_m"] > q["l_c"] else 0.0)
    memory += (q["x_m"] if q["x_m"] > q["x_c"] else 0.0) + (q["kv_m"] if q["kv_m"] >= q["a_dec"] else 0.0)
    memory += q["elem"]
    comm = q["tp"] + q["pp"] + q["ep"]
    shares = {"compute": compute, "memory": memory, "communication": comm, "overhead": q["overhead"]}
    bound = max(shares, key=lambda k: shares[k])
    return StepCost(
        total_s=total, gemm_compute_s=q["gemm_c"], weight_memory_s=q["gemm_m"], kv_memory_s=q["kv_m"],
        attention_s=q["a_pre"] + q["a_dec"], tp_comm_s=q["tp"], pp_comm_s=q["pp"], ep_comm_s=q["ep"],
        overhead_s=q["overhead"], bound=bound,
    )


class PerfModel:
    """Roofline with efficiency factors from a `Profile` (defaults when none is given)."""

    def __init__(self, profile: Profile | None = None) -> None:
        self.profile = profile if profile is not None else Profile()
        self._bound: dict[int, tuple[Deployment, BoundPerf]] = {}
        self._residuals = residuals_of(self.profile.residuals)

    def bind(self, deployment: Deployment) -> BoundPerf:
        """Precompute everything per deployment (cached while the deployment object lives)."""
        hit = self._bound.get(id(deployment))
        if hit is not None and hit[0] is deployment:
            return hit[1]
        bound = BoundPerf(deployment, self.profile)
        if len(self._bound) >= 256:
            self._bound.clear()
        self._bound[id(deployment)] = (deployment, bound)
        return bound

    def step_cost(self, batch: Iterable[SeqWork] | BatchShape, deployment: Deployment) -> StepCost:
        """Seconds of one step of `batch` on `deployment`, with its breakdown."""
        shape = batch if isinstance(batch, BatchShape) else BatchShape.of(batch)
        return self.bind(deployment).step_cost(shape)

    def step_time_s(self, batch: Iterable[SeqWork] | BatchShape, deployment: Deployment) -> float:
        """Total seconds only (same number as `step_cost(...).total_s`)."""
        shape = batch if isinstance(batch, BatchShape) else BatchShape.of(batch)
        return self.bind(deployment).step_time_s(shape)

    def step_time_band(self, batch: Iterable[SeqWork] | BatchShape, deployment: Deployment) -> Band:
        """Seconds of one step with the band the calibration's held-out errors on the nearest measured
        shapes give it (`Band.points` 0 when the profile holds no residuals)."""
        shape = batch if isinstance(batch, BatchShape) else BatchShape.of(batch)
        return band(self.bind(deployment).step_time_s(shape), shape, self._residuals)
