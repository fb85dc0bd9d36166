"""`fleetwise fit --model M --gpu G [--weight-dtype ...] [--kv-dtype ...] [--json]`: does it fit, and on what.

Owns the argument parsing and presentation of `fleetwise.perf.memory.fit`; the arithmetic lives
there.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from fleetwise.cli.common import (
    add_gpu_arg,
    add_json_flag,
    add_model_arg,
    console,
    emit_json,
    float_flag,
    fmt_bytes,
    gpu_from_args,
    int_flag,
    model_from_args,
    rename_flag,
)
from fleetwise.perf.memory import FitOptions, FitReport, LayoutFit, fit
from fleetwise.spec import engine_defaults as ed
from fleetwise.spec.dtypes import KV_DTYPES, WEIGHT_DTYPES
from fleetwise.spec.limits import MAX_GPUS, MAX_TOKENS


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fit", help="does a model fit one card; if not, the smallest TP / TPxPP / TPxEP layouts that do",
        description="Memory fit: weights + activations + reserve + KV for one full-context request.",
    )
    add_model_arg(p)
    add_gpu_arg(p)
    dtype = p.add_argument("--weight-dtype", default="bf16", choices=WEIGHT_DTYPES,
                           help="weight storage format (default bf16)")
    rename_flag(p, "--dtype", dtype)
    p.add_argument("--kv-dtype", default="bf16", choices=KV_DTYPES, help="KV-cache format (default bf16)")
    p.add_argument("--max-num-batched-tokens", type=int_flag(1, MAX_TOKENS), default=ed.MAX_NUM_BATCHED_TOKENS,
                   help=f"engine token budget per step (default {ed.MAX_NUM_BATCHED_TOKENS})")
    p.add_argument("--gpu-memory-utilization", type=float_flag(positive=True, maximum=1.0),
                   default=ed.GPU_MEMORY_UTILIZATION,
                   help=f"fraction of HBM the engine uses (default {ed.GPU_MEMORY_UTILIZATION})")
    p.add_argument("--context-tokens", type=int_flag(1, MAX_TOKENS), default=None,
                   help="KV to hold for one request (default: the model's max context)")
    p.add_argument("--max-gpus", type=int_flag(1, MAX_GPUS), default=256, help="largest replica the search considers")
    add_json_flag(p)
    p.set_defaults(func=run)


def _layouts_table(report: FitReport) -> Table:
    t = Table(title="layouts that fit (tightest card shown)")
    for col in ("search", "layout", "GPUs", "weights/card", "act+reserve", "KV free/card", "KV tokens"):
        t.add_column(col, justify="left" if col in ("search", "layout") else "right")
    rows: list[tuple[str, LayoutFit | None]] = [("TP in a node", report.min_tp), ("TP x PP", report.min_tp_pp)]
    if report.min_tp_ep is not None or report.params_active != report.params_total:
        rows.append(("TP x EP", report.min_tp_ep))
    for name, f in rows:
        if f is None:
            t.add_row(name, "none fits", "-", "-", "-", "-", "-")
        else:
            t.add_row(name, f.label, str(f.gpus), fmt_bytes(f.weight_bytes),
                      fmt_bytes(f.activation_bytes + f.reserve_bytes), fmt_bytes(f.kv_free_bytes),
                      f"{f.kv_capacity_tokens:,}")
    return t


def run(args: argparse.Namespace) -> int:
    model, gpu = model_from_args(args), gpu_from_args(args)
    options = FitOptions(max_num_batched_tokens=args.max_num_batched_tokens,
                         gpu_memory_utilization=args.gpu_memory_utilization,
                         context_tokens=args.context_tokens, max_gpus=args.max_gpus)
    report = fit(model, gpu, args.weight_dtype, args.kv_dtype, options)
    if args.json:
        emit_json(report.as_dict())
        return 0
    out = console()
    for line in report.lines:
        out.print(line)
    out.print(f"\none card of {gpu.name}:")
    for line in report.single.lines:
        out.print("  " + line)
    if not report.fits_one_card:
        out.print(_layouts_table(report))
        for name, f in (("TP", report.min_tp), ("TP x PP", report.min_tp_pp), ("TP x EP", report.min_tp_ep)):
            if f is not None:
                out.print(f"\n{name}: {f.label}, tightest card:")
                for line in f.lines:
                    out.print("  " + line)
    return 0
