"""`fleetwise measure`: time prefill, decode and mixed steps of a model's shape on the local accelerator.

Owns the command line, the grid of steps and the ground-truth file it writes
(`fleetwise-groundtruth/1`, the format of `perf/ground_truth/`, read by `fleetwise calibrate`);
the model and the timing live in `measure_torch`. Needs PyTorch: `pip install 'fleetwise[measure]'`.

    fleetwise measure -o GT.json (--model NAME | --shape SHAPE.json) [--layers N] [--kinds prefill,decode,mixed]
                      [--device cuda] [--budget-s 420] [--tiny]
    fleetwise calibrate GT.json -o PROFILE.json --gpu NAME

The grid is the shipped ground truth's (`PREFILL`, `DECODE_BATCH` x `DECODE_CTX` within the KV
budget, `MIXED`); `--tiny` times a two-layer shape with every length clipped, on any device in
seconds (CI proves the file with it on a CPU). Each point is written as soon as it is timed, so a
run stopped by its budget keeps what it measured.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from fleetwise.cli.common import console as _console
from fleetwise.cli.common import float_flag, input_file, int_flag
from fleetwise.errors import SpecError
from fleetwise.perf.groundtruth import GROUNDTRUTH_SCHEMA
from fleetwise.spec.catalog import resolve_model
from fleetwise.spec.inputs import read_document
from fleetwise.spec.model import ModelSpec
from fleetwise.spec.output import check_writable_file, write_json

# The shipped ground truth's grid (its README; the GPU timing tool's PREFILL, DECODE_*, MIXED):
PREFILL = ((1, 128), (1, 512), (1, 1024), (1, 2048), (1, 4096), (1, 8192), (1, 16384), (1, 32768),
           (4, 1024), (16, 512), (8, 2048))
DECODE_BATCH = (1, 4, 16, 32, 64, 128, 256)
DECODE_CTX = (512, 2048, 8192, 32768)
MIXED = tuple((b, 2048, c) for b in (16, 64) for c in (0, 256, 512, 1024, 2048, 4096, 8192))
KV_BUDGET_BYTES = 40 * 2**30  # KV cache a decode point may allocate (the tool's; 3/4 of it for MoE models)
MOE_KV_SHARE = 0.75
# --tiny: the tool's two-layer shapes and its clipping of every length
TINY = {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "ffn": 512, "vocab": 1000}
TINY_MOE = {**TINY, "ffn": 0, "experts": 8, "topk": 2, "moe_ffn": 128}
TINY_MAX = {"seq": 256, "batch": 4, "ctx": 256, "chunk": 64}
REPS_SHORT, REPS_LONG, REPS_STEP = 5, 3, 20  # repetitions: prefills up to 8,192 tokens, longer ones, decode/mixed
SHORT_PREFILL_TOKENS = 8192
KINDS = ("prefill", "decode", "mixed")


def register(subparsers: Any) -> None:
    m = subparsers.add_parser(
        "measure", help="time prefill/decode/mixed steps on the local accelerator (ground truth for calibrate)",
        description="Time the steps of a model's shape with random weights on this machine's accelerator and "
                    "write a fleetwise-groundtruth/1 file for `fleetwise calibrate`. Needs PyTorch "
                    "(pip install 'fleetwise[measure]').")
    m.add_argument("-o", "--output", required=True, metavar="GT.json", help="where to write the measurements")
    src = m.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="NAME", help="catalog model whose shape to time (Llama-architecture)")
    src.add_argument("--shape", metavar="SHAPE.json", type=input_file("model shape"),
                     help="a ground-truth config: layers, hidden, heads, kv_heads, head_dim, ffn, vocab [experts, topk, moe_ffn]")
    m.add_argument("--layers", type=int_flag(1), metavar="N", help="time only the first N layers (a model too big for one card)")
    m.add_argument("--kinds", default=",".join(KINDS), metavar="K,..", help="which steps: prefill, decode, mixed")
    m.add_argument("--device", default=None, metavar="DEV", help="torch device (default: cuda when available, else cpu)")
    m.add_argument("--threads", type=int_flag(1), metavar="N", help="CPU threads torch may use (default: its own)")
    m.add_argument("--reps", type=int_flag(1), metavar="N",
                   help=f"timed runs per point (default: {REPS_SHORT} per prefill, {REPS_LONG} past "
                        f"{SHORT_PREFILL_TOKENS} tokens, {REPS_STEP} per decode or mixed step)")
    m.add_argument("--budget-s", type=float_flag(1.0), default=420.0, metavar="S", help="stop starting points after S seconds")
    m.add_argument("--tiny", nargs="?", const="dense", choices=("dense", "moe"), default=None,
                   help="a two-layer dense (or moe) shape, lengths clipped: proves the file in seconds")
    m.set_defaults(func=run_measure)


def model_config(model: ModelSpec, layers: int | None = None) -> dict[str, int]:
    """The ground-truth `config` of a Llama-architecture catalog model (SpecError naming what it lacks)."""
    lacks = []
    if model.attention != "gqa":
        lacks.append(f"{model.attention} attention")
    if model.moe is not None and (model.moe.num_shared_experts or model.num_dense_layers):
        lacks.append("shared experts or dense layers beside the experts")
    if lacks:
        raise SpecError(f"--model {model.name}: {' and '.join(lacks)}; `fleetwise measure` times GQA decoders with a "
                        "SwiGLU FFN or routed experts: pass --shape with such a shape")
    cfg = {"layers": layers or model.num_layers, "hidden": model.hidden_size, "heads": model.num_attention_heads,
           "kv_heads": model.num_kv_heads, "head_dim": model.head_dim, "ffn": model.ffn_size, "vocab": model.vocab_size}
    if model.moe is not None:
        cfg.update(ffn=0, experts=model.moe.num_experts, topk=model.moe.experts_per_token,
                   moe_ffn=model.moe.expert_ffn_size)
    return cfg


def _config(args: argparse.Namespace) -> tuple[str, dict[str, int]]:
    if args.shape:
        from fleetwise.perf.groundtruth import model_from_config

        cfg = read_document(args.shape)
        if not isinstance(cfg, dict):
            raise SpecError(f"--shape {args.shape}: expected a JSON object of layers, hidden, heads, ...")
        model_from_config(Path(args.shape).stem, cfg, f"--shape {args.shape}")  # validates every size
        cfg = {k: int(v) for k, v in cfg.items()}
        return Path(args.shape).stem, {**cfg, "layers": args.layers or cfg["layers"]}
    if args.model:
        return args.model, model_config(resolve_model(args.model), args.layers)
    if args.tiny:
        return f"tiny-{args.tiny}", dict(TINY_MOE if args.tiny == "moe" else TINY)
    raise SpecError("fleetwise measure: give --model NAME, --shape SHAPE.json or --tiny")


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise SpecError(f"--kinds {text!r}: expected a comma list of {', '.join(KINDS)}")
    return kinds


def grid(cfg: dict[str, int], kinds: tuple[str, ...], tiny: bool) -> list[tuple[str, int, int, int]]:
    """The steps to time, (kind, batch, seq or ctx, chunk), in the ground truth's order."""
    clip = (lambda k, v: min(v, TINY_MAX[k])) if tiny else (lambda k, v: v)
    kv_token = 2 * cfg["layers"] * cfg["kv_heads"] * cfg["head_dim"] * 2
    budget = KV_BUDGET_BYTES * (MOE_KV_SHARE if cfg.get("experts") else 1.0)
    out: list[tuple[str, int, int, int]] = []
    if "prefill" in kinds:
        out += sorted({("prefill", b, clip("seq", s), 0) for b, s in PREFILL}, key=lambda p: (p[1] * p[2], p[1]))
    if "decode" in kinds:
        steps = {("decode", clip("batch", b), clip("ctx", c), 0) for c in DECODE_CTX for b in DECODE_BATCH}
        out += sorted((p for p in steps if kv_token * p[1] * p[2] <= budget), key=lambda p: (p[2], p[1]))
    if "mixed" in kinds:
        steps = {("mixed", clip("batch", b), clip("ctx", c), clip("chunk", n)) for b, c, n in MIXED}
        out += sorted(steps, key=lambda p: (p[1], p[3]))
    return out


