"""`fleetwise up PLAN`: the local rehearsal of a fleet in one command, no container runtime needed.

    fleetwise up PLAN [--port 8000] [--time-scale X] [--faults F.yaml] [--duration S]

Starts the fleet document's replicas as emulated engines (`fleetwise emulate`, one process each,
ports after the gateway's), then the gateway in front of them with the fleet's routing and
failure domains, wired to every replica (requests, and the KV events each replica publishes over
ZeroMQ as vLLM does, on the ports after the replicas'); prints the OpenAI base URL and the dashboard URL.
`--faults` replays the fault file `fleetwise simulate --faults` reads against the live fleet
(`cli.fault_replay`: a crash kills the replica's process and restarts it after `restart_after_s`,
a slowdown slows it, a hang stalls it, a failing replica or a full decode pool refuses new
requests, dropped streams are cut; a kind a live fleet cannot model is refused by name).
Ctrl-C (or SIGTERM, or the end of `--duration`) stops everything.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fleetwise.cli.common import SEED_MAX, check_listen_address, float_flag, input_file, int_flag
from fleetwise.spec.limits import MAX_DURATION_S, MAX_TCP_PORT


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "up", help="rehearse a plan locally: its fleet as emulated replicas behind the gateway",
        description="Start the fleet document's replicas as emulated engines and the gateway in front of them "
                    "(routing and failure domains from the document), print the OpenAI URL and the dashboard "
                    "URL, optionally replay a simulator fault file; Ctrl-C stops everything. See docs/deploy.md.")
    p.add_argument("plan", metavar="PLAN", type=input_file("plan file"),
                   help="fleet document (`fleetwise plan --json/--fleet-out`) or plan file")
    p.add_argument("--host", default="127.0.0.1", help="address the gateway and replicas bind")
    p.add_argument("--port", type=int_flag(1, MAX_TCP_PORT - 1024), default=8000,
                   help="gateway port; the replicas take the ports after it, in plan order")
    p.add_argument("--time-scale", type=float_flag(positive=True), default=1.0, metavar="X",
                   help="modelled seconds per wall second of the emulated replicas (and of the fault times)")
    p.add_argument("--faults", metavar="F.yaml", type=input_file("fault file"),
                   help="fault file (the simulator's vocabulary) replayed live, times in modelled seconds")
    p.add_argument("--duration", type=float_flag(positive=True, maximum=MAX_DURATION_S), default=None,
                   metavar="S", help="stop by itself after S wall seconds (default: run until Ctrl-C)")
    p.add_argument("--seed", type=int_flag(0, SEED_MAX), default=0, help="seed of the replicas' output lengths")
    p.set_defaults(func=run)


def _replica_args(args: argparse.Namespace, replicas: int) -> argparse.Namespace:
    """`fleetwise emulate --plan` arguments for the replicas: HTTP ports after the gateway's, then
    their KV-event ports (vLLM's ZeroMQ publisher, two per replica)."""
    from fleetwise.cli.main import build_parser

    return build_parser().parse_args(["emulate", "--plan", args.plan, "--host", args.host,
                                      "--port", str(args.port + 1), "--time-scale", repr(args.time_scale),
                                      "--seed", str(args.seed), "--kv-events-port", str(args.port + 1 + replicas)])


def _gateway_member(args: argparse.Namespace, plan: Any, urls: dict[str, str], env: dict[str, str],
                    workdir: Path, replica_args: argparse.Namespace) -> Any:
    from fleetwise.cli.emulate_cmd import kv_events_of
    from fleetwise.cli.local_fleet import Member
    from fleetwise.deploy.base import yaml_text
    from fleetwise.deploy.compose import emulated_gateway_extra
    from fleetwise.deploy.vllm import gateway_document

    doc = gateway_document(plan, lambda pool, i: urls[f"{pool}-{i}"],
                           {**emulated_gateway_extra(plan), "host": args.host, "port": args.port})
    for n, backend in enumerate(doc["backends"]):  # plan order, as the replicas' KV-event ports
        backend["kv_events"] = kv_events_of(replica_args, n)
    path = workdir / "gateway.yaml"
    path.write_text(yaml_text(doc), encoding="utf-8")
    argv = [sys.executable, "-m", "fleetwise.cli.main", "gateway", "--config", str(path)]
    return Member("gateway", argv, f"http://{args.host}:{args.port}/readiness", env)


def run(args: argparse.Namespace) -> int:
    from fleetwise.cli.emulate_cmd import replica_fleet, replica_url
    from fleetwise.cli.fault_replay import FaultReplay, live_fault_actions
    from fleetwise.cli.local_fleet import stop_on_signals
    from fleetwise.emulator.config import ADMIN_TOKEN_ENV as EMULATOR_TOKEN_ENV
    from fleetwise.gateway.config import GatewayConfig
    from fleetwise.spec.plan import PlanSpec

    check_listen_address(args.host)
    plan = PlanSpec.load(args.plan)
    actions = live_fault_actions(args.faults, plan) if args.faults else []
    token = secrets.token_urlsafe(16)
    env = {**os.environ, EMULATOR_TOKEN_ENV: token, GatewayConfig().admin_token_env: token}
    replica_args = _replica_args(args, sum(p.replicas for p in plan.pools))
    fleet = replica_fleet(replica_args, plan, env)
    urls = {m.name: replica_url(fleet, m.name) for m in fleet.members}
    workdir = Path(tempfile.mkdtemp(prefix="fleetwise-up-"))

    stop_on_signals()  # Ctrl-C and SIGTERM stop the fleet (SIGINT set even where it was inherited ignored)
    try:
        fleet.members.append(_gateway_member(args, plan, urls, env, workdir, replica_args))
        fleet.start()  # all at once: the gateway's readiness waits for its backends
        base = f"http://{args.host}:{args.port}"
        print(f"fleetwise up: {plan.name}: {len(urls)} emulated replica(s) at time scale {args.time_scale:g} "
              f"behind the gateway ({plan.routing if isinstance(plan.routing, str) else plan.routing.policy})\n"
              f"  OpenAI API:  {base}/v1   (model {plan.pools[0].model})\n"
              f"  dashboard:   {base}/dashboard?token={token}\n"
              f"  metrics:     {base}/metrics\n"
              f"Ctrl-C stops everything.", flush=True)
        return _supervise(fleet, FaultReplay(actions, fleet, urls, token, args.time_scale, "up"), args)
    except KeyboardInterrupt:
        return 0
    finally:
        fleet.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _supervise(fleet: Any, replay: Any, args: argparse.Namespace) -> int:
    from fleetwise.cli.fault_replay import SUPERVISE_POLL_S

    """Replay the fault actions on time, report exits, restart on a crash's schedule; 1 when the
    gateway itself stops, 0 at the end of `--duration`."""
    t0 = time.monotonic()
    reported: set[str] = set()
    while args.duration is None or time.monotonic() - t0 < args.duration:
        reported.difference_update(replay.tick())
        for m in fleet.exited():
            if m.name == "gateway":
                print(f"fleetwise up: the gateway exited with status {m.proc.returncode}", file=sys.stderr)
                return 1
            if m.name not in reported:
                reported.add(m.name)
                print(f"fleetwise up: replica {m.name} exited with status {m.proc.returncode}", file=sys.stderr,
                      flush=True)
        time.sleep(SUPERVISE_POLL_S)
    return 0
