"""Target `vllm`: the `vllm serve` command line of every pool and the gateway config that fronts them.

Every flag emitted is checked against the recorded argument list of the pinned vLLM release
(`vllm_serve_args.json`; where it comes from: `VLLM_ARGS.md`), so a flag vLLM renamed fails here
and in CI, not in a team's deployment. Each replica is its own server (data parallelism is the
gateway's: no `--data-parallel-size`); prefill and decode pools get vLLM's NIXL connector with
the producer and consumer roles (`--kv-transfer-config`).
"""

from __future__ import annotations

import json
import math
import shlex
from functools import cache
from pathlib import Path
from typing import Any

from fleetwise.deploy.base import (
    ENGINE_PORT,
    GATEWAY_PORT,
    DeployOptions,
    replica_names,
    target,
    weights_of,
    yaml_text,
)
from fleetwise.errors import SpecError
from fleetwise.gateway.config import fleet_backends, fleet_settings
from fleetwise.spec.catalog import resolve_gpu
from fleetwise.spec.output import strict_json_dumps
from fleetwise.spec.plan import PlanSpec, PoolSpec

RECORDED_ARGS = Path(__file__).with_name("vllm_serve_args.json")
"""The pinned vLLM release's `vllm serve` arguments (see VLLM_ARGS.md beside it)."""
NIXL_CONNECTOR = "NixlConnector"
"""vLLM's NIXL KV connector name (vllm/distributed/kv_transfer/kv_connector/factory.py)."""
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
"""`kv_role` of each P/D half (`KVRole` in vllm/config/kv_transfer.py)."""
NIXL_SIDE_CHANNEL_PORT = 5600
"""Port of NIXL's handshake side channel (`VLLM_NIXL_SIDE_CHANNEL_PORT`, vllm/envs.py default 5600)."""
NIXL_ABORT_TIMEOUT_ENV = "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"
"""Whole seconds a NIXL producer keeps a finished prefill's KV blocks unread before freeing them
(vllm/envs.py, default 480): the engine side of fleetwise's KV lease."""
WEIGHT_QUANTIZATION = {"fp8": "fp8"}
"""`--quantization` for a weight dtype vLLM quantizes on load; bf16 needs none, and int4 is
read from a pre-quantized (AWQ/GPTQ) checkpoint, whose config names the method."""
KV_CACHE_DTYPE = {"bf16": "auto", "fp8": "fp8"}
"""`--kv-cache-dtype` of each KV dtype (`auto`: the model's dtype)."""


@cache
def recorded_flags() -> frozenset[str]:
    """Every option string the recorded `vllm serve` parser accepts (`--no-X` for boolean X)."""
    doc = json.loads(RECORDED_ARGS.read_text(encoding="utf-8"))
    booleans = doc["boolean_flags"]
    return frozenset([*doc["value_flags"], *booleans, *(f"--no-{f[2:]}" for f in booleans), *doc["switch_flags"],
                      *doc["short_aliases"]])


@cache
def recorded_kv_transfer() -> dict[str, Any]:
    """The recorded `KVTransferConfig` fields and roles."""
    return dict(json.loads(RECORDED_ARGS.read_text(encoding="utf-8"))["kv_transfer_config"])


def unknown_flags(argv: list[str]) -> list[str]:
    """Option strings of `argv` the recorded vLLM parser does not know (empty: all known)."""
    known = recorded_flags()
    return [a.split("=", 1)[0] for a in argv if a.startswith("-") and a.split("=", 1)[0] not in known]


def kv_transfer_config(role: str) -> dict[str, str]:
    """The `--kv-transfer-config` of a prefill or decode replica (NIXL, its role)."""
    return {"kv_connector": NIXL_CONNECTOR, "kv_role": KV_ROLE[role]}


