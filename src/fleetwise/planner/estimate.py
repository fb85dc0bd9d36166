"""Step 2 of planning: analytical latency floors and per-replica capacities from the perf model.

Owns the closed-form questions asked before any simulation:
- TTFT floor: the p50 and SLO-percentile prompt prefilled alone (chunked at the token budget).
- TPOT floor: one decode step at batch 1; the largest decode batch whose step stays under the
  TPOT target (and whose KV fits).
- Capacities (requests/s per replica), used to bracket the simulator's goodput search and to
  size P:D:
  decode   mu_d = B* / (out_mean * t_dec(B*)),  B* = largest batch with t_dec(B) <= 0.9 * TPOT;
  prefill  mu_p = rho* / S_p, S_p = prefill seconds of a mean prompt at full token budget and
           rho* the largest load with  t_alone(p) + Wq_p(rho) + t_kv(p) <= TTFT, where M/D/1
           waiting has mean Wq = rho*S/(2(1-rho)) and tail quantile Wq_p ~ (Wq/rho)*ln(rho/(1-p));
  mixed    the largest rate whose decode steps, stretched by prefill work sharing the GPU
           (t_dec(B)/(1 - lambda*S_p), B = lambda*out_mean*TPOT by Little's law), meet TPOT and
           whose prefill queue meets TTFT as above.
Does not decide replica counts (sizing) or simulate (measure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetwise.perf.roofline import BoundPerf
from fleetwise.perf.types import BatchShape, Deployment, SeqWork
from fleetwise.planner.candidates import Layout
from fleetwise.planner.workload import LengthStats
from fleetwise.spec.planning import PlanSLOSpec

TOKEN_BUDGET = 8192  # engine max_num_batched_tokens (PoolSpec default)
MAX_SEQS = 256  # engine max_num_seqs (PoolSpec default)
TPOT_MARGIN = 0.9  # plan decode batches to 90% of the TPOT target


@dataclass(frozen=True)
class LayoutEstimate:
    """Analytical figures of one replica layout under one length mix and SLO."""

    layout: Layout
    kv_capacity_tokens: int
    ttft_alone_p50_s: float
    ttft_alone_slo_s: float
    """Prefill of the SLO-percentile prompt alone (the TTFT floor)."""
    prefill_bound: str
    tpot_floor_s: float
    """Decode step at batch 1."""
    decode_bound: str
    decode_batch: int
    """B*: largest decode batch meeting the TPOT target with margin (0 when none does)."""
    tpot_at_batch_s: float
    prefill_s_per_request: float
    """S_p: GPU seconds of a mean prompt when prefills are batched at the token budget."""
    kv_transfer_p99_s: float
    mu_prefill_rps: float
    mu_decode_rps: float
    mu_mixed_rps: float
    ttft_ok: bool
    tpot_ok: bool

    @property
    def latency_ok(self) -> bool:
        return self.ttft_ok and self.tpot_ok


def prefill_alone_s(perf: BoundPerf, prompt_tokens: int, budget: int = TOKEN_BUDGET) -> tuple[float, str]:
    """Seconds to prefill one prompt alone, chunk by chunk, and what bounds its largest chunk."""
    done, total, bound = 0, 0.0, ""
    while done < prompt_tokens:
        chunk = min(budget, prompt_tokens - done)
        cost = perf.step_cost(BatchShape.of([SeqWork(chunk, done)]))
        total += cost.total_s
        bound = bound or cost.bound
        done += chunk
    return total, bound


def decode_step_s(perf: BoundPerf, batch: int, ctx: int) -> float:
    """Seconds of one decode step of `batch` sequences at `ctx` tokens of context each."""
    return perf.step_time_s(BatchShape.decode(batch, max(1, ctx)))


def _max_decode_batch(dep: BoundPerf, ctx: int, target_s: float, kv_cap: int, seq_tokens: float) -> int:
    limit = max(0, min(MAX_SEQS, int(kv_cap // max(1.0, seq_tokens))))
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if decode_step_s(dep, mid, ctx) <= target_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _wait_quantile(rho: float, service_s: float, pct: float) -> float:
    """M/D/1 waiting-time quantile, exponential-tail approximation (0 when rho <= 1-p)."""
    if rho <= 0:
        return 0.0
    mean = rho * service_s / (2 * (1 - rho))
    tail = 1 - pct / 100
    return 0.0 if rho <= tail else (mean / rho) * math.log(rho / tail)


def _max_load(ok: object, hi: float = 0.98) -> float:
    """Largest value in (0, hi] with ok(value) true, by bisection (0 when even a tiny one fails)."""
    check = ok  # callable[[float], bool]
    lo_v, hi_v = 0.0, hi
    if not check(1e-6):  # type: ignore[operator]
        return 0.0
    for _ in range(30):
        mid = (lo_v + hi_v) / 2
        if check(mid):  # type: ignore[operator]
            lo_v = mid
        else:
            hi_v = mid
    return lo_v


def _per_request_prefill_s(perf: BoundPerf, prompt_mean: float) -> float:
    """GPU seconds of a mean prompt when prompts are packed into full token-budget steps."""
    chunk = TOKEN_BUDGET
    n = max(1, round(chunk / max(1.0, prompt_mean)))
    seq = max(1, int(prompt_mean))
    step = perf.step_time_s(BatchShape.prefill(n, seq))
    return step / n


def estimate(dep: BoundPerf, layout: Layout, kv_cap: int, stats: LengthStats, slo: PlanSLOSpec,
             kv_p99_s: float) -> LayoutEstimate:
    """All analytical figures of one layout, priced by `dep` (the perf model bound to its deployment)."""
    p50, _ = prefill_alone_s(dep, max(1, int(stats.prompt_p50)))
    slo_prompt = max(1, int(stats.percentile_prompt(slo.percentile)))
    t_alone, pbound = prefill_alone_s(dep, slo_prompt)
    ctx = int(stats.prompt_mean + stats.output_mean / 2)
    seq_tokens = stats.prompt_mean + stats.output_mean
    t1_cost = dep.step_cost(BatchShape.decode(1, ctx))
    bstar = _max_decode_batch(dep, ctx, TPOT_MARGIN * slo.tpot_s, kv_cap, seq_tokens)
    t_b = decode_step_s(dep, bstar, ctx) if bstar else t1_cost.total_s
    s_p = _per_request_prefill_s(dep, stats.prompt_mean)
    mu_d = bstar / (stats.output_mean * t_b) if bstar else 0.0
    budget = slo.ttft_s - t_alone - kv_p99_s

    def prefill_ok(rho: float) -> bool:
        return _wait_quantile(rho, s_p, slo.percentile) <= budget

    mu_p = _max_load(prefill_ok) / s_p if budget > 0 else 0.0
    mu_mix = _mixed_capacity(dep, stats, slo, s_p, t_alone, ctx, kv_cap, seq_tokens)
    return LayoutEstimate(
        layout, kv_cap, p50, t_alone, pbound, t1_cost.total_s, t1_cost.bound, bstar, t_b, s_p, kv_p99_s,
        mu_p, mu_d, mu_mix, ttft_ok=t_alone <= slo.ttft_s, tpot_ok=t1_cost.total_s <= slo.tpot_s)


def _mixed_capacity(dep: BoundPerf, stats: LengthStats, slo: PlanSLOSpec, s_p: float, t_alone: float,
                    ctx: int, kv_cap: int, seq_tokens: float) -> float:
    def ok(lam: float) -> bool:
        rho_p = lam * s_p
        if rho_p >= 0.95:
            return False
        batch = max(1, math.ceil(lam * stats.output_mean * slo.tpot_s))
        if batch > MAX_SEQS or batch * seq_tokens > kv_cap:
            return False
        if decode_step_s(dep, batch, ctx) / (1 - rho_p) > TPOT_MARGIN * slo.tpot_s:
            return False
        return t_alone + _wait_quantile(rho_p, s_p, slo.percentile) <= slo.ttft_s

    hi = 0.95 / s_p
    return _max_load(lambda x: ok(x * hi), hi=1.0) * hi


def kv_bytes(dep: Deployment, prompt_tokens: float) -> float:
    """KV bytes one request hands from prefill to decode: KV bytes per token x prompt tokens."""
    return dep.model.kv_bytes_per_token(dep.kv_dtype) * prompt_tokens

