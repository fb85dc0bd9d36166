"""`fleetwise calibrate` and `fleetwise predict`: fit a perf profile to measured steps, and check it.

Owns the two subcommands' arguments and output (rich table or JSON); the fit, the predictions
and their summary live in `fleetwise.perf.calibrate`, file parsing in `fleetwise.perf.groundtruth`.

    fleetwise calibrate GROUND_TRUTH.json... -o PROFILE.json [--gpu h200-sxm] [--no-band]
    fleetwise predict --profile PROFILE.json --against GROUND_TRUTH.json [--gpu G] [--json]

Ground truth comes from `fleetwise measure` (cli/measure_cmd.py) or the shipped files. A calibrate
mode fed by a live fleet's metrics instead of ground-truth files belongs in its own module beside
`perf.calibrate`, added here as one more `calibrate` option.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.table import Table

from fleetwise.cli import measure_cmd
from fleetwise.cli.common import console as _console
from fleetwise.cli.common import emit_json, input_file
from fleetwise.errors import SpecError
from fleetwise.perf.calibrate import (
    calibrate,
    faster_than_the_card,
    fit_warnings,
    held_out_residuals,
    predict,
    summarize,
)
from fleetwise.perf.groundtruth import load_groundtruth
from fleetwise.perf.profile import Profile
from fleetwise.spec.catalog import resolve_gpu
from fleetwise.spec.output import check_writable_file


def register(subparsers: Any) -> None:
    c = subparsers.add_parser(
        "calibrate", help="fit perf-model efficiency factors to measured step times",
        description="Fit the shared efficiency/overhead factors of the roofline to ground-truth files "
                    "(fleetwise-groundtruth/1) and write a profile JSON.")
    c.add_argument("files", nargs="*", metavar="GROUND_TRUTH.json", type=input_file("ground-truth file"), help="measured step timings")
    c.add_argument("-o", "--output", required=True, metavar="PROFILE.json", help="where to write the profile")
    c.add_argument("--gpu", default="h200-sxm", metavar="G", help="accelerator the files were measured on")
    c.add_argument("--json", action="store_true", help="print the profile as JSON")
    c.add_argument("--no-band", action="store_true",
                   help="skip the held-out residuals (5 more fits) that give predictions their uncertainty band")
    from fleetwise.cli import from_metrics

    from_metrics.add_flags(c)
    c.set_defaults(func=run_calibrate)

    p = subparsers.add_parser(
        "predict", help="compare a profile's predictions with measured step times",
        description="Predict every point of a ground-truth file with a profile; print measured vs "
                    "predicted and the median/max absolute % error per kind.")
    p.add_argument("--profile", required=True, metavar="PROFILE.json", type=input_file("perf profile"), help="profile from `fleetwise calibrate`")
    p.add_argument("--against", required=True, nargs="+", metavar="GROUND_TRUTH.json",
                   type=input_file("ground-truth file"), help="measured step timings")
    p.add_argument("--gpu", default=None, metavar="G", help="accelerator (default: the profile's)")
    p.add_argument("--json", action="store_true", help="print {points, summary} as JSON")
    p.set_defaults(func=run_predict)
    measure_cmd.register(subparsers)  # `fleetwise measure` writes the files these two read


def run_calibrate(args: argparse.Namespace) -> int:
    if args.from_metrics:
        from fleetwise.cli import from_metrics

        return from_metrics.run(args)
    if not args.files:
        raise SpecError("give GROUND_TRUTH.json files (measured steps), or --from-metrics SOURCE... --plan FLEET")
    check_writable_file(args.output, "--output")
    files = [load_groundtruth(f) for f in args.files]
    gpu = resolve_gpu(args.gpu)
    engines = sorted({f.engine for f in files})
    base = Profile(accelerator=gpu.name, engine="; ".join(engines),
                   source="fitted to " + ", ".join(str(f) for f in args.files))
    prof = calibrate(files, gpu, base=base)
    for line in fit_warnings(files) + faster_than_the_card(files, gpu):
        print(f"warning: {line}", file=sys.stderr)
    if not args.no_band:
        prof = prof.model_copy(update={"residuals": held_out_residuals(files, gpu, base)})
    prof.save(args.output)
    if args.json:
        emit_json(prof.model_dump(by_alias=True))
        return 0
    out = _console()
    t = Table(title=f"profile for {prof.accelerator} ({prof.engine})")
    t.add_column("factor")
    t.add_column("value", justify="right")
    for k, v in prof.factors().items():
        t.add_row(k, f"{v:.4g}")
    out.print(t)
    out.print(f"fit over {int(prof.fit['points'])} points: median |err| {prof.fit['median_abs_pct']:.1f}%, "
                  f"max {prof.fit['max_abs_pct']:.1f}%; {len(prof.residuals)} held-out residuals for "
                  f"uncertainty bands; wrote {args.output}")
    return 0


def run_predict(args: argparse.Namespace) -> int:
    prof = Profile.load(args.profile)
    name = args.gpu or prof.accelerator
    if name == "any":
        raise SpecError(f"{args.profile}: profile names no accelerator; pass --gpu (e.g. --gpu h200-sxm)")
    gpu = resolve_gpu(name)
    files = [load_groundtruth(f) for f in args.against]
    preds = predict(prof, files, gpu)
    summary = summarize(preds)
    if args.json:
        emit_json({"points": [p.as_dict() for p in preds], "summary": summary})
        return 0
    out = _console()
    t = Table(title=f"{prof.accelerator} profile vs {', '.join(args.against)}")
    for col in ("model", "kind", "batch", "seq|ctx", "chunk", "measured ms", "predicted ms", "error %"):
        t.add_column(col, justify="left" if col in ("model", "kind") else "right")
    for p in preds:
        pt = p.point
        t.add_row(pt.model, pt.kind, str(pt.batch), str(pt.seq if pt.kind == "prefill" else pt.ctx),
                  str(pt.chunk) if pt.kind == "mixed" else "", f"{pt.measured_s * 1e3:.2f}",
                  f"{p.predicted_s * 1e3:.2f}", f"{p.error_pct:+.1f}")
    out.print(t)
    for kind, s in summary.get("by_kind", {}).items():
        out.print(f"{kind}: {s['points']} points, median |err| {s['median_abs_pct']:.1f}%, max {s['max_abs_pct']:.1f}%")
    out.print(f"all: {summary['points']} points, median |err| {summary['median_abs_pct']:.1f}%, "
                  f"max {summary['max_abs_pct']:.1f}%")
    return 0
