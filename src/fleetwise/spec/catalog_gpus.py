"""Built-in accelerators: datasheet figures behind `fleetwise.spec.catalog`, each with its source.

Conventions: FLOP/s are dense (no 2:4 sparsity) tensor-core peaks; memory is the total the
driver reports (`nvidia-smi` MiB, `rocm-smi` bytes) where that figure is cited, since cards hold
binary-sized HBM (an H200 reports 143,771 MiB = 150.8e9 bytes, not the datasheet's 141 GB read as
141e9); cards without a cited driver figure keep the datasheet's decimal GB (conservative); links are one-direction bandwidth per GPU (a datasheet's
"900 GB/s bidirectional" becomes 450e9); network is the scale-out NIC share per GPU.
`price_per_hour_usd` is a typical cloud on-demand rate per GPU-hour in 2025: a default that
users override, not a quote. Lookups live in `fleetwise.spec.catalog`.
"""

from __future__ import annotations

from fleetwise.spec.hardware import AcceleratorSpec, LinkSpec

PRICE_NOTE = "typical cloud on-demand GPU-hour (2025); a default, override it for your contract"
T = 1e12
GB = 1e9
MIB = 2**20
# Total memory as the driver reports it, with where the figure was read (nvidia-smi "Memory-Usage"
# total column; rocm-smi "VRAM Total Memory (B)"), quoted in many public logs.
DRIVER_MEMORY: dict[str, tuple[float, str]] = {
    "a100-80g": (81920 * MIB, "nvidia-smi on A100-SXM4-80GB: 81920MiB"),
    "h100-sxm": (81559 * MIB, "nvidia-smi on H100 80GB HBM3: 81559MiB"),
    "h200-sxm": (143771 * MIB, "nvidia-smi on H200: 143771MiB"),
    "b200": (183359 * MIB, "nvidia-smi on B200: 183359MiB"),
    "l40s": (46068 * MIB, "nvidia-smi on L40S: 46068MiB"),
    "mi300x": (205822885888.0, "rocm-smi --showmeminfo vram on MI300X: VRAM Total Memory (B) 205822885888"),
}


OCP_FP8 = {"bf16": "bf16", "fp8": "fp8_e4m3fn"}
"""KV encodings of engines on cards with OCP FP8 (E4M3FN): NVIDIA Ampere to Blackwell, AMD CDNA4, Intel Gaudi 3."""
FNUZ_FP8 = {"bf16": "bf16", "fp8": "fp8_e4m3fnuz"}
"""KV encodings on AMD CDNA3 (MI300X, MI325X), whose FP8 is E4M3FNUZ (no negative zero, bias 8), not OCP E4M3FN."""
BF16_ONLY = {"bf16": "bf16"}
"""KV encodings on cards without an FP8 format (Ascend 910B/910C)."""
KV_FORMATS: dict[str, tuple[dict[str, str], str]] = {
    **{n: (OCP_FP8, "OCP 8-bit floating point spec (E4M3FN) as the card's FP8; vLLM --kv-cache-dtype fp8_e4m3")
       for n in ("a100-80g", "h100-sxm", "h200-sxm", "b200", "b300", "l40s", "mi355x", "gaudi3")},
    **{n: (FNUZ_FP8, "AMD ROCm precision-support docs: CDNA3 FP8 is E4M3FNUZ; CDNA4 adds OCP E4M3FN")
       for n in ("mi300x", "mi325x")},
    **{n: (BF16_ONLY, "Ascend 910B/910C datasheets list no FP8 format") for n in ("ascend-910b", "ascend-910c")},
}
"""Per card: the KV encoding its engines store each KV dtype in, and the source."""