def _method(cuda: bool) -> str:
    graphs = "decode step CUDA-graph replay" if cuda else "decode step eager (no CUDA graphs off a GPU)"
    return (f"random bf16 weights; prefill eager; {graphs}; times are medians in ms; MoE experts by "
            f"{'torch._grouped_mm' if cuda else 'a loop of matrix products'} over tokens sorted by expert; "
            "fleetwise measure")


def _time_point(model: Any, point: tuple[str, int, int, int], reps: int | None) -> dict[str, Any]:
    from fleetwise.cli.measure_torch import time_prefill, time_step

    kind, batch, size, chunk = point
    if kind == "prefill":
        n = reps or (REPS_SHORT if batch * size <= SHORT_PREFILL_TOKENS else REPS_LONG)
        med, lo, hi = time_prefill(model, batch, size, n)
        return {"batch": batch, "seq": size, "ms": med, "min_ms": lo, "max_ms": hi}
    med, lo, hi = time_step(model, batch, size, chunk, reps or REPS_STEP)
    row = {"batch": batch, "ctx": size, "ms": med, "min_ms": lo, "max_ms": hi}
    return {**row, "chunk": chunk} if kind == "mixed" else row


def run_measure(args: argparse.Namespace) -> int:
    check_writable_file(args.output, "--output")
    name, cfg = _config(args)
    kinds = _kinds(args.kinds)
    try:
        import torch
    except ImportError:
        raise SpecError("fleetwise measure needs PyTorch: pip install 'fleetwise[measure]'") from None
    from fleetwise.cli.measure_torch import Decoder, ceilings

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SpecError(f"--device {device}: no CUDA device here; use --device cpu (with --tiny) or run on a GPU")
    t0 = time.monotonic()
    doc: dict[str, Any] = {
        "schema": GROUNDTRUTH_SCHEMA, "device": torch.cuda.get_device_name(0) if cuda else f"{device} (torch)",
        "torch": torch.__version__, "cuda": torch.version.cuda, "dtype": "bfloat16", "method": _method(cuda),
        "ceilings": ceilings(torch, device) if cuda else {}, "models": {}}
    if cuda:
        torch.cuda.empty_cache()
    out = Path(args.output)

    def save() -> None:
        doc["elapsed_s"] = round(time.monotonic() - t0, 3)
        write_json(out, doc, indent=1)

    model = Decoder(cfg, device, torch.bfloat16)
    kv_token = 2 * cfg["layers"] * cfg["kv_heads"] * cfg["head_dim"] * 2
    entry: dict[str, Any] = {"config": cfg, "param_bytes": model.param_bytes, "kv_bytes_per_token": kv_token,
                             **{k: [] for k in kinds}}
    doc["models"][name] = entry
    save()
    con = _console()
    for point in grid(cfg, kinds, args.tiny is not None):
        if time.monotonic() - t0 > args.budget_s:
            entry.setdefault("skipped", []).append(f"{point[0]} {point[1:]}: over the {args.budget_s:g} s budget")
            continue
        try:
            entry[point[0]].append(_time_point(model, point, args.reps))
        except (RuntimeError, MemoryError) as err:  # out of memory on one shape must not end the run
            entry.setdefault("errors", []).append(f"{point[0]} {point[1:]}: {type(err).__name__}: {err}"[:300])
            if cuda:
                torch.cuda.empty_cache()
            continue
        con.print(f"{name} {point[0]} {point[1:]}: {entry[point[0]][-1]['ms']:.3f} ms")
        save()
    save()
    points = sum(len(entry[k]) for k in kinds)
    con.print(f"wrote {points} points to {out} in {time.monotonic() - t0:.1f} s; "
              f"next: fleetwise calibrate {out} -o PROFILE.json --gpu NAME")
    return 0