def serve_argv(pool: PoolSpec, opts: DeployOptions, port: int = ENGINE_PORT) -> list[str]:
    """`vllm serve MODEL --flag value ...` for one replica of `pool` (flags checked against the record)."""
    par, k = pool.parallelism, pool.engine
    argv = ["vllm", "serve", weights_of(pool, opts), "--served-model-name", pool.model,
            "--host", "0.0.0.0", "--port", str(port),
            "--tensor-parallel-size", str(par.tp), "--pipeline-parallel-size", str(par.pp),
            "--max-num-seqs", str(k.max_num_seqs), "--max-num-batched-tokens", str(k.max_num_batched_tokens),
            "--block-size", str(k.block_size), "--gpu-memory-utilization", repr(pool.gpu_memory_utilization),
            "--kv-cache-dtype", KV_CACHE_DTYPE[pool.kv_dtype],
            "--enable-chunked-prefill" if k.enable_chunked_prefill else "--no-enable-chunked-prefill",
            "--enable-prefix-caching" if k.enable_prefix_caching else "--no-enable-prefix-caching"]
    if k.max_model_len is not None:
        argv += ["--max-model-len", str(k.max_model_len)]
    if pool.weight_dtype in WEIGHT_QUANTIZATION:
        argv += ["--quantization", WEIGHT_QUANTIZATION[pool.weight_dtype]]
    if par.ep > 1:
        runs = sorted({1, par.tp, par.tp * par.pp})
        if par.ep not in runs:
            raise SpecError(f"pool {pool.name}: parallelism.ep={par.ep} is not an expert-parallel degree vLLM runs with "
                            f"tp={par.tp}, pp={par.pp}: --enable-expert-parallel spreads each layer's experts over the "
                            f"{par.tp} TP ranks of its stage; use ep={', '.join(map(str, runs[:-1]))} or {runs[-1]}")
        argv.append("--enable-expert-parallel")
    if resolve_gpu(pool.accelerator).gpus_per_node < par.gpus:
        argv += ["--distributed-executor-backend", "ray"]  # a replica over several nodes
    if pool.role != "mixed":
        argv += ["--kv-transfer-config", strict_json_dumps(kv_transfer_config(pool.role), indent=None, separators=(",", ":"))]
    bad = unknown_flags(argv[3:])
    if bad:
        raise SpecError(f"pool {pool.name}: vllm serve flag(s) {', '.join(bad)} are not in the recorded vLLM "
                        f"arguments ({RECORDED_ARGS.name}); update the record or the flag")
    return argv


def engine_env(pool: PoolSpec, kv_lease_s: float) -> dict[str, str]:
    """Environment a pool's `vllm serve` needs beyond its flags: for P/D, NIXL's side channel and,
    on prefill replicas, the KV lease (`failure_domains.kv_lease_s`, seconds) as the time the
    producer keeps a finished prefill's KV for a decode that never reads it."""
    if pool.role == "mixed":
        return {}
    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(NIXL_SIDE_CHANNEL_PORT)}
    if pool.role == "prefill":
        env[NIXL_ABORT_TIMEOUT_ENV] = str(max(1, math.ceil(kv_lease_s)))
    return env


def gateway_document(plan: PlanSpec, url_of: Any, extra: dict[str, Any] | None = None,
                     kv_events_of: Any = None) -> dict[str, Any]:
    """The `fleetwise gateway --config` document fronting the fleet's replicas at `url_of(pool, i)`
    (`kv_events_of(n)`: the n-th replica's KV-event feed, or None)."""
    return {"host": "0.0.0.0", "port": GATEWAY_PORT, "models": sorted({p.model for p in plan.pools}),
            **fleet_settings(plan), "backends": fleet_backends(plan, url_of, kv_events_of), **(extra or {})}


def _script(plan: PlanSpec, pool: PoolSpec, opts: DeployOptions) -> str:
    lines = ["#!/bin/sh", f"# fleet {plan.name}: pool {pool.name} ({pool.role}), {pool.replicas} replica(s) of "
             f"{pool.parallelism.gpus} x {pool.accelerator}: run this on each replica's host",
             f"# ({', '.join(replica_names(pool))}); the gateway config names them by these host names.",
             *(f"export {k}={shlex.quote(v)}" for k, v in engine_env(pool, plan.failure_domains.kv_lease_s).items())]
    nodes = -(-pool.parallelism.gpus // resolve_gpu(pool.accelerator).gpus_per_node)
    if nodes > 1:
        lines.insert(3, f"# One replica spans {nodes} nodes: start a Ray cluster over them first (`ray start --head` "
                        "here, `ray start --address=HEAD:6379` on the others), then run this on the head.")
    if pool.role != "mixed":  # the address the other side's NIXL agent reaches this one at
        lines.append('export VLLM_NIXL_SIDE_CHANNEL_HOST="${VLLM_NIXL_SIDE_CHANNEL_HOST:-$(hostname -i | cut -d" " -f1)}"')
    lines += [f"exec {shlex.join(serve_argv(pool, opts))}", ""]
    return "\n".join(lines)


@target("vllm")
def render_vllm(plan: PlanSpec, opts: DeployOptions) -> dict[str, str]:
    """One `vllm serve` script per pool and `gateway.yaml` naming every replica by host name."""
    files = {f"vllm/{pool.name}.sh": _script(plan, pool, opts) for pool in plan.pools}
    doc = gateway_document(plan, lambda pool, i: f"http://{pool}-{i}:{ENGINE_PORT}")
    files["gateway.yaml"] = yaml_text(doc)
    files["fleet.json"] = strict_json_dumps(plan.document(), indent=2) + "\n"
    return files
