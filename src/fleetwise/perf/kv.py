"""KV-cache hand-off between a prefill replica and a decode replica (PD disaggregation).

Owns the bytes a hand-off moves and how long it takes over a link. Does not model contention
between concurrent transfers (the simulator's links do that) or KV capacity (see `memory`).

    bytes = kv_bytes(tokens, kv_dtype of the sender)
          = layer_tokens * 2*kv_heads*head_dim*dtype_bytes   (GQA)
          = layer_tokens * (kv_lora_rank + rope_dim)*dtype_bytes   (MLA latent)
    layer_tokens = full_layers*tokens + window_layers*min(tokens, sliding_window)
    (`ModelSpec.kv_layer_tokens`: a sliding-window layer holds, and hands off, only its window)
    t = link.latency_s + bytes / (lanes * link.bandwidth_bytes_per_s)

`link` is one GPU's NIC (or scale-up port). The cache is sharded on both ends: each TP rank
holds kv_heads/tp of the heads (GQA; a head replicated over ranks when tp > kv_heads is sent
once) and each PP stage its own layers, and every GPU has its own NIC, so shards move in
parallel: lanes = min(shards(src), shards(dst)), shards = min(tp, kv_heads) * pp (MLA: the
latent is replicated over TP ranks, so shards = pp). Bytes grow linearly with layers and context.
A pair that is not direct (another vendor, another KV format) adds `handoff_extra_s`.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetwise.errors import SpecError
from fleetwise.perf.types import Deployment
from fleetwise.spec.hardware import LinkSpec
from fleetwise.spec.kv_format import KvCompat, kv_conversion_s


def kv_transfer_bytes(tokens: int, deployment: Deployment) -> float:
    """Bytes of KV cache for `tokens` positions of one sequence, all layers (windowed ones capped at
    their window), at the KV dtype."""
    if tokens < 0:
        raise SpecError(f"tokens={tokens} is negative; pass the number of cached positions to move")
    return kv_transfer_sizer(deployment)(tokens)


def kv_transfer_sizer(deployment: Deployment) -> Callable[[float], float]:
    """`kv_transfer_bytes` of `deployment` as a function of tokens (known not negative), its
    per-token figures worked out once: what the simulator keeps per pool for its hand-offs."""
    return deployment.model.kv_sizer(deployment.kv_dtype)


def kv_shards(deployment: Deployment) -> int:
    """Distinct KV shards of one replica (GPUs holding different parts of the cache)."""
    m, p = deployment.model, deployment.parallelism
    per_stage = 1 if m.attention == "mla" else min(p.tp, m.num_kv_heads)
    return per_stage * p.pp


def kv_transfer_s(tokens: int, src: Deployment, dst: Deployment, link: LinkSpec) -> float:
    """Seconds to move `tokens` positions of KV from `src` to `dst` over per-GPU `link`s."""
    if src.model.kv_elements_per_token() != dst.model.kv_elements_per_token():
        raise SpecError(
            f"KV layouts differ: src model {src.model.name!r} and dst model {dst.model.name!r} "
            "cache different shapes; a hand-off needs the same model on both pools"
        )
    if tokens <= 0:
        return 0.0
    lanes = min(kv_shards(src), kv_shards(dst))
    return link.latency_s + kv_transfer_bytes(tokens, src) / (lanes * link.bandwidth_bytes_per_s)


STAGING_COPY_BYTES_PER_S = 50e9
"""One GPU's device<->host copy rate of a cross-vendor hand-off's staging buffer: PCIe Gen5 x16
(64 GB/s per direction, PCI-SIG) at about 80% efficiency, what pinned-memory copies reach."""


def handoff_extra_s(nbytes: float, compat: KvCompat, src: Deployment, dst: Deployment) -> float:
    """Seconds a hand-off of `nbytes` spends beyond the link when the pair is not direct
    (`spec.kv_format.kv_compat`): between vendors there is no device-to-device path, so each
    shard is staged through host memory on both sides (two copies at STAGING_COPY_BYTES_PER_S per
    GPU); a format conversion is a memory-bound pass on the receiver's GPUs (`kv_conversion_s`)."""
    lanes = min(kv_shards(src), kv_shards(dst))
    staging = 2 * nbytes / (lanes * STAGING_COPY_BYTES_PER_S) if compat.cross_vendor else 0.0
    return staging + kv_conversion_s(nbytes, compat, dst.accelerator.hbm_bytes_per_s * dst.parallelism.gpus)


def shared_rate(src_bytes_per_s: float, src_active: int, dst_bytes_per_s: float, dst_active: int) -> float:
    """Bytes/s one transfer gets between two processor-shared KV ports: `min(bw_s / n_s, bw_d / n_d)`,
    `n_x` the transfers active on port x (this one included). The one rate the simulator's network
    and the emulator's ports both move KV at."""
    return min(src_bytes_per_s / src_active, dst_bytes_per_s / dst_active)


def bytes_left(remaining: float, rate_bytes_per_s: float, elapsed_s: float) -> float:
    """Bytes of a transfer still to move after `elapsed_s` at `rate_bytes_per_s` (never negative)."""
    return max(0.0, remaining - rate_bytes_per_s * elapsed_s)
