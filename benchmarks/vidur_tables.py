"""Synthetic Vidur profiling tables from fleetwise's roofline (for benchmarks/vidur_compare.py).

Vidur (PyPI `vidur` 0.0.26) predicts step times from per-operator profiles that it downloads
from a model hub at start (`snapshot_download` of a "compute" dataset with `mlp.csv.xz`,
`attention.csv.xz`, `config.json`, and a "network" dataset with `all_reduce.csv.xz`,
`send_recv.csv.xz`, `config.json`). Nothing downloads here, so this module writes those files
itself, with every time taken from `fleetwise.perf.roofline.PerfModel` bound to the same model
and card that fleetwise simulates, and lays them out as a Hugging Face hub cache
(`datasets--ORG--NAME/{refs/main, snapshots/<commit>/...}`) that `snapshot_download` resolves
with `HF_HUB_OFFLINE=1`. The tables are synthetic: good for a speed comparison, not a
calibration of either simulator.

Table layout (as Vidur's `SklearnExecutionTimePredictor` reads it; times in milliseconds per
layer, one pipeline stage, Vidur multiplies by the number of layers):

- `mlp.csv.xz`: model columns `n_head, n_kv_head, n_embd, n_expanded_embd, use_gated_mlp,
  vocab_size, num_tensor_parallel_workers`, the feature `num_tokens`, and targets
  `time_stats.{attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj, mlp_act,
  input_layernorm, post_attention_layernorm, attn_rope, add}.median`.
- `attention.csv.xz`: `n_embd, n_q_head, n_kv_head, block_size, num_tensor_parallel_workers`,
  features `batch_size, kv_cache_size, prefill_chunk_size` (decode rows have
  `prefill_chunk_size = 0`), targets `time_stats.{attn_prefill, attn_decode,
  attn_kv_cache_save}.median`.
- network tables: headers only, read only when TP or PP > 1 (this benchmark uses TP=1, PP=1).

How the roofline is split: the non-attention step time f(T) of T new tokens (dense GEMMs, LM
head, elementwise traffic, launch overhead: the fleetwise step time of a batch with no KV read)
is divided by the layer count and shared out over Vidur's operators (GEMMs by weight size, the
rest over the elementwise ops). Prefill attention is the fleetwise step time of one chunk of c
tokens on k cached tokens minus f(c); decode attention is the step time of b decodes each
reading k tokens minus the same batch with no KV read.

Runs under the system python (needs fleetwise only; writes the xz CSVs with the stdlib).
"""

from __future__ import annotations

import csv
import io
import json
import lzma
from pathlib import Path

# GEMM weight elements per layer of a Llama-style GQA block, as shares of the dense time.
_OPS_ELEM = {"mlp_act": 0.3, "input_layernorm": 0.15, "post_attention_layernorm": 0.15, "attn_rope": 0.15,
             "add": 0.25}
_ELEM_SHARE = 0.06  # share of f(T) given to the elementwise ops (the rest goes to the GEMMs)
_COMMIT = "0" * 40  # the hub cache wants a 40-hex commit name; any fixed one does


def _bound(model: str, gpu: str):
    from fleetwise.perf.roofline import PerfModel
    from fleetwise.perf.types import Deployment
    from fleetwise.spec import catalog

    m, g = catalog.resolve_model(model), catalog.resolve_gpu(gpu)
    return m, PerfModel().bind(Deployment(m, g))


def _write_xz_csv(path: Path, header: list[str], rows: list[list]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    path.write_bytes(lzma.compress(buf.getvalue().encode()))


def _token_grid(max_tokens: int) -> list[int]:
    g = set(range(1, 129)) | set(range(128, max_tokens + 1, 32)) | {max_tokens}
    return sorted(g)


def compute_rows(model: str, gpu: str, max_tokens: int, batch_cap: int) -> tuple[list[str], list[list]]:
    from fleetwise.perf.types import BatchShape

    m, b = _bound(model, gpu)
    L = m.num_layers
    h, nh, kvh, d, f = m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim, m.ffn_size
    gemm = {"attn_pre_proj": h * (nh + 2 * kvh) * d, "attn_post_proj": nh * d * h,
            "mlp_up_proj": 2 * h * f, "mlp_down_proj": f * h}
    wsum = sum(gemm.values())
    header = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "vocab_size",
              "num_tensor_parallel_workers", "num_tokens"]
    ops = list(gemm) + list(_OPS_ELEM)
    header += [f"time_stats.{op}.median" for op in ops]
    rows = []
    for T in _token_grid(max_tokens):
        S = min(T, batch_cap)
        per_layer_ms = b.step_time_s(BatchShape(S, T, 0, 0.0, T, T, 0)) / L * 1e3
        vals = [per_layer_ms * (1 - _ELEM_SHARE) * w / wsum for w in gemm.values()]
        vals += [per_layer_ms * _ELEM_SHARE * s for s in _OPS_ELEM.values()]
        rows.append([nh, kvh, h, f, True, m.vocab_size, 1, T] + [round(v, 6) for v in vals])
    return header, rows


