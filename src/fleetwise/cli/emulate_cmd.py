"""`fleetwise emulate`: serve one emulated engine replica over vLLM's HTTP interface.

    fleetwise emulate --model llama-3.1-8b --gpu h100-sxm --port 8001 [--role prefill|decode|mixed]
        [--tp N] [--time-scale X] [--seed S] [--admin-token T] ...
    fleetwise emulate --plan PLAN.yaml --port 8001 [--endpoints FILE] [--faults F.yaml] ...   # a whole fleet

Owns argument handling and, for `--plan`, starting one emulator process per replica of the plan
(ports counting up from --port, in plan order), replaying a fault file on them (`--faults`, the
simulator's vocabulary: `cli.fault_replay`) and stopping them together. The server is
`fleetwise.emulator.app.create_app`, served by uvicorn with the connection limits of
`fleetwise.live.http`.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

from fleetwise.cli.common import (
    LOG_LEVELS,
    SEED_MAX,
    check_listen_address,
    check_port_free,
    float_flag,
    input_file,
    int_flag,
)
from fleetwise.cli.local_fleet import FLEET_START_TIMEOUT_S, stop_on_signals
from fleetwise.errors import SpecError
from fleetwise.spec.dtypes import KV_DTYPES, WEIGHT_DTYPES
from fleetwise.spec.engine_defaults import GPU_MEMORY_UTILIZATION, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from fleetwise.spec.limits import (
    MAX_BLOCK_TOKENS,
    MAX_DURATION_S,
    MAX_ENGINE_SEQS,
    MAX_LOCAL_REPLICAS,
    MAX_TCP_PORT,
    MAX_TOKENS,
)
from fleetwise.spec.output import check_writable_file, write_json


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "emulate", help="serve an emulated engine replica that speaks vLLM's HTTP API",
        description="Run the engine model on a wall clock behind vLLM's OpenAI-compatible HTTP interface: "
                    "completions and chat (streaming or not), /v1/models, /health, Prometheus /metrics with "
                    "vLLM's names, KV events, prefill/decode disaggregation and injectable faults. Every time "
                    "it reports is in modelled seconds. See docs/emulator.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", metavar="M", help="catalog model name or model spec file (required without --plan)")
    p.add_argument("--gpu", metavar="G", help="catalog accelerator name or accelerator spec file (required "
                                               "without --plan)")
    p.add_argument("--plan", metavar="PLAN", default=None, type=input_file("plan file"),
                   help="start one emulator process per replica of this fleet document (`fleetwise plan "
                        "--json/--fleet-out` or a plan YAML: its pools give model, gpu, tp, pp, role, dtypes and "
                        "engine knobs; its kv_link the KV path); ports count up from --port")
    p.add_argument("--endpoints", metavar="FILE", default=None,
                   help="with --plan: write the replicas as the gateway's backend list (name, url, role, pool, "
                        "model_version, region, accelerator), for `fleetwise gateway --plan PLAN --backends-file FILE`")
    p.add_argument("--faults", metavar="F.yaml", default=None, type=input_file("fault file"),
                   help="with --plan: replay this fault file (the simulator's vocabulary) on the replicas, times in "
                        "modelled seconds from when they all serve")
    p.add_argument("--tp", type=int_flag(1, 1024), default=1, help="tensor parallel degree of the replica")
    p.add_argument("--pp", type=int_flag(1, 1024), default=1, help="pipeline parallel degree of the replica")
    p.add_argument("--ep", type=int_flag(1, 1024), default=1,
                   help="expert parallel degree of an MoE replica, over its TP x PP GPUs (a pool's parallelism.ep)")
    p.add_argument("--expert-imbalance", type=float_flag(minimum=1.0), default=1.0, metavar="X",
                   help="with --ep > 1: the busiest rank's routed tokens over the mean (a pool's expert_imbalance)")
    p.add_argument("--role", choices=("mixed", "prefill", "decode"), default="mixed",
                   help="mixed = colocated; prefill/decode = one half of a disaggregated pair "
                        "(vLLM's kv_transfer_params protocol)")
    p.add_argument("--profile", metavar="P.json", default=None, type=input_file("perf profile"), help="calibrated perf profile (default: built-in)")
    p.add_argument("--model-version", default="v1", help="version label the replica reports")
    p.add_argument("--served-model-name", default=None, help="model name clients send (default: --model)")
    p.add_argument("--max-model-len", type=int_flag(2, MAX_TOKENS), default=None, help="longest prompt + output (default: the "
                                                                   "model's context)")
    p.add_argument("--time-scale", type=float_flag(positive=True), default=1.0, metavar="X",
                   help="modelled seconds per wall second: 10 runs ten times faster than the modelled hardware")
    p.add_argument("--no-spin", action="store_true",
                   help="sleep until each step deadline instead of waking early (by the learned wake-up lateness, "
                        "at most 5%% of the sleep) and spinning to it: less CPU, later step ends")
    p.add_argument("--seed", type=int_flag(0, SEED_MAX), default=0, help="seed of the output-length model")
    p.add_argument("--output-lengths", default=None, metavar="JSON",
                   help='length distribution for requests without max_tokens, e.g. \'{"kind": "lognormal", '
                        '"median_tokens": 200, "p99_tokens": 2000}\' (default: that one, max 8192)')
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int_flag(0, MAX_TCP_PORT), default=8000, help="port to bind")
    p.add_argument("--admin-token", default=None,
                   help="bearer token for POST /admin/faults (default: $FLEETWISE_EMULATOR_ADMIN_TOKEN; "
                        "unset = admin disabled, every admin call gets 401)")
    add_engine_flags(p)
    add_serving_flags(p)
    p.set_defaults(func=run)


def add_serving_flags(p: Any) -> None:
    """The replica's KV lease, measured speed, HTTP limits, KV-event publishing and logging flags."""
    p.add_argument("--kv-lease", type=float_flag(positive=True, maximum=MAX_DURATION_S), default=480.0, metavar="S",
                   help="prefill role: modelled seconds a prefilled request's KV waits to be pulled")
    p.add_argument("--step-time-factor", type=float, default=1.0, metavar="X",
                   help="every step takes X times the modelled time: a fleet's measured speed "
                        "(`fleetwise calibrate --from-metrics`), before any slowdown fault")
    p.add_argument("--http-limits", metavar="JSON", default=None,
                   help="connection limits and timeouts as JSON, e.g. '{\"header_timeout_s\": 5}' (fields: "
                        "header_timeout_s, body_timeout_s, keep_alive_timeout_s, max_header_bytes, max_headers; "
                        "see docs/gateway.md, Production checklist)")
    p.add_argument("--kv-events-config", metavar="JSON", default=None,
                   help="publish KV events as vLLM does, e.g. '{\"enable_kv_cache_events\": true, \"publisher\": "
                        "\"zmq\", \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\", "
                        "\"topic\": \"\"}' (vLLM's --kv-events-config; see docs/emulator.md)")
    p.add_argument("--kv-events-port", type=int_flag(1, MAX_TCP_PORT), default=None, metavar="P",
                   help="with --plan: each replica publishes its KV events over ZeroMQ on ports from P (replica i: "
                        "P+2i, replay P+2i+1), and --endpoints lists them for the gateway")
    p.add_argument("--server", choices=("lean", "uvicorn"), default=None,
                   help="deprecated and ignored: the emulator is always served by uvicorn")
    p.add_argument("--log-level", default="warning", choices=LOG_LEVELS, help="server log level (default warning)")


