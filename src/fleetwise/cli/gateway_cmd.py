"""`fleetwise gateway`: serve fleetwise's routing policies in front of OpenAI-compatible engines.

    fleetwise gateway --config gateway.yaml
    fleetwise gateway --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 [--policy P] --port N
    fleetwise gateway --prefill URL --decode URL [--policy P] --port N
    fleetwise gateway --plan FLEET.json --backends-file ENDPOINTS.json   # the fleet's routing and recovery

Owns argument handling only; the gateway is `fleetwise.gateway`.
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetwise.cli.common import LOG_LEVELS, check_listen_address, input_file, int_flag, rename_flag
from fleetwise.errors import SpecError
from fleetwise.routing import policy_names
from fleetwise.spec.base import load_document, validate
from fleetwise.spec.limits import MAX_TCP_PORT

MAX_WORKERS = 256
"""Most --workers (processes on one port; one or two per core is the useful range)."""
MAX_HASH_BLOCK_TOKENS = 1 << 20
"""Largest --hash-block-tokens accepted (a million-token block: far beyond any engine's)."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gateway", help="route OpenAI-compatible requests to engines with a fleetwise policy",
        description="An OpenAI-compatible gateway (completions, chat, models, health, readiness, metrics, "
                    "admin) that routes each request with the simulator's policies, scrapes the engines' "
                    "/metrics, retries before the first byte, orchestrates vLLM prefill/decode pairs and "
                    "enforces tenant limits. See docs/gateway.md.")
    p.add_argument("--config", metavar="G.yaml", type=input_file("gateway config"), help="gateway config file (flags below override it)")
    p.add_argument("--plan", metavar="FLEET", type=input_file("plan file"),
                   help="fleet document (`fleetwise plan --json/--fleet-out`, or a plan YAML): its routing policy "
                        "and failure-domain decisions (over --config; flags override)")
    p.add_argument("--backend", action="append", default=[], metavar="URL", help="a mixed backend (repeatable)")
    p.add_argument("--prefill", action="append", default=[], metavar="URL", help="a prefill backend (repeatable)")
    p.add_argument("--decode", action="append", default=[], metavar="URL", help="a decode backend (repeatable)")
    p.add_argument("--policy", choices=policy_names(), help="routing preset (default fleetwise-default)")
    served = p.add_argument("--served-model-name", action="append", default=[], metavar="NAME",
                            help="model name clients may ask for, repeatable (default: what the backends' "
                                 "/v1/models report)")
    rename_flag(p, "--model", served)  # --model names a model spec everywhere else
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int_flag(0, MAX_TCP_PORT), help="listen port (default 8000)")
    p.add_argument("--backends-file", metavar="FILE", help="watched YAML list of backends")
    p.add_argument("--tokenizer", metavar="T",
                   help="tokenize prompts for routing: 'fleetwise' (the emulator's tokenizer) or a HuggingFace "
                        "tokenizer.json (needs `tokenizers`); default: estimate from characters")
    p.add_argument("--hash-block-tokens", type=int_flag(1, MAX_HASH_BLOCK_TOKENS), metavar="N",
                   help="prompt tokens per prefix-hash block (default 64; with a backend's kv_events the "
                        "engine's KV block size, 16 for `fleetwise emulate`)")
    p.add_argument("--ledger", metavar="URL", help="usage ledger: SQLite file or postgresql://... (metering)")
    p.add_argument("--workers", type=int_flag(1, MAX_WORKERS), default=1, metavar="N",
                   help="serve from N processes sharing the port (SO_REUSEPORT; each follows the backends' "
                        "metrics and KV events itself; see docs/gateway.md, Production checklist)")
    p.add_argument("--log-level", default="warning", choices=LOG_LEVELS, help="server log level (default warning)")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> Any:
    """The `GatewayConfig` from `--config` with flags applied on top."""
    from fleetwise.gateway.config import BackendSpec, GatewayConfig

    cfg = load_document(GatewayConfig, args.config) if args.config else GatewayConfig()
    doc = cfg.model_dump(exclude_unset=True)
    if getattr(args, "plan", None):
        from fleetwise.gateway.config import fleet_settings
        from fleetwise.spec.plan import PlanSpec

        doc.update(fleet_settings(PlanSpec.load(args.plan)))
    flags = [(u, "mixed", "--backend") for u in args.backend] + [(u, "prefill", "--prefill") for u in args.prefill] + \
        [(u, "decode", "--decode") for u in args.decode]
    for url, role, flag in flags:  # a bad URL is named by its flag, not by its place in the merged list
        validate(BackendSpec, {"url": url, "role": role}, flag)
    if flags:
        doc["backends"] = [*doc.get("backends", []), *({"url": u, "role": r} for u, r, _ in flags)]
    if args.policy:
        doc["routing"] = {**doc.get("routing", {}), "policy": args.policy}
    for key, val in (("host", args.host), ("port", args.port), ("backends_file", args.backends_file),
                     ("ledger", getattr(args, "ledger", None)), ("tokenizer", getattr(args, "tokenizer", None))):
        if val is not None:
            doc[key] = val
    if args.served_model_name:
        doc["models"] = args.served_model_name
    if getattr(args, "hash_block_tokens", None) is not None:
        doc["limits"] = {**doc.get("limits", {}), "hash_block_tokens": args.hash_block_tokens}
    out = validate(GatewayConfig, doc, args.config or "command line")
    if not out.backends and not out.backends_file:
        raise SpecError("no backends: pass --backend URL (or --prefill/--decode), list `backends:` in --config, or "
                        "--backends-file FILE (`fleetwise emulate --plan PLAN --endpoints FILE` writes one)")
    return out