def attention_rows(model: str, gpu: str, max_tokens: int, max_chunk: int, max_batch: int,
                   block_size: int) -> tuple[list[str], list[list]]:
    from fleetwise.perf.types import BatchShape

    m, b = _bound(model, gpu)
    L = m.num_layers
    kv_bytes = 2 * m.num_kv_heads * m.head_dim * 2  # bf16 K and V of one token, one layer
    bw = b.deployment.accelerator.hbm_bytes_per_s
    header = ["n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers", "batch_size",
              "kv_cache_size", "prefill_chunk_size", "time_stats.attn_prefill.median",
              "time_stats.attn_decode.median", "time_stats.attn_kv_cache_save.median"]
    base = [m.hidden_size, m.num_attention_heads, m.num_kv_heads, block_size, 1]
    rows = []

    def save_ms(tokens: int) -> float:
        return tokens * kv_bytes / bw * 1e3

    chunks = sorted(set([32, 64, 96, 128, 192, 256, 384] + list(range(512, max_chunk + 1, 256)) + [max_chunk]))
    for kv in range(0, max_tokens + 1, 512):
        for c in chunks:
            if kv + c > max_tokens + max_chunk:
                continue
            full = b.step_time_s(BatchShape(1, c, kv + c, c * (kv + (c + 1) / 2), c, c, 0))
            none = b.step_time_s(BatchShape(1, c, 0, 0.0, c, c, 0))
            rows.append(base + [1, kv, c, round(max(full - none, 0.0) / L * 1e3, 6), 0.0, round(save_ms(c), 6)])
    batches = sorted(set(list(range(1, 17)) + list(range(16, max_batch + 1, 8)) + [max_batch]))
    for kv in [256] + list(range(512, max_tokens + 1, 512)):
        for bs in batches:
            full = b.step_time_s(BatchShape(bs, bs, bs * kv, float(bs * kv), 0, 1, kv))
            none = b.step_time_s(BatchShape(bs, bs, 0, 0.0, 0, 1, 0))
            rows.append(base + [bs, kv, 0, 0.0, round(max(full - none, 0.0) / L * 1e3, 6), round(save_ms(bs), 6)])
    return header, rows


def _hub_dataset(cache_dir: Path, repo_id: str) -> Path:
    """Create `cache_dir/datasets--ORG--NAME` with refs/main and an empty snapshot; return the snapshot."""
    org, name = repo_id.split("/", 1)
    root = cache_dir / f"datasets--{org}--{name}"
    snap = root / "snapshots" / _COMMIT
    snap.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(_COMMIT)
    return snap


def write_offline_profiles(vidur_cache: Path, *, model: str, gpu: str, vidur_model: str, vidur_device: str,
                           vidur_network_device: str, compute_repo: str, network_repo: str, max_tokens: int,
                           max_chunk: int, max_batch: int, block_size: int, batch_cap: int) -> dict:
    """Write the compute and network profile datasets where Vidur's `snapshot_download` looks.

    `vidur_cache` is Vidur's `cache_dir`: it downloads compute data into
    `<cache_dir>/profiling_data/compute/` and network data into `<cache_dir>/profiling_data/network/`.
    """
    comp = _hub_dataset(vidur_cache / "profiling_data" / "compute", compute_repo)
    h, rows = compute_rows(model, gpu, max_tokens, batch_cap)
    _write_xz_csv(comp / "mlp.csv.xz", h, rows)
    ah, arows = attention_rows(model, gpu, max_tokens, max_chunk, max_batch, block_size)
    _write_xz_csv(comp / "attention.csv.xz", ah, arows)
    (comp / "config.json").write_text(json.dumps({"model": vidur_model, "device_sku": vidur_device,
                                                  "source": f"fleetwise roofline {model} on {gpu} (synthetic)"}))
    net = _hub_dataset(vidur_cache / "profiling_data" / "network", network_repo)
    nh = ["num_workers", "devices_per_node", "collective", "size", "time_stats.all_reduce.median",
          "time_stats.send_recv.median"]
    _write_xz_csv(net / "all_reduce.csv.xz", nh, [])
    _write_xz_csv(net / "send_recv.csv.xz", nh, [])
    (net / "config.json").write_text(json.dumps({"sku": vidur_network_device}))
    return {"compute_rows": len(rows), "attention_rows": len(arows), "compute_dir": str(comp), "network_dir": str(net)}
