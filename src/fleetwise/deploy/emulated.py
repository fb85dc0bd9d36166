"""The `fleetwise emulate` arguments of one emulated replica of a fleet document.

One builder for the three places that start emulated replicas: `emulate --plan` and `up` (local
processes) and the compose target (containers).
"""

from __future__ import annotations

from typing import Any

from fleetwise.spec.output import strict_json_dumps
from fleetwise.spec.plan import PlanSpec, PoolSpec


def emulate_args(plan: PlanSpec, pool: PoolSpec, host: str, port: int) -> list[str]:
    """Arguments after `fleetwise emulate` for one replica of `pool` listening on host:port."""
    k = pool.engine
    out = ["--model", pool.model, "--gpu", pool.accelerator, "--tp", str(pool.parallelism.tp),
           "--pp", str(pool.parallelism.pp), "--ep", str(pool.parallelism.ep),
           "--expert-imbalance", repr(pool.expert_imbalance), "--role", pool.role, "--model-version", pool.model_version,
           "--host", host, "--port", str(port), "--weight-dtype", pool.weight_dtype, "--kv-dtype", pool.kv_dtype,
           "--gpu-memory-utilization", repr(pool.gpu_memory_utilization),
           "--max-num-seqs", str(k.max_num_seqs), "--max-num-batched-tokens", str(k.max_num_batched_tokens),
           "--block-size", str(k.block_size),
           "--kv-link-gbps", repr(plan.kv_link.bytes_per_s * 8 / 1e9), "--kv-link-latency", repr(plan.kv_link.latency_s)]
    if not k.enable_prefix_caching:
        out.append("--no-prefix-caching")
    if not k.enable_chunked_prefill:
        out.append("--no-chunked-prefill")
    if k.max_model_len is not None:
        out += ["--max-model-len", str(k.max_model_len)]
    if pool.step_time_factor != 1.0:
        out += ["--step-time-factor", repr(pool.step_time_factor)]
    if pool.role == "prefill":  # the fleet's KV lease (a vLLM producer's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)
        out += ["--kv-lease", repr(plan.failure_domains.kv_lease_s)]
    return out


def kv_events_args(kv: dict[str, Any], bind_host: str | None = None) -> list[str]:
    """`--kv-events-config` making a replica publish where the gateway's `kv_events` entry `kv`
    subscribes (PUB and replay sockets; bound on `bind_host`'s interfaces, `*` for all, or on the
    entry's own host when None)."""

    def bound(url: str) -> str:
        return url if bind_host is None else f"tcp://{bind_host}:{url.rsplit(':', 1)[1]}"

    return ["--kv-events-config", strict_json_dumps(indent=None, obj={
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": bound(kv["endpoint"]),
        "replay_endpoint": bound(kv["replay_endpoint"]), "topic": kv["topic"]})]