def add_engine_flags(p: Any) -> None:
    """The replica's dtypes, memory share, engine knobs and KV link flags."""
    p.add_argument("--weight-dtype", choices=WEIGHT_DTYPES, default="bf16", help="weight storage format (default bf16)")
    p.add_argument("--kv-dtype", choices=KV_DTYPES, default="bf16", help="KV-cache format (default bf16)")
    p.add_argument("--gpu-memory-utilization", type=float_flag(positive=True, maximum=1.0), default=GPU_MEMORY_UTILIZATION, help=f"fraction of HBM the engine may use (default {GPU_MEMORY_UTILIZATION})")
    p.add_argument("--max-num-seqs", type=int_flag(1, MAX_ENGINE_SEQS), default=None, help=f"most running sequences (default {MAX_NUM_SEQS})")
    p.add_argument("--max-num-batched-tokens", type=int_flag(1, MAX_TOKENS), default=None, help=f"token budget per step (default {MAX_NUM_BATCHED_TOKENS})")
    p.add_argument("--block-size", type=int_flag(1, MAX_BLOCK_TOKENS), default=None, help="tokens per KV block (default 16)")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    p.add_argument("--no-chunked-prefill", action="store_true",
                   help="disable chunked prefill: a prompt is prefilled in one step (vLLM's --no-enable-chunked-prefill)")
    p.add_argument("--kv-link-gbps", type=float_flag(positive=True), default=None,
                   help="per-GPU NIC of the KV path in Gbit/s (the KV port: a prefill replica sends, a decode replica pulls over it; default 400)")
    p.add_argument("--kv-link-latency", type=float_flag(0.0, MAX_DURATION_S), default=None, metavar="S",
                   help="one-way latency of a KV transfer in seconds (default 2e-05)")


