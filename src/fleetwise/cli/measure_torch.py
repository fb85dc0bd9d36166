"""The steps `fleetwise measure` times: a Llama-architecture decoder in PyTorch, random weights.

Owns the model the harness runs and how one step is timed; `measure_cmd` owns the grid, the
file and the command line. The work of each step is the ground truth's (`perf/ground_truth/README.md`),
so a file measured here calibrates the same cost formulas:

- RMSNorm, fused QKV GEMM, RoPE, GQA attention by `scaled_dot_product_attention` on fused kernels
  only (flash, cuDNN or memory-efficient: never the unfused math path on a GPU), O GEMM, then a
  SwiGLU FFN or a top-k MoE block (router softmax, top-k, tokens sorted by expert, one grouped GEMM
  per projection: `torch._grouped_mm` on a GPU, a loop of matrix products elsewhere, scatter-add).
- prefill: `batch` fresh sequences of `seq` tokens in one eager pass, logits of the last position;
  decode: one token for each of `batch` sequences whose KV cache holds `ctx` positions; mixed:
  the same decodes plus one fresh prompt chunk of `chunk` tokens in the same pass.
- On a CUDA device decode and mixed steps are captured in a CUDA graph and replayed, as serving
  engines do; prefill runs eagerly. Times are the median of `reps` runs after warm-up, from CUDA
  events on a GPU and the process's monotonic clock elsewhere.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from fleetwise.perf.groundtruth import MOE_BLOCK_CEILING, MOE_BLOCK_SHAPE

ROPE_THETA = 500000.0  # Llama 3's RoPE base (its config's rope_theta); the ground truth uses the same
WEIGHT_STD = 0.02  # random weights: normal, standard deviation 0.02 (the ground truth's README)


def _fused_attention() -> Any:
    """A context that keeps attention on fused kernels (GPU only: the CPU has just the math path)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])


