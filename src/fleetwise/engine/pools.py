"""From a plan's `PoolSpec` to engines: the engine config, the memory fit and the bound perf model.

One place for what every driver (simulator, emulator) does before it can run a replica of a pool:
resolve model and accelerator, check the parallelism, size the KV cache from the memory fit
(`fleetwise.perf.memory`), bind the perf model to the deployment.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetwise.engine.driver import step_time_fns
from fleetwise.engine.records import EngineConfig
from fleetwise.engine.scheduler import Engine
from fleetwise.engine.window import KvWindow
from fleetwise.errors import SpecError
from fleetwise.perf.memory import FitOptions, kv_capacity_tokens
from fleetwise.perf.roofline import BoundPerf, PerfModel
from fleetwise.perf.types import Deployment, pool_deployment
from fleetwise.spec import engine_defaults as ed
from fleetwise.spec.model import ModelSpec
from fleetwise.spec.plan import PoolSpec, resolve_pool

__all__ = ["PoolBuild", "build_pool", "effective_max_model_len", "engine_config", "kv_window"]


def engine_config(pool: PoolSpec) -> EngineConfig:
    """The engine knobs of `pool` as an `EngineConfig`."""
    k = pool.engine
    return EngineConfig(
        max_num_batched_tokens=k.max_num_batched_tokens, max_num_seqs=k.max_num_seqs, block_size=k.block_size,
        enable_prefix_caching=k.enable_prefix_caching, enable_chunked_prefill=k.enable_chunked_prefill,
        max_bundle_steps=k.max_bundle_steps,
    )


@dataclass(frozen=True, slots=True)
class PoolBuild:
    """What every replica of one pool shares: deployment, KV capacity, bound perf model, config."""

    pool: PoolSpec
    deployment: Deployment
    kv_capacity_tokens: int
    """KV cache capacity of one replica in tokens (memory fit)."""
    perf: BoundPerf
    config: EngineConfig
    max_model_len: int
    """Longest request (prompt + output tokens) a replica serves (`effective_max_model_len`)."""
    window: KvWindow | None = None
    """The model's sliding-window layers in the engine's block accounting (None: no window)."""

    def engine(self, name: str) -> Engine:
        """A fresh engine of this pool named `name`, priced by the bound perf model."""
        step_time, decode_time, batch_time = step_time_fns(self.perf, 1.0)
        return Engine(name, self.pool.role, self.config, self.kv_capacity_tokens // self.config.block_size,
                      step_time, decode_time, batch_time, self.window)


def kv_window(model: ModelSpec, block_size: int) -> KvWindow | None:
    """`model`'s sliding-window layers as the engine counts blocks (None without a window)."""
    w = model.num_window_layers
    if not w or model.sliding_window is None:
        return None
    return KvWindow(model.num_layers - w, w, model.sliding_window, block_size)


def build_pool(pool: PoolSpec, perf: PerfModel, where: str) -> PoolBuild:
    """Resolve, check and fit `pool` (errors name `where`, e.g. `plan: pools.0`)."""
    model, gpu = resolve_pool(pool, where)
    try:
        pool.parallelism.check(model, gpu)
    except SpecError as err:
        raise SpecError(f"{where} ({pool.name}): {err}") from None
    dep = pool_deployment(model, gpu, pool)
    k = pool.engine
    opts = FitOptions(max_num_batched_tokens=k.max_num_batched_tokens, max_num_seqs=k.max_num_seqs,
                      gpu_memory_utilization=pool.gpu_memory_utilization)
    cap = kv_capacity_tokens(dep, opts)
    if cap < k.block_size:
        par, share = pool.parallelism, pool.gpu_memory_utilization
        flags = f" --weight-dtype {pool.weight_dtype}" if pool.weight_dtype != "bf16" else ""
        flags += f" --gpu-memory-utilization {share:g}" if share != ed.GPU_MEMORY_UTILIZATION else ""
        raise SpecError(
            f"{where} ({pool.name}): fit failed: no room for KV cache (tp={par.tp}, pp={par.pp}, {pool.weight_dtype}, "
            f"gpu_memory_utilization {share:g}); raise tp/pp or the share, or use smaller dtypes; see "
            f"`fleetwise fit --model {pool.model} --gpu {pool.accelerator}{flags}`"
        )
    window = kv_window(dep.model, k.block_size)
    return PoolBuild(pool, dep, cap, perf.bind(dep), engine_config(pool),
                     effective_max_model_len(pool, dep, cap, where, window), window)


def effective_max_model_len(pool: PoolSpec, dep: Deployment, kv_capacity_tokens: int, where: str,
                            window: KvWindow | None = None) -> int:
    """Tokens (prompt + output) one request may hold on `pool`: `engine.max_model_len`, checked
    against the model's context and the KV cache as vLLM checks it at start-up (its `--max-model-len`
    must fit both); unset, the context lowered to the KV cache, whole blocks (what vLLM's start-up
    error names as the estimated maximum model length); with a sliding `window`, the longest
    sequence whose windowed blocks fit."""
    k = pool.engine
    context = dep.model.max_context_tokens
    blocks = kv_capacity_tokens // k.block_size
    kv_tokens = blocks * k.block_size if window is None else window.max_tokens(blocks, max(context, k.max_model_len or 0))
    if k.max_model_len is None:
        return min(context, kv_tokens)
    if k.max_model_len > context:
        raise SpecError(f"{where} ({pool.name}): engine.max_model_len={k.max_model_len} exceeds the context of "
                        f"{dep.model.name} ({context:,} tokens); lower it to at most {context:,}")
    if k.max_model_len > kv_tokens:
        raise SpecError(f"{where} ({pool.name}): engine.max_model_len={k.max_model_len} does not fit one replica's KV "
                        f"cache ({kv_tokens:,} tokens); lower it to at most {kv_tokens:,} or give the pool more KV room "
                        "(tp, pp, fp8 KV, gpu_memory_utilization)")
    return k.max_model_len