def config_from_args(args: argparse.Namespace) -> Any:
    """The `EmulatorConfig` the options describe (SpecError on a bad value)."""
    from fleetwise.emulator.config import EmulatorConfig
    from fleetwise.spec.base import validate
    from fleetwise.spec.inputs import parse_json
    from fleetwise.spec.plan import KvLinkSpec
    from fleetwise.spec.workload import IndependentLengths

    extra: dict[str, Any] = {}
    if getattr(args, "http_limits", None) is not None:
        from fleetwise.spec.http import HttpLimitsSpec

        extra["http"] = validate(HttpLimitsSpec, parse_json(args.http_limits, "--http-limits"), "--http-limits")
    if getattr(args, "kv_events_config", None) is not None:
        from fleetwise.emulator.kv_events import KvEventsConfig

        extra["kv_events"] = validate(KvEventsConfig, parse_json(args.kv_events_config, "--kv-events-config"),
                                      "--kv-events-config")
    if args.output_lengths is not None:
        dist = parse_json(args.output_lengths, "--output-lengths")
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
    return validate(EmulatorConfig, dict(
        model=args.model, gpu=args.gpu, tp=args.tp, pp=args.pp, ep=args.ep, expert_imbalance=args.expert_imbalance,
        role=args.role, model_version=args.model_version,
        time_scale=args.time_scale, spin=not args.no_spin, seed=args.seed, host=args.host, port=args.port,
        served_model_name=args.served_model_name, max_model_len=args.max_model_len,
        weight_dtype=args.weight_dtype, kv_dtype=args.kv_dtype, gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size, enable_prefix_caching=not args.no_prefix_caching,
        enable_chunked_prefill=not args.no_chunked_prefill, profile=args.profile,
        admin_token=args.admin_token, kv_link=validate(KvLinkSpec, link, "--kv-link-*"), kv_lease_s=args.kv_lease,
        step_time_factor=args.step_time_factor,
        **extra), "emulator options")




def fleet_commands(args: argparse.Namespace, plan: Any) -> list[tuple[str, str, list[str]]]:
    """(replica name, role, argv) of every replica of fleet `plan`, ports from `--port` in plan order."""
    from fleetwise.deploy.emulated import emulate_args, kv_events_args

    common = ["--time-scale", repr(args.time_scale), "--seed", str(args.seed), "--log-level", args.log_level,
              "--kv-lease", repr(args.kv_lease)]
    if args.no_spin:
        common.append("--no-spin")
    for name in ("profile", "output_lengths", "max_model_len", "served_model_name", "http_limits"):
        value = getattr(args, name)
        if value is not None:
            common += [f"--{name.replace('_', '-')}", str(value)]
    if args.profile is None and plan.perf_profile:
        common += ["--profile", str(plan.perf_profile)]
    out: list[tuple[str, str, list[str]]] = []
    for pool in plan.pools:
        for j in range(pool.replicas):
            argv = [sys.executable, "-m", "fleetwise.cli.main", "emulate",
                    *emulate_args(plan, pool, args.host, args.port + len(out)), *common]
            kv = kv_events_of(args, len(out))
            if kv is not None:
                argv += kv_events_args(kv)
            out.append((f"{pool.name}-{j}", pool.role, argv))
    return out


def kv_events_of(args: argparse.Namespace, index: int) -> dict[str, Any] | None:
    """The gateway's `kv_events` entry of replica `index` (plan order) under `--kv-events-port`:
    PUB on port P+2i, replay on P+2i+1; None without the flag."""
    base = getattr(args, "kv_events_port", None)
    if base is None:
        return None
    port = base + 2 * index
    return {"transport": "zmq", "endpoint": f"tcp://{args.host}:{port}",
            "replay_endpoint": f"tcp://{args.host}:{port + 1}", "topic": ""}