class Decoder:
    """Random-weight decoder of one ground-truth `config` (layers, hidden, heads, kv_heads, head_dim,
    ffn, vocab; experts, topk, moe_ffn for MoE) on one device."""

    def __init__(self, cfg: dict[str, int], device: str, dtype: Any, seed: int = 0) -> None:
        import torch

        self.torch, self.c, self.device, self.dtype = torch, cfg, device, dtype
        self.cuda = str(device).startswith("cuda")
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.layers = [self._layer() for _ in range(cfg["layers"])]
        self.embed = self._weight(cfg["vocab"], cfg["hidden"])
        self.lm_head = self._weight(cfg["vocab"], cfg["hidden"])
        self.norm = torch.ones(cfg["hidden"], device=device, dtype=dtype)
        self.param_bytes = sum(t.numel() * t.element_size() for layer in self.layers for t in layer.values())
        self.param_bytes += 2 * self.embed.numel() * self.embed.element_size()

    def _weight(self, *shape: int) -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=self.dtype, generator=self.gen) * WEIGHT_STD

    def _layer(self) -> dict[str, Any]:
        c, torch = self.c, self.torch
        qkv = (c["heads"] + 2 * c["kv_heads"]) * c["head_dim"]
        ones = {k: torch.ones(c["hidden"], device=self.device, dtype=self.dtype) for k in ("n1", "n2")}
        layer = {"wqkv": self._weight(qkv, c["hidden"]), "wo": self._weight(c["hidden"], c["heads"] * c["head_dim"]),
                 **ones}
        if c.get("experts"):
            e, f = c["experts"], c["moe_ffn"]
            layer.update(router=self._weight(e, c["hidden"]), e13=self._weight(e, 2 * f, c["hidden"]),
                         e2=self._weight(e, c["hidden"], f))
        else:
            layer.update(w13=self._weight(2 * c["ffn"], c["hidden"]), w2=self._weight(c["hidden"], c["ffn"]))
        return layer

    def _rope(self, x: Any, pos: Any) -> Any:
        """Rotary embedding of x [b, heads, s, d] at positions pos ([s], or [b, 1] for decode rows)."""
        torch = self.torch
        d = x.shape[-1]
        inv = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
        ang = pos.to(torch.float32)[..., None] * inv
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        cos, sin = (cos[None, None], sin[None, None]) if cos.dim() == 2 else (cos[:, None], sin[:, None])
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _ffn(self, layer: dict[str, Any], x: Any) -> Any:
        f = self.torch.nn.functional
        h = f.rms_norm(x, (x.shape[-1],), layer["n2"])
        if "router" in layer:
            return x + self._experts(layer, h)
        g, u = f.linear(h, layer["w13"]).chunk(2, dim=-1)
        return x + f.linear(f.silu(g) * u, layer["w2"])

    def _experts(self, layer: dict[str, Any], h: Any) -> Any:
        """Top-k routing, tokens sorted by expert, one grouped GEMM per projection, weighted scatter-add."""
        torch, f, c = self.torch, self.torch.nn.functional, self.c
        shape = h.shape
        h = h.reshape(-1, shape[-1])
        weights, idx = f.linear(h, layer["router"]).softmax(-1).topk(c["topk"], dim=-1)
        flat = idx.reshape(-1)
        order = flat.argsort()
        tok = order // c["topk"]
        counts = torch.zeros(c["experts"], device=h.device, dtype=torch.int32).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        ends = counts.cumsum(0, dtype=torch.int32)
        g, u = self._grouped(h[tok], layer["e13"], ends).chunk(2, dim=-1)
        y = self._grouped(f.silu(g) * u, layer["e2"], ends)
        y = y * weights.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
        return torch.zeros_like(h).index_add_(0, tok, y).reshape(shape)

    def _grouped(self, rows: Any, weights: Any, ends: Any) -> Any:
        """Rows of group e (ending at ends[e]) times weights[e]^T: torch._grouped_mm on a GPU."""
        if rows.is_cuda:
            return self.torch._grouped_mm(rows, weights.transpose(-2, -1), offs=ends)
        out, start = [], 0
        for e, end in enumerate(ends.tolist()):
            out.append(rows[start:end] @ weights[e].transpose(-2, -1))
            start = end
        return self.torch.cat(out)

    def _qkv(self, layer: dict[str, Any], x: Any) -> tuple[Any, Any, Any]:
        c, f = self.c, self.torch.nn.functional
        h = f.rms_norm(x, (x.shape[-1],), layer["n1"])
        hd = c["head_dim"]
        return f.linear(h, layer["wqkv"]).split([c["heads"] * hd, c["kv_heads"] * hd, c["kv_heads"] * hd], dim=-1)

    def _prompt_attention(self, q: Any, k: Any, v: Any, b: int, s: int) -> Any:
        """Causal attention of b fresh sequences of s tokens ([b*s or s, width] in, [b, s, H*D] out)."""
        c, f = self.c, self.torch.nn.functional
        nh, kvh, hd = c["heads"], c["kv_heads"], c["head_dim"]
        pos = self.torch.arange(s, device=q.device)
        q = self._rope(q.reshape(b, s, nh, hd).transpose(1, 2), pos)
        k = self._rope(k.reshape(b, s, kvh, hd).transpose(1, 2), pos)
        v = v.reshape(b, s, kvh, hd).transpose(1, 2)
        group = nh // kvh  # expand the KV heads for the fused kernels (a copy beside attention)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return f.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, nh * hd)

    def _decode_attention(self, i: int, q: Any, k: Any, v: Any, cache: tuple[list[Any], list[Any]], ctx: int) -> Any:
        """One new token per sequence against a cache of ctx positions (the last written now)."""
        c, f = self.c, self.torch.nn.functional
        b, nh, kvh, hd = q.shape[0], c["heads"], c["kv_heads"], c["head_dim"]
        pos = self.torch.full((b, 1), ctx - 1, device=q.device)
        kc, vc = cache[0][i], cache[1][i]
        kc[:, :, ctx - 1: ctx].copy_(self._rope(k.reshape(b, kvh, 1, hd), pos))
        vc[:, :, ctx - 1: ctx].copy_(v.reshape(b, kvh, 1, hd))
        qd = self._rope(q.reshape(b, nh, 1, hd), pos).reshape(b, kvh, nh // kvh, hd)  # a KV head's queries as rows
        return f.scaled_dot_product_attention(qd, kc, vc).reshape(b, nh * hd)

    def prefill(self, ids: Any) -> Any:
        """One eager forward pass over fresh sequences ids [b, s]; logits of the last positions."""
        f = self.torch.nn.functional
        b, s = ids.shape
        x = self.embed[ids]
        for layer in self.layers:
            q, k, v = self._qkv(layer, x)
            x = x + f.linear(self._prompt_attention(q, k, v, b, s), layer["wo"])
            x = self._ffn(layer, x)
        return f.linear(f.rms_norm(x[:, -1], (x.shape[-1],), self.norm), self.lm_head)

    def step(self, ids: Any, cache: tuple[list[Any], list[Any]], ctx: int, chunk_ids: Any | None = None) -> Any:
        """A decode step of ids [b] with caches of ctx positions, plus a fresh prompt chunk when given."""
        torch, f = self.torch, self.torch.nn.functional
        b = ids.shape[0]
        x = self.embed[ids] if chunk_ids is None else torch.cat([self.embed[ids], self.embed[chunk_ids]])
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x)
            out = self._decode_attention(i, q[:b], k[:b], v[:b], cache, ctx)
            if chunk_ids is not None:
                n = chunk_ids.shape[0]
                out = torch.cat([out, self._prompt_attention(q[b:], k[b:], v[b:], 1, n).reshape(n, -1)])
            x = x + f.linear(out, layer["wo"])
            x = self._ffn(layer, x)
        return f.linear(f.rms_norm(x[:b], (x.shape[-1],), self.norm), self.lm_head)


