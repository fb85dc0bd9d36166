"""`fleetwise emulate`: serve one emulated engine replica over vLLM's HTTP interface.

    fleetwise emulate --model llama-3.1-8b --gpu h100-sxm --port 8001 [--role prefill|decode|mixed]
        [--tp N] [--time-scale X] [--seed S] [--admin-token T] ...

Owns argument handling only; the server is `fleetwise.emulator.app.create_app`, served by uvicorn.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fleetwise.errors import SpecError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "emulate", help="serve an emulated engine replica that speaks vLLM's HTTP API",
        description="Run the engine model on a wall clock behind vLLM's OpenAI-compatible HTTP interface: "
                    "completions and chat (streaming or not), /v1/models, /health, Prometheus /metrics with "
                    "vLLM's names, KV events, prefill/decode disaggregation and injectable faults. Every time "
                    "it reports is in modelled seconds. See docs/emulator.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", required=True, metavar="M", help="catalog model name or model spec file")
    p.add_argument("--gpu", required=True, metavar="G", help="catalog accelerator name or accelerator spec file")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel degree of the replica")
    p.add_argument("--pp", type=int, default=1, help="pipeline parallel degree of the replica")
    p.add_argument("--role", choices=("mixed", "prefill", "decode"), default="mixed",
                   help="mixed = colocated; prefill/decode = one half of a disaggregated pair "
                        "(vLLM's kv_transfer_params protocol)")
    p.add_argument("--profile", metavar="P.json", default=None, help="calibrated perf profile (default: built-in)")
    p.add_argument("--model-version", default="v1", help="version label the replica reports")
    p.add_argument("--served-model-name", default=None, help="model name clients send (default: --model)")
    p.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output (default: the "
                                                                   "model's context)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                   help="modelled seconds per wall second: 10 runs ten times faster than the modelled hardware")
    p.add_argument("--seed", type=int, default=0, help="seed of the output-length model")
    p.add_argument("--output-lengths", default=None, metavar="JSON",
                   help='length distribution for requests without max_tokens, e.g. \'{"kind": "lognormal", '
                        '"median_tokens": 200, "p99_tokens": 2000}\' (default: that one, max 8192)')
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=8000, help="port to bind")
    p.add_argument("--admin-token", default=None,
                   help="bearer token for POST /admin/faults (default: $FLEETWISE_EMULATOR_ADMIN_TOKEN; "
                        "unset = admin disabled, every admin call gets 401)")
    p.add_argument("--weight-dtype", choices=("bf16", "fp8", "int4"), default="bf16", help="weight dtype")
    p.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16", help="KV cache dtype")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="fraction of HBM the engine may use")
    p.add_argument("--max-num-seqs", type=int, default=None, help="most running sequences (default 256)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget per step (default 8192)")
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default 16)")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    p.add_argument("--kv-link-gbps", type=float, default=None,
                   help="per-GPU NIC of the KV path in Gbit/s (decode role pulls over it; default 400)")
    p.add_argument("--kv-link-latency", type=float, default=None, metavar="S",
                   help="one-way latency of a KV transfer in seconds (default 2e-05)")
    p.add_argument("--kv-lease", type=float, default=480.0, metavar="S",
                   help="prefill role: modelled seconds a prefilled request's KV waits to be pulled")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn log level")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> Any:
    """The `EmulatorConfig` the options describe (SpecError on a bad value)."""
    from fleetwise.emulator.config import EmulatorConfig
    from fleetwise.spec.base import validate
    from fleetwise.spec.plan import KvLinkSpec
    from fleetwise.spec.workload import IndependentLengths

    extra: dict[str, Any] = {}
    if args.output_lengths is not None:
        try:
            dist = json.loads(args.output_lengths)
        except ValueError as err:
            raise SpecError(f"--output-lengths: not JSON ({err}); e.g. '{{\"kind\": \"fixed\", \"tokens\": 128}}'") \
                from None
        extra["output_lengths"] = validate(IndependentLengths, {"input": {"kind": "fixed", "tokens": 1},
                                                                "output": dist}, "--output-lengths").output
    link: dict[str, Any] = {}
    if args.kv_link_gbps is not None:
        link["gbps"] = args.kv_link_gbps
    if args.kv_link_latency is not None:
        link["latency_s"] = args.kv_link_latency
    for name in ("tp", "pp", "port"):
        if getattr(args, name) < (0 if name == "port" else 1):
            raise SpecError(f"--{name}={getattr(args, name)} must be at least {0 if name == 'port' else 1}")
    return EmulatorConfig(
        model=args.model, gpu=args.gpu, tp=args.tp, pp=args.pp, role=args.role, model_version=args.model_version,
        time_scale=args.time_scale, seed=args.seed, host=args.host, port=args.port,
        served_model_name=args.served_model_name, max_model_len=args.max_model_len,
        weight_dtype=args.weight_dtype, kv_dtype=args.kv_dtype, gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size, enable_prefix_caching=not args.no_prefix_caching, profile=args.profile,
        admin_token=args.admin_token, kv_link=validate(KvLinkSpec, link, "--kv-link-*"), kv_lease_s=args.kv_lease,
        **extra)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from fleetwise.emulator.app import create_app

    cfg = config_from_args(args)
    app = create_app(cfg)  # builds the engine now, so a bad model/gpu/fit fails before binding
    print(f"fleetwise emulate: {cfg.name} on {cfg.tp}x{cfg.gpu} role={cfg.role} time-scale={cfg.time_scale:g} "
          f"at http://{cfg.host}:{cfg.port}", flush=True)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=args.log_level, access_log=False)
    return 0