def replica_fleet(args: argparse.Namespace, plan: Any, env: dict[str, str]) -> Any:
    """A `LocalFleet` of one emulator process per replica of `plan`, ports from `--port` in plan order."""
    from fleetwise.cli.local_fleet import LocalFleet, Member

    count = sum(p.replicas for p in plan.pools)
    if count > MAX_LOCAL_REPLICAS:
        raise SpecError(f"{args.plan}: {count} replicas: a local fleet starts at most {MAX_LOCAL_REPLICAS} emulator "
                        "processes (a limit, see docs/errors.md); scale pools[].replicas down for the rehearsal")
    members = []
    for i, (name, _, argv) in enumerate(fleet_commands(args, plan)):
        members.append(Member(name, argv, f"http://{args.host}:{args.port + i}/health", env))
    return LocalFleet(members)


def replica_url(fleet: Any, name: str) -> str:
    """Base URL of replica `name` of a fleet `replica_fleet` built."""
    return str(fleet.member(name).health_url).removesuffix("/health")


def serving(endpoints: list[dict[str, str]], procs: list[Any]) -> list[dict[str, str]]:
    """The endpoints whose replica process is still running (what `--endpoints` lists)."""
    return [ep for ep, p in zip(endpoints, procs, strict=True) if p.poll() is None]


def _watch(endpoints: list[dict[str, str]], fleet: Any, endpoints_file: str | None, replay: Any) -> None:
    """Replay the fault actions on time (restarting a crashed replica on its schedule), report each
    replica that exits (the others keep serving) and keep `endpoints_file` listing the ones
    serving; return when none is left and no restart is due."""
    from fleetwise.cli.fault_replay import SUPERVISE_POLL_S

    reported: set[str] = set()
    while len(reported) < len(endpoints) or replay.restarts_pending:
        restarted = replay.tick()
        reported.difference_update(restarted)
        procs = [fleet.member(ep["name"]).proc for ep in endpoints]
        codes = [(ep["name"], p.poll()) for ep, p in zip(endpoints, procs, strict=True) if ep["name"] not in reported]
        gone = [(name, code) for name, code in codes if code is not None]
        for name, status in gone:
            reported.add(name)
            print(f"fleetwise emulate: replica {name} exited with status {status}; "
                  f"{len(endpoints) - len(reported)} still serving", file=sys.stderr, flush=True)
        if endpoints_file and (gone or restarted):
            write_json(endpoints_file, serving(endpoints, procs))
        time.sleep(SUPERVISE_POLL_S)


def _check_port_span(flag: str, first: int, count: int, what: str) -> None:
    """SpecError naming `flag` unless `count` consecutive ports from `first` are all TCP ports
    (0, "any free port", is not: each replica's is known before it starts)."""
    if first == 0:
        raise SpecError(f"{flag}=0: the plan's {what} consecutive ports from {flag}, so the system cannot pick "
                        f"them; give a free port such as 8001")
    if first + count - 1 > MAX_TCP_PORT:
        raise SpecError(f"{flag}={first}: the plan's {what} ports {first}..{first + count - 1}, past the last TCP "
                        f"port {MAX_TCP_PORT}; give {flag} {MAX_TCP_PORT - count + 1} or lower")