def _gpu(name: str, vendor: str, hbm_gb: float, tb_s: float, flops: dict[str, float], link: tuple[str, float],
         per_node: int, net_gbit: float, price: float, sources: dict[str, str]) -> AcceleratorSpec:
    link_name, link_bytes_per_s = link
    hbm_bytes = float(round(hbm_gb * GB))
    if name in DRIVER_MEMORY:
        hbm_bytes, where = DRIVER_MEMORY[name]
        sources = {**sources, "hbm_bytes": f"{where} (datasheet: {hbm_gb:g} GB)"}
    return AcceleratorSpec(
        name=name, vendor=vendor, hbm_bytes=float(hbm_bytes), hbm_bytes_per_s=float(round(tb_s * T)),
        flops_per_s={k: float(round(v)) for k, v in flops.items()},
        intra_node_link=LinkSpec(name=link_name, bandwidth_bytes_per_s=float(round(link_bytes_per_s)), latency_s=3e-6,
                                 source=sources.get("intra_node_link", "")),
        gpus_per_node=per_node,
        network=LinkSpec(name=f"{net_gbit:g} Gb/s NIC", bandwidth_bytes_per_s=net_gbit * 1e9 / 8, latency_s=10e-6,
                         source=sources.get("network", "")),
        price_per_hour_usd=price, sources={**sources, "price_per_hour_usd": PRICE_NOTE, "kv_formats": KV_FORMATS[name][1]},
        kv_formats=dict(KV_FORMATS[name][0]),
    )


_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_B200 = "https://www.nvidia.com/en-us/data-center/dgx-b200/ (DGX B200: 1440 GB, 64 TB/s, 72 PF fp8 / 8 GPUs, sparse)"
_B300 = "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B300 per-GPU share; sparse figures halved)"
_L40S = "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
_MI300X = "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"
_MI325X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html"
_MI355X = "https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html"
_910B = "https://www.hiascend.com/hardware/product (Atlas 800T A2 / Ascend 910B; figures vary by bin 910B1-B4)"
_910C = "arXiv:2506.12708 (Huawei CloudMatrix384: Ascend 910C, two dies)"
_GAUDI3 = "https://www.intel.com/content/www/us/en/content-details/817486/intel-gaudi-3-ai-accelerator-white-paper.html"


def _all(url: str, **extra: str) -> dict[str, str]:
    keys = ("hbm_bytes", "hbm_bytes_per_s", "flops_per_s", "intra_node_link", "gpus_per_node", "network")
    return {**{k: url for k in keys}, **extra}


