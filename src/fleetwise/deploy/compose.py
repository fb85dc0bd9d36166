"""Target `compose`: the fleet as emulated replicas (`fleetwise emulate`) behind the gateway, for Docker Compose.

A rehearsal on a laptop: the same pools, replica names, engine settings, routing and failure
domains as the real fleet, with each replica the engine model on a wall clock behind vLLM's HTTP
API (no GPU), so a team can try routing, faults and metering before renting the fleet.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fleetwise.deploy.base import ENGINE_PORT, GATEWAY_PORT, DeployOptions, replica_names, target, yaml_text
from fleetwise.deploy.emulated import emulate_args, kv_events_args
from fleetwise.deploy.vllm import gateway_document
from fleetwise.emulator.config import ADMIN_TOKEN_ENV as EMULATOR_ADMIN_TOKEN_ENV
from fleetwise.gateway.config import FLEETWISE_TOKENIZER, GatewayConfig
from fleetwise.spec.output import strict_json_dumps
from fleetwise.spec.plan import PlanSpec

ADMIN_TOKEN_ENV = GatewayConfig().admin_token_env
"""The gateway's admin-token variable (`GatewayConfig.admin_token_env`'s default)."""

KV_EVENTS_PORT = 5557
"""Port each emulated replica publishes its KV events on (vLLM's `KVEventsConfig.endpoint`
default, `tcp://*:5557`); its replay socket listens on the next port."""

PROFILE_MOUNT = "/etc/fleetwise/profile.json"
"""Where a fleet's perf profile is mounted in the emulated replicas' containers."""


def emulated_gateway_extra(plan: PlanSpec) -> dict[str, Any]:
    """Gateway settings for an emulated fleet: the emulator's tokenizer, so prompt block hashes
    are computed as the replicas compute them, at their KV block size."""
    return {"tokenizer": FLEETWISE_TOKENIZER, "limits": {"hash_block_tokens": plan.pools[0].engine.block_size}}


@target("compose")
def render_compose(plan: PlanSpec, opts: DeployOptions) -> dict[str, str]:
    """`compose.yaml` (one service per replica plus the gateway) and the gateway's config, which
    follows each replica's KV events."""
    services: dict[str, Any] = {}
    names = [name for pool in plan.pools for name in replica_names(pool)]
    mounts = {"volumes": [f"{Path(plan.perf_profile).resolve()}:{PROFILE_MOUNT}:ro"]} if plan.perf_profile else {}
    for pool in plan.pools:
        for name in replica_names(pool):
            cmd = ["fleetwise", "emulate", *emulate_args(plan, pool, "0.0.0.0", ENGINE_PORT),
                   *kv_events_args(_kv_events(name), bind_host="*")]
            if plan.perf_profile:
                cmd += ["--profile", PROFILE_MOUNT]
            services[name] = {"image": opts.fleetwise_image, "command": cmd, **mounts,
                              "environment": {EMULATOR_ADMIN_TOKEN_ENV: f"${{{EMULATOR_ADMIN_TOKEN_ENV}:-}}"},
                              "healthcheck": {"test": ["CMD", "python", "-c", "import urllib.request; urllib.request."
                                                       f"urlopen('http://127.0.0.1:{ENGINE_PORT}/health')"],
                                              "interval": "5s", "retries": 12}}
    doc = gateway_document(plan, lambda pool, i: f"http://{pool}-{i}:{ENGINE_PORT}", emulated_gateway_extra(plan),
                           kv_events_of=lambda n: _kv_events(names[n]))
    services["gateway"] = {"image": opts.fleetwise_image,
                           "command": ["fleetwise", "gateway", "--config", "/etc/fleetwise/gateway.yaml"],
                           "ports": [f"{GATEWAY_PORT}:{GATEWAY_PORT}"],
                           "environment": {ADMIN_TOKEN_ENV: f"${{{ADMIN_TOKEN_ENV}:-}}"},
                           "volumes": ["./gateway.yaml:/etc/fleetwise/gateway.yaml:ro"],
                           "depends_on": {name: {"condition": "service_healthy"} for name in names}}
    compose = {"name": re.sub(r"[^a-z0-9_-]+", "-", f"fleetwise-{plan.name}".lower()), "services": services}
    return {"compose.yaml": yaml_text(compose),
            "gateway.yaml": yaml_text(doc),
            "fleet.json": strict_json_dumps(plan.document(), indent=2) + "\n"}


def _kv_events(name: str) -> dict[str, Any]:
    """The gateway's `kv_events` entry of replica service `name`: the prefix index follows what
    each replica's KV cache holds, over ZeroMQ as with vLLM."""
    return {"transport": "zmq", "endpoint": f"tcp://{name}:{KV_EVENTS_PORT}",
            "replay_endpoint": f"tcp://{name}:{KV_EVENTS_PORT + 1}", "topic": ""}