def run_fleet(args: argparse.Namespace) -> int:
    """Start every replica of `--plan` as its own process; stop them all on Ctrl-C or SIGTERM. Each
    replica's port is checked free first and each must answer /health (else one line, exit 2);
    `--endpoints` lists only replicas serving. A replica that exits (a `crash` fault) is reported
    and the others keep serving; the command ends (status 1) when none is left."""
    if args.model or args.gpu:
        raise SpecError("give either --plan or --model/--gpu, not both")
    import os
    import secrets

    from fleetwise.cli.fault_replay import FaultReplay, live_fault_actions
    from fleetwise.emulator.config import ADMIN_TOKEN_ENV
    from fleetwise.gateway.config import fleet_backends
    from fleetwise.spec.plan import PlanSpec

    plan = PlanSpec.load(args.plan)
    if args.endpoints:  # before any replica starts
        check_writable_file(args.endpoints, "--endpoints")
    actions = live_fault_actions(args.faults, plan) if args.faults else []
    cmds = fleet_commands(args, plan)
    _check_port_span("--port", args.port, len(cmds), "replicas take")
    if args.kv_events_port is not None:
        _check_port_span("--kv-events-port", args.kv_events_port, 2 * len(cmds), "replicas' KV events take")
    for i, (name, _, _) in enumerate(cmds):  # a port held by another server would answer its /health
        check_port_free(args.host, args.port + i, f"--plan: replica {name} (--port {args.port} + {i})")
        kv = kv_events_of(args, i) or {}
        for k in ("endpoint", "replay_endpoint") if kv else ():
            check_port_free(args.host, int(kv[k].rsplit(":", 1)[1]), f"--plan: replica {name}'s KV events ({k})")
    env = dict(os.environ)
    if args.admin_token:  # through the environment, not the command line other users can read
        env[ADMIN_TOKEN_ENV] = args.admin_token
    elif actions and not env.get(ADMIN_TOKEN_ENV):  # the replay needs the replicas' admin API
        env[ADMIN_TOKEN_ENV] = secrets.token_urlsafe(16)
    fleet = replica_fleet(args, plan, env)
    roles = {f"{p.name}-{i}": p.role for p in plan.pools for i in range(p.replicas)}

    stop_on_signals()  # Ctrl-C and SIGTERM stop the fleet (SIGINT set even where it was inherited ignored)
    try:
        fleet.start(FLEET_START_TIMEOUT_S)
        gone = [m.name for m in fleet.exited()]
        if gone:  # answered /health, then exited: another process answered on its port
            raise SpecError(f"--plan: replica {gone[0]} exited right after start (see its message above)")
        endpoints = fleet_backends(plan, lambda pool, i: replica_url(fleet, f"{pool}-{i}"),
                                   lambda n: kv_events_of(args, n))
        procs = [fleet.member(ep["name"]).proc for ep in endpoints]
        if args.endpoints:
            write_json(args.endpoints, serving(endpoints, procs))
        for m in fleet.members:
            print(f"{m.name:>16}  {roles[m.name]:<8} {replica_url(fleet, m.name)}", flush=True)
        urls = {m.name: replica_url(fleet, m.name) for m in fleet.members}
        _watch(endpoints, fleet, args.endpoints,
               FaultReplay(actions, fleet, urls, env.get(ADMIN_TOKEN_ENV, ""), args.time_scale, "emulate"))
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        fleet.stop()


def run(args: argparse.Namespace) -> int:
    check_listen_address(args.host)  # a bad --host is refused before any replica is built or bound
    if args.plan:
        return run_fleet(args)
    if not (args.model and args.gpu):
        raise SpecError("give --model M --gpu G for one replica, or --plan PLAN.yaml for a fleet")
    if args.faults:
        raise SpecError(f"--faults={args.faults}: a fault file names replicas of a plan (`<pool>-<index>`); give "
                        "--plan PLAN.yaml, or inject faults into this replica through POST /admin/faults")

    from fleetwise.emulator.app import create_app

    cfg = config_from_args(args)
    app = create_app(cfg)  # builds the engine now, so a bad model/gpu/fit fails before binding
    # Everything built so far lives as long as the process: keep it out of the collector's full
    # passes, which would otherwise stall the step loop (vLLM's engine does the same).
    gc.collect()
    gc.freeze()
    if args.server is not None:
        print(f"fleetwise emulate: --server {args.server} is deprecated and ignored (the emulator is served by "
              "uvicorn)", file=sys.stderr, flush=True)
    from fleetwise.live.http import listening_socket, uvicorn_server
    from fleetwise.spec.limits import MAX_BODY_BYTES

    try:
        sock = listening_socket(cfg.host, cfg.port)
    except OSError as err:  # the port is taken, or the address is not ours
        raise SpecError(f"--port={cfg.port}: cannot listen on {cfg.host}:{cfg.port} ({err.strerror or err}); "
                        "pick a free port") from None
    print(f"fleetwise emulate: {cfg.name} on {cfg.tp}x{cfg.gpu} role={cfg.role} time-scale={cfg.time_scale:g} "
          f"at http://{cfg.host}:{sock.getsockname()[1]}", flush=True)  # the system's pick under --port 0
    uvicorn_server(app.state.front, cfg.http, MAX_BODY_BYTES, args.log_level).run(sockets=[sock])
    return 0