def timed(torch: Any, fn: Callable[[], Any], reps: int, warm: int, cuda: bool) -> tuple[float, float, float]:
    """(median, min, max) milliseconds of `fn` over `reps` runs after `warm` runs (CUDA events when `cuda`)."""
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out), min(out), max(out)


def time_prefill(model: Decoder, batch: int, seq: int, reps: int) -> tuple[float, float, float]:
    """Milliseconds of one eager prefill of `batch` x `seq` fresh tokens."""
    torch = model.torch
    ids = torch.randint(0, model.c["vocab"], (batch, seq), device=model.device, generator=model.gen)
    with torch.inference_mode(), _attention_context(model):
        return timed(torch, lambda: model.prefill(ids), reps, 1, model.cuda)


def time_step(model: Decoder, batch: int, ctx: int, chunk: int, reps: int) -> tuple[float, float, float]:
    """Milliseconds of a decode step of `batch` rows at `ctx` positions (+ a `chunk`-token prompt chunk):
    a CUDA-graph replay on a GPU, an eager pass elsewhere."""
    torch, c = model.torch, model.c
    shape = (batch, c["kv_heads"], ctx, c["head_dim"])
    cache = tuple([torch.randn(*shape, device=model.device, dtype=model.dtype, generator=model.gen)
                   for _ in range(c["layers"])] for _ in range(2))
    ids = torch.randint(0, c["vocab"], (batch,), device=model.device, generator=model.gen)
    pre = torch.randint(0, c["vocab"], (chunk,), device=model.device, generator=model.gen) if chunk else None
    with torch.inference_mode(), _attention_context(model):
        def run() -> Any:
            return model.step(ids, cache, ctx, pre)  # type: ignore[arg-type]
        if not model.cuda:
            return timed(torch, run, reps, 2, False)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        return timed(torch, graph.replay, reps, 3, True)


def _attention_context(model: Decoder) -> Any:
    import contextlib

    return _fused_attention() if model.cuda else contextlib.nullcontext()


def time_moe_block(torch: Any, device: str, shape: dict[str, int], reps: int) -> float:
    """Median milliseconds of one MoE block of `shape` (experts, topk, hidden, moe_ffn, tokens) on random
    inputs: the decoder's own routing, grouped GEMMs and weighted scatter-add, bf16."""
    cfg = {"layers": 1, "hidden": shape["hidden"], "heads": 16, "kv_heads": 4, "head_dim": 128, "ffn": 0,
           "vocab": 16, "experts": shape["experts"], "topk": shape["topk"], "moe_ffn": shape["moe_ffn"]}
    model = Decoder(cfg, device, torch.bfloat16)
    h = torch.randn(shape["tokens"], shape["hidden"], device=device, dtype=torch.bfloat16, generator=model.gen)
    with torch.inference_mode():
        return timed(torch, lambda: model._experts(model.layers[0], h), reps, 2, model.cuda)[0]


def ceilings(torch: Any, device: str) -> dict[str, float]:
    """What the card reaches in this session: device copy (TB/s read+written), an 8192^3 bf16 GEMM (TFLOP/s),
    pinned host-device copies (GB/s), one MoE block of the reference shape (ms). The ground truth's
    `ceilings`; GPU only (the caller empties the cache)."""
    block_ms = time_moe_block(torch, device, MOE_BLOCK_SHAPE, 10)
    n = 2**30  # elements of the 2 GiB bf16 copy
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = timed(torch, lambda: dst.copy_(src), 10, 2, True)[0]
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    gemm_ms = timed(torch, lambda: a @ b, 10, 2, True)[0]
    host = torch.empty(2**28, dtype=torch.bfloat16, pin_memory=True)
    gpu = torch.empty(2**28, device=device, dtype=torch.bfloat16)
    h2d_ms = timed(torch, lambda: gpu.copy_(host, non_blocking=True), 5, 2, True)[0]
    d2h_ms = timed(torch, lambda: host.copy_(gpu, non_blocking=True), 5, 2, True)[0]
    return {MOE_BLOCK_CEILING: block_ms, "copy_read_plus_write_TBps": 2 * n * 2 / (copy_ms / 1e3) / 1e12,
            "bf16_gemm_8192_TFLOPs": 2 * 8192**3 / (gemm_ms / 1e3) / 1e12,
            "pinned_h2d_GBps": 2**28 * 2 / (h2d_ms / 1e3) / 1e9, "pinned_d2h_GBps": 2**28 * 2 / (d2h_ms / 1e3) / 1e9}
