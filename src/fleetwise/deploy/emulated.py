"""The `fleetwise emulate` arguments of one emulated replica of a fleet document.

One builder for the three places that start emulated replicas: `emulate --plan` and `up` (local
processes) and the compose target (containers).
"""

from __future__ import annotations

from fleetwise.spec.plan import PlanSpec, PoolSpec


def emulate_args(plan: PlanSpec, pool: PoolSpec, host: str, port: int) -> list[str]:
    """Arguments after `fleetwise emulate` for one replica of `pool` listening on host:port."""
    k = pool.engine
    out = ["--model", pool.model, "--gpu", pool.accelerator, "--tp", str(pool.parallelism.tp),
           "--pp", str(pool.parallelism.pp), "--role", pool.role, "--model-version", pool.model_version,
           "--host", host, "--port", str(port), "--weight-dtype", pool.weight_dtype, "--kv-dtype", pool.kv_dtype,
           "--gpu-memory-utilization", repr(pool.gpu_memory_utilization),
           "--max-num-seqs", str(k.max_num_seqs), "--max-num-batched-tokens", str(k.max_num_batched_tokens),
           "--block-size", str(k.block_size),
           "--kv-link-gbps", repr(plan.kv_link.bytes_per_s * 8 / 1e9), "--kv-link-latency", repr(plan.kv_link.latency_s)]
    if not k.enable_prefix_caching:
        out.append("--no-prefix-caching")
    if pool.step_time_factor != 1.0:
        out += ["--step-time-factor", repr(pool.step_time_factor)]
    return out
