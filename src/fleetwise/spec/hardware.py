"""Hardware specs: accelerators, links and node shapes.

Owns datasheet-level figures and their sources. Does not know about models or timing; the perf
layer applies efficiency factors on top of these peaks.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from fleetwise.spec.base import Spec


class LinkSpec(Spec):
    """Any point-to-point link (NVLink, xGMI, HCCS, InfiniBand, RoCE, Ethernet, PCIe)."""

    name: str = "link"
    bandwidth_bytes_per_s: float = Field(gt=0)
    """Usable one-direction bandwidth."""
    latency_s: float = Field(default=5e-6, ge=0)
    """One-way latency per transfer (software and wire)."""
    source: str = ""


DEFAULT_STORAGE_BYTES_PER_S = 6.5e9
"""Weights read rate per GPU when a replica loads its model: one Gen4 NVMe drive's sequential read
(~6.5 GB/s, e.g. Samsung PM1733: 7.0 GB/s) per GPU of an 8-GPU node with eight data drives
(DGX H100: 8x 3.84 TB U.2 NVMe). An assumption, not a datasheet figure of the card; override it."""


class AcceleratorSpec(Spec):
    """One accelerator card as the datasheet gives it."""

    name: str
    vendor: str
    hbm_bytes: float = Field(gt=0)
    """Device memory capacity in bytes."""
    hbm_bytes_per_s: float = Field(gt=0)
    """Peak device memory bandwidth."""
    flops_per_s: dict[str, float]
    """Dense (no sparsity) peak FLOP/s per compute dtype: at least `bf16`; `fp8`, `int8`, `fp4` where supported."""
    intra_node_link: LinkSpec
    """Scale-up link (NVLink/xGMI/HCCS/PCIe): one-direction bandwidth per GPU."""
    gpus_per_node: int = Field(default=8, gt=0)
    """GPUs sharing the scale-up link domain in one node."""
    network: LinkSpec
    """Scale-out network per GPU (InfiniBand/RoCE NIC)."""
    price_per_hour_usd: float = Field(default=0.0, ge=0)
    """Default on-demand price per GPU-hour; users override this."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Where each figure comes from (field name -> datasheet/URL)."""
    storage_bytes_per_s: float = Field(default=DEFAULT_STORAGE_BYTES_PER_S, gt=0)
    """Rate at which one GPU of the node reads model weights from storage (a cold start's load)."""
    kv_formats: dict[str, str] = Field(default_factory=dict)
    """The KV-cache encoding its serving engines store for each KV dtype (`fp8` -> `fp8_e4m3fn` on
    OCP-FP8 cards, `fp8_e4m3fnuz` on CDNA3); a dtype not listed is stored under its own name.
    These are also the encodings its engines can convert a received cache from."""

    @model_validator(mode="after")
    def _check(self) -> AcceleratorSpec:
        if "bf16" not in self.flops_per_s:
            raise ValueError("flops_per_s needs a `bf16` entry (dense peak FLOP/s)")
        return self

    def peak_flops(self, dtype: str) -> float:
        """Dense peak for a compute dtype; a dtype the card lacks runs at its bf16 rate."""
        return self.flops_per_s.get(dtype, self.flops_per_s["bf16"])

    def kv_encoding(self, kv_dtype: str) -> str:
        """The encoding this card's engines store a `kv_dtype` cache in."""
        return self.kv_formats.get(kv_dtype, kv_dtype)

    @property
    def bf16_flops(self) -> float:
        """Dense bf16 tensor throughput, FLOP/s per GPU."""
        return self.flops_per_s["bf16"]
