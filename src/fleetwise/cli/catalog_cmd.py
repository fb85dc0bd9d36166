"""`fleetwise catalog models|gpus [--json]`: list the built-in models and accelerators.

Owns the presentation of the catalog (rich tables, JSON rows); the figures live in
`fleetwise.spec.catalog`.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from fleetwise.cli.common import add_json_flag, console, emit_json, fmt_bytes, fmt_count
from fleetwise.spec.catalog import list_gpus, list_models
from fleetwise.spec.hardware import AcceleratorSpec
from fleetwise.spec.model import ModelSpec


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("catalog", help="list built-in models or accelerators",
                              description="List the built-in models or accelerators with their figures.")
    p.add_argument("kind", choices=("models", "gpus"), help="what to list")
    add_json_flag(p)
    p.set_defaults(func=run)


def model_row(m: ModelSpec) -> dict[str, Any]:
    moe = m.moe
    return {
        "name": m.name, "params_total": m.params_total, "params_active": m.params_active,
        "num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
        "num_kv_heads": m.num_kv_heads, "attention": m.attention,
        "num_experts": moe.num_experts if moe else None,
        "experts_per_token": moe.experts_per_token if moe else None,
        "kv_bytes_per_token_bf16": m.kv_bytes_per_token("bf16"),
        "sliding_window": m.sliding_window, "window_layers": m.num_window_layers,
        "kv_bytes_at_max_context_bf16": m.kv_bytes(m.max_context_tokens, "bf16"),
        "weight_bytes_bf16": m.weight_bytes("bf16"), "max_context_tokens": m.max_context_tokens,
        "verified": m.verified, "source": m.source,
    }


def gpu_row(g: AcceleratorSpec) -> dict[str, Any]:
    return {
        "name": g.name, "vendor": g.vendor, "hbm_bytes": g.hbm_bytes, "hbm_bytes_per_s": g.hbm_bytes_per_s,
        "bf16_flops": g.bf16_flops, "fp8_flops": g.flops_per_s.get("fp8"), "fp4_flops": g.flops_per_s.get("fp4"),
        "intra_node_link": g.intra_node_link.name,
        "intra_node_bytes_per_s": g.intra_node_link.bandwidth_bytes_per_s, "gpus_per_node": g.gpus_per_node,
        "network_bytes_per_s": g.network.bandwidth_bytes_per_s, "price_per_hour_usd": g.price_per_hour_usd,
        "sources": dict(g.sources),
    }


def _models_table() -> Table:
    t = Table(title="fleetwise models")
    for col in ("name", "params", "active", "layers", "attention", "experts", "KV/token bf16", "context", "note"):
        t.add_column(col, justify="left" if col in ("name", "attention", "note") else "right")
    for m in list_models():
        experts = f"{m.moe.experts_per_token}/{m.moe.num_experts}" if m.moe else "-"
        t.add_row(m.name, fmt_count(m.params_total), fmt_count(m.params_active), str(m.num_layers), m.attention,
                  experts, f"{m.kv_bytes_per_token('bf16') / 1024:,.1f} KiB", f"{m.max_context_tokens:,}",
                  _model_note(m))
    return t


def _model_note(m: ModelSpec) -> str:
    """The table's note: a sliding window (KV/token then holds only below the window) and unverified shapes."""
    notes = [] if m.verified else ["unverified"]
    if m.sliding_window is not None:
        notes.append(f"window {m.sliding_window:,} on {m.num_window_layers}/{m.num_layers} layers: "
                     f"{m.kv_bytes(m.max_context_tokens) / 2**30:,.2f} GiB KV at full context")
    return "; ".join(notes)


def _tflops(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e12:,.0f}"


def _gpus_table() -> Table:
    t = Table(title="fleetwise accelerators (dense peaks; price is an overridable default)")
    for col in ("name", "vendor", "HBM", "HBM TB/s", "bf16 TF", "fp8 TF", "fp4 TF", "scale-up /dir", "per node",
                "$/h"):
        t.add_column(col, justify="left" if col in ("name", "vendor") else "right")
    for g in list_gpus():
        f = g.flops_per_s
        t.add_row(g.name, g.vendor, fmt_bytes(g.hbm_bytes), f"{g.hbm_bytes_per_s / 1e12:.2f}", _tflops(f["bf16"]),
                  _tflops(f.get("fp8")), _tflops(f.get("fp4")),
                  f"{g.intra_node_link.bandwidth_bytes_per_s / 1e9:,.0f} GB/s",
                  str(g.gpus_per_node), f"{g.price_per_hour_usd:.2f}")
    return t


def run(args: argparse.Namespace) -> int:
    if args.json:
        rows = [model_row(m) for m in list_models()] if args.kind == "models" else [gpu_row(g) for g in list_gpus()]
        emit_json(rows)
        return 0
    console().print(_models_table() if args.kind == "models" else _gpus_table())
    return 0