def started_line(gw: Any, port: int | None = None) -> str:
    """What the gateway serves once started: its address (`port`: the one bound, where --port 0
    let the system pick), the backends it has read (config and backends file) by role, and the policy."""
    cfg = gw.cfg
    roles: dict[str, int] = {}
    for b in gw.backends.live.values():
        roles[b.spec.role] = roles.get(b.spec.role, 0) + 1
    by_role = ", ".join(f"{n} {r}" for r, n in sorted(roles.items())) or "none yet"
    source = f" (watching {cfg.backends_file})" if cfg.backends_file else ""
    return (f"fleetwise gateway on http://{cfg.host}:{cfg.port if port is None else port} -> {sum(roles.values())} "
            f"backend(s): {by_role}"
            f"{source}, policy {cfg.routing.policy}")


def run(args: argparse.Namespace) -> int:
    from fleetwise.gateway import Gateway, serve
    from fleetwise.gateway.server import listening_socket, serve_workers
    from fleetwise.report.dashboard import render_dashboard

    cfg = build_config(args)
    check_listen_address(cfg.host, "--host" if args.host is not None else f"{args.config}: host")
    workers = getattr(args, "workers", 1)
    # Built here so a mistake stops the command before binding; with workers, each builds its own
    # after the fork, so this one opens no ledger connection a fork would share.
    gw = Gateway(cfg if workers == 1 else cfg.model_copy(update={"ledger": None}), dashboard=render_dashboard)
    try:
        if workers > 1:  # each worker builds its own gateway after the fork (nothing shared but the port)
            def bound(port: int) -> None:
                print(f"fleetwise gateway on http://{cfg.host}:{port}: {workers} workers, policy "
                      f"{cfg.routing.policy}", flush=True)

            return serve_workers(lambda: Gateway(cfg, dashboard=render_dashboard), cfg.host, cfg.port, workers,
                                 args.log_level, bound)
        sock = listening_socket(cfg.host, cfg.port)
        port = int(sock.getsockname()[1])  # the system's pick under --port 0
        serve(gw, cfg.host, port, args.log_level, sock, on_ready=lambda: print(started_line(gw, port), flush=True))
    except OSError as err:
        raise SpecError(f"--port {cfg.port}: cannot listen on {cfg.host}:{cfg.port} ({err.strerror}); "
                        "pick a free port") from None
    return 0
