"""KV-cache formats and the one rule deciding whether a decode replica can take a prefill replica's KV.

Owns `KvFormat` (what a replica declares about its KV cache: model version, KV encoding, block
size, TP layout, vendor, and the encodings its engine can convert from) and `kv_compat`, the
compatibility rule the simulator, the routers (simulated and live, the same code), the emulator
and the planner all call. A field left None is not declared and matches anything, so a fleet
that declares only its model versions is paired by version alone.

The rule, for a hand-off from `src` (prefill) to `dst` (decode):

- model versions differ: refused (KV of one model version is meaningless to another);
- KV encodings differ: converted on the receiver when its engine reads the sender's encoding
  (`dst.readable`), else refused (no common format);
- TP layouts differ: taken as is when one TP degree divides the other (each receiving rank reads
  its heads from one or several sender ranks, as vLLM's NIXL connector does for heterogeneous
  TP), else refused (a rank's heads would straddle two sender ranks);
- block sizes differ: converted (tokens re-blocked into the receiver's block size);
- vendors differ: the transport is the host network with a staging copy (no NVLink or RDMA path
  between two vendors' devices), and any conversion above runs on the receiver.

A conversion is a memory-bound pass over the received bytes on the receiver (read once, write
once); `kv_conversion_s` prices it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from fleetwise.spec.hardware import AcceleratorSpec

__all__ = ["KvCompat", "KvFormat", "declared_format", "kv_compat", "kv_conversion_s"]

CONVERSION_PASSES = 2.0
"""HBM bytes moved per received KV byte by a layout conversion on the receiver: read once, write once."""


@dataclass(frozen=True, slots=True)
class KvFormat:
    """How one replica stores its KV cache, as declared per replica (None: not declared)."""

    model_version: str = "v1"
    kv_dtype: str | None = None
    """The stored encoding (a vendor's encoding of the pool's `kv_dtype`: `bf16`, `fp8_e4m3fn`...)."""
    block_size: int | None = None
    """Tokens per KV block."""
    tp: int | None = None
    """Tensor-parallel ranks the KV heads are split over."""
    vendor: str | None = None
    """Accelerator vendor (`nvidia`, `amd`, ...): crossing vendors changes the transport."""
    readable: tuple[str, ...] = ()
    """Encodings the engine can convert a received cache from (its own encoding always)."""

    def at_version(self, model_version: str) -> KvFormat:
        """This format serving `model_version` (a rolling upgrade changes only the version)."""
        if model_version == self.model_version:
            return self
        return KvFormat(model_version, self.kv_dtype, self.block_size, self.tp, self.vendor, self.readable)

    def label(self) -> str:
        """`v1 bf16 b16 tp4 nvidia`: the declared parts, for messages."""
        parts = [self.model_version, self.kv_dtype, None if self.block_size is None else f"b{self.block_size}",
                 None if self.tp is None else f"tp{self.tp}", self.vendor]
        return " ".join(p for p in parts if p)


@dataclass(frozen=True, slots=True)
class KvCompat:
    """The verdict on one (prefill format, decode format) pair."""

    ok: bool
    """The decode replica can take the prefill replica's KV (directly or by converting it)."""
    conversions: tuple[str, ...] = ()
    """What the receiver converts (`block size 16->32`, `fp8_e4m3fn->bf16`)."""
    cross_vendor: bool = False
    """The two replicas are on different vendors' devices (host network plus a staging copy)."""
    reason: str = ""
    """Why the pair is refused (one line naming the field and both values), "" when ok."""

    @property
    def direct(self) -> bool:
        """The KV moves as is, device to device."""
        return self.ok and not self.conversions and not self.cross_vendor


@lru_cache(maxsize=4096)
def kv_compat(src: KvFormat, dst: KvFormat) -> KvCompat:
    """Whether a decode replica of format `dst` can take the KV of a prefill replica of format `src`."""
    if src.model_version != dst.model_version:
        return KvCompat(False, reason=f"model_version {src.model_version!r} -> {dst.model_version!r}: KV of one "
                                      "model version is meaningless to another; pair replicas of the same version")
    conv: list[str] = []
    if src.kv_dtype is not None and dst.kv_dtype is not None and src.kv_dtype != dst.kv_dtype:
        if src.kv_dtype not in dst.readable:
            reads = ", ".join(sorted({dst.kv_dtype, *dst.readable}))
            return KvCompat(False, reason=f"kv_dtype {src.kv_dtype!r} -> {dst.kv_dtype!r}: no common KV format (the "
                                          f"receiver reads {reads}); give both pools a KV dtype both engines read")
        conv.append(f"{src.kv_dtype}->{dst.kv_dtype}")
    if src.tp is not None and dst.tp is not None and src.tp != dst.tp:
        if max(src.tp, dst.tp) % min(src.tp, dst.tp):
            return KvCompat(False, reason=f"tp {src.tp} -> {dst.tp}: neither TP degree divides the other, so a "
                                          "rank's KV heads straddle two sender ranks; use TP degrees that divide")
    if src.block_size is not None and dst.block_size is not None and src.block_size != dst.block_size:
        conv.append(f"block size {src.block_size}->{dst.block_size}")
    cross = src.vendor is not None and dst.vendor is not None and src.vendor != dst.vendor
    return KvCompat(True, tuple(conv), cross)


def kv_conversion_s(nbytes: float, compat: KvCompat, receiver_hbm_bytes_per_s: float) -> float:
    """Seconds the receiver spends converting `nbytes` of received KV (0 when none is needed):
    a memory-bound pass, `CONVERSION_PASSES * bytes / HBM bandwidth`."""
    if not compat.conversions or nbytes <= 0:
        return 0.0
    return CONVERSION_PASSES * nbytes / receiver_hbm_bytes_per_s


def declared_format(model_version: str, kv_dtype: str, block_size: int | None, tp: int | None,
                    accelerator: AcceleratorSpec) -> KvFormat:
    """The KV format a replica of this pool declares: its card's encoding of `kv_dtype`, block
    size, TP degree and vendor; it reads every encoding its card's engines store."""
    return KvFormat(model_version, accelerator.kv_encoding(kv_dtype), block_size, tp, accelerator.vendor,
                    tuple(sorted(set(accelerator.kv_formats.values()) | {accelerator.kv_encoding(kv_dtype)})))