def _build() -> list[AcceleratorSpec]:
    return [
        _gpu("a100-80g", "nvidia", 80, 2.039, {"bf16": 312 * T, "int8": 624 * T}, ("NVLink3", 300 * GB), 8, 200, 1.80,
             _all(_A100, network="DGX A100: 8x 200 Gb/s HDR InfiniBand, one per GPU",
                  intra_node_link=_A100 + " (NVLink 600 GB/s bidirectional)")),
        _gpu("h100-sxm", "nvidia", 80, 3.35, {"bf16": 989 * T, "fp8": 1979 * T, "int8": 1979 * T}, ("NVLink4", 450 * GB),
             8, 400, 3.00,
             _all(_H100, network="DGX H100: 8x 400 Gb/s NDR InfiniBand, one per GPU",
                  intra_node_link=_H100 + " (NVLink 900 GB/s bidirectional)")),
        _gpu("h200-sxm", "nvidia", 141, 4.8, {"bf16": 989 * T, "fp8": 1979 * T, "int8": 1979 * T}, ("NVLink4", 450 * GB),
             8, 400, 3.80,
             _all(_H200, network="HGX H200: 400 Gb/s NDR InfiniBand per GPU",
                  intra_node_link=_H200 + " (NVLink 900 GB/s bidirectional)")),
        _gpu("b200", "nvidia", 180, 8.0, {"bf16": 2250 * T, "fp8": 4500 * T, "fp4": 9000 * T}, ("NVLink5", 900 * GB),
             8, 400, 6.00,
             _all(_B200, network="DGX B200: 8x 400 Gb/s ConnectX-7, one per GPU",
                  intra_node_link=_B200 + " (NVLink5 1.8 TB/s bidirectional per GPU)")),
        _gpu("b300", "nvidia", 288, 8.0, {"bf16": 2250 * T, "fp8": 4500 * T, "fp4": 13500 * T}, ("NVLink5", 900 * GB),
             8, 800, 7.50,
             _all(_B300, network="HGX B300: 800 Gb/s ConnectX-8 SuperNIC per GPU",
                  intra_node_link=_B300 + " (NVLink5 1.8 TB/s bidirectional per GPU)")),
        _gpu("l40s", "nvidia", 48, 0.864, {"bf16": 362.05 * T, "fp8": 733 * T, "int8": 733 * T},
             ("PCIe Gen4 x16", 32 * GB), 8, 100, 1.20,
             _all(_L40S, network="typical 8-GPU PCIe server NIC share (assumption, not a datasheet figure)",
                  gpus_per_node="typical 8-GPU PCIe server (assumption)",
                  intra_node_link=_L40S + " (PCIe Gen4 x16, 64 GB/s bidirectional; no NVLink)")),
        _gpu("mi300x", "amd", 192, 5.3, {"bf16": 1307.4 * T, "fp8": 2614.9 * T, "int8": 2614.9 * T},
             ("xGMI (Infinity Fabric)", 448 * GB), 8, 400, 2.50,
             _all(_MI300X, network="400 Gb/s NIC per GPU (typical MI300X platform)",
                  intra_node_link=_MI300X + " (7 links x 64 GB/s per direction, 896 GB/s aggregate)")),
        _gpu("mi325x", "amd", 256, 6.0, {"bf16": 1307.4 * T, "fp8": 2614.9 * T, "int8": 2614.9 * T},
             ("xGMI (Infinity Fabric)", 448 * GB), 8, 400, 2.90,
             _all(_MI325X, network="400 Gb/s NIC per GPU (typical MI325X platform)",
                  intra_node_link=_MI325X + " (7 links x 64 GB/s per direction)")),
        _gpu("mi355x", "amd", 288, 8.0, {"bf16": 2516.6 * T, "fp8": 5033.2 * T, "fp4": 10066.3 * T},
             ("xGMI (Infinity Fabric)", 537.6 * GB), 8, 400, 3.50,
             _all(_MI355X, network="400 Gb/s Pollara NIC per GPU (typical MI355X platform)",
                  intra_node_link=_MI355X + " (7 links, 1075 GB/s aggregate bidirectional)")),
        _gpu("ascend-910b", "huawei", 64, 1.6, {"bf16": 376 * T, "int8": 752 * T}, ("HCCS", 196 * GB), 8, 200, 1.50,
             _all(_910B, network="Atlas 800T A2: 8x 200 GE RoCE, one per NPU",
                  intra_node_link=_910B + " (HCCS 7 x 56 GB/s = 392 GB/s aggregate, both directions)")),
        _gpu("ascend-910c", "huawei", 128, 3.2, {"bf16": 752 * T, "int8": 1504 * T}, ("HCCS/UB", 392 * GB), 8, 400, 2.50,
             _all(_910C, network=_910C + " (RDMA plane 400 Gb/s per NPU)",
                  intra_node_link=_910C + " (UB plane 392 GB/s unidirectional per NPU)")),
        _gpu("gaudi3", "intel", 128, 3.7, {"bf16": 1835 * T, "fp8": 1835 * T}, ("RoCE 21x200GbE", 525 * GB), 8, 600,
             1.60,
             _all(_GAUDI3, network=_GAUDI3 + " (3 of 24 200 GbE ports for scale-out)",
                  intra_node_link=_GAUDI3 + " (21 of 24 200 GbE ports all-to-all inside the node)")),
    ]


GPUS: dict[str, AcceleratorSpec] = {g.name: g for g in _build()}
"""The catalog accelerators by name (`fleetwise catalog gpus`)."""
