"""Helpers shared by subcommands: the --model/--gpu/--json arguments, JSON output, rich console.

Owns argument spelling and output conventions so every subcommand reads the same way; does not
own any subcommand's logic.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from fleetwise.spec.catalog import resolve_gpu, resolve_model
from fleetwise.spec.hardware import AcceleratorSpec
from fleetwise.spec.inputs import strict_json_dumps
from fleetwise.spec.model import ModelSpec


def add_model_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--model", required=required, metavar="M",
        help="catalog model name (see `fleetwise catalog models`), a HF config.json, or a ModelSpec YAML/JSON",
    )


def add_gpu_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--gpu", required=required, metavar="G",
        help="catalog accelerator name (see `fleetwise catalog gpus`) or an AcceleratorSpec YAML/JSON",
    )


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    return resolve_model(args.model)


def gpu_from_args(args: argparse.Namespace) -> AcceleratorSpec:
    return resolve_gpu(args.gpu)


def emit_json(obj: Any) -> None:
    """Print `obj` as indented strict JSON on stdout (non-finite floats become null)."""
    sys.stdout.write(strict_json_dumps(obj) + "\n")


def console() -> Console:
    """A rich console on stdout that never interprets brackets in our text as markup."""
    width = None if sys.stdout.isatty() else 200  # pipes and captures get full rows, not 80 columns
    return Console(file=sys.stdout, markup=False, highlight=False, soft_wrap=True, width=width)


def fmt_bytes(x: float) -> str:
    """Decimal GB (as datasheets write them)."""
    return f"{x / 1e9:,.1f} GB"


def fmt_count(x: float) -> str:
    """Parameter counts: 70.6B, 1.03T."""
    return f"{x / 1e12:.2f}T" if x >= 1e12 else f"{x / 1e9:.1f}B"
