"""Service rates measured on a running fleet, fitted against the model, and where a plan's numbers come from.

Owns the effective service rates a pool's replica metrics give (`metrics_page` reads them, any
engine's names registered in `fleetwise.spec.engine_metrics`; per finished request: prefill tokens
per second of prefill time, decode tokens per second of decode time), fitting each pool's step-time
factor against the perf model (each pool simulated at the load it was measured under, at its own
factor: the factor at which measured over modelled is 1, so batching follows the slower steps) with
a 95% interval, the `fleetwise-measured/1` document `calibrate --from-metrics` writes and
`plan --measured` reads, and the provenance lines of a ranked plan (which numbers are measured, which
modelled, which routing policy every simulation used).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetwise.errors import SpecError, quote
from fleetwise.planner.metrics_page import Histo, ReplicaMetrics
from fleetwise.planner.simulate import simulated_policy
from fleetwise.spec.inputs import finite
from fleetwise.spec.limits import MAX_FACTOR
from fleetwise.spec.planning import MeasuredService

if TYPE_CHECKING:
    from fleetwise.planner.state import Candidate, Search
    from fleetwise.spec.plan import PlanSpec

MEASURED_SCHEMA = "fleetwise-measured/1"
Z95 = 1.959963984540054
"""Two-sided 95% quantile of the standard normal (scipy.stats.norm.ppf(0.975))."""
MIN_REQUESTS = 20
"""Fewest completed requests of a pool before a factor is fitted from it."""
FIT_REQUESTS = 1500
"""Requests of the simulation that models a measured replica (its noise stays well under 1%)."""
CV_BATCHES = 10
"""Consecutive batches of a simulated pool's requests whose means give its service-time spread."""
FIT_TOLERANCE = 0.005
"""Measured over modelled service within this of 1 ends the fit (half the simulation's noise floor)."""
FIT_STEPS = 6
"""Most simulations per fit (two at least: one at the model's speed, one at the first estimate)."""


@dataclass(frozen=True)
class ServiceRates:
    """One pool's effective service rates: means per finished request, and the load per replica."""

    requests: float
    prompt_tokens: float
    """Mean prompt tokens per request."""
    output_tokens: float
    """Mean generated tokens per request."""
    prefill_s: float
    """Mean prefill time per request (scheduled to first token)."""
    decode_s_per_token: float
    """Mean decode time per generated token after the first."""
    rate_rps: float | None
    """Requests per second per replica over the span (None when the span is unknown): those that
    reached their first token in it where the time-to-first-token histogram says, since a span
    that starts or ends on a change of load sees finishes lag arrivals by a whole request."""

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens per second of prefill time."""
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Generated tokens per second of decode time."""
        return 1.0 / self.decode_s_per_token if self.decode_s_per_token > 0 else 0.0


def service_rates(replicas: Iterable[ReplicaMetrics], role: str = "mixed") -> ServiceRates:
    """The pooled service rates of replicas of one pool of `role`, per finished request; SpecError
    naming the metric when the prompt length, the prefill time (not a decode pool) or the output
    length and decode time (not a prefill pool) the fit reads is missing or zero."""
    reps = list(replicas)
    n = sum(r.counter("requests") for r in reps)
    where = ", ".join(r.source for r in reps)
    if n < MIN_REQUESTS:
        raise SpecError(f"{where}: {n:g} completed request(s); at least {MIN_REQUESTS} "
                        "are needed to fit a service rate (scrape over a longer interval or under load)")
    page = _Pooled(reps, role, where, n)
    prompt = page.length("prompt", "prompt_tokens", "the prompt length")
    output = page.length("output", "generation_tokens", "the output length") if role != "prefill" else 1.0
    prefill = page.time((("prefill",), ("ttft", "queue")), "the prefill time") if role != "decode" else 0.0
    decode = 0.0
    if role != "prefill":
        decode = page.time((("decode",), ("e2e", "ttft")), "the decode time", per_token=output - 1)
    spans = [r.span_s for r in reps]
    ttft = sum((r.histo("ttft") for r in reps), Histo())
    started = ttft.count if ttft.count > 0 else n  # first tokens lag arrivals less than finishes do
    rate = None if any(s is None for s in spans) else started / sum(s for s in spans if s is not None)
    return ServiceRates(n, prompt, output, prefill, decode, rate)


class _Pooled:
    """The pooled fields of one pool's replicas, read the way `service_rates` needs them."""

    def __init__(self, reps: list[ReplicaMetrics], role: str, where: str, requests: float) -> None:
        busy = [r for r in reps if r.counter("requests") > 0]  # an idle replica adds nothing, not a missing metric
        self.names, self.role, self.where, self.n = busy[0].names, role, where, requests
        self.counters = {k: sum(r.counter(k) for r in busy) for k in self.names.counters
                         if all(k in r.counters for r in busy)}
        self.histograms = {k: sum((r.histo(k) for r in busy), Histo()) for k in self.names.histograms
                           if any(k in r.histograms for r in busy)}

    def _fix(self) -> str:
        return f"a {self.role} pool's fit needs it: scrape or save the whole /metrics page of {self.names.hint}"

    def length(self, histogram: str, counter: str, what: str) -> float:
        """Mean tokens per finished request: its per-request histogram where the page has one
        (counters also count the tokens of requests still running), else counter / requests."""
        mean = self.histograms[histogram].mean if histogram in self.histograms else None
        if mean is not None:
            return mean
        if counter in self.counters:
            return self.counters[counter] / self.n
        names = [self.names.histograms[histogram]] if histogram in self.names.histograms else []
        names.append(self.names.counters[counter] + "_total")
        raise SpecError(f"{self.where}: no {' or '.join(names)} ({what}); {self._fix()}")

    def time(self, ways: tuple[tuple[str, ...], ...], what: str, per_token: float | None = None) -> float:
        """Mean seconds per request (per token after the first with `per_token` tokens) of the first
        way of reading it the page has all fields of: one histogram, or the first less the second."""
        ways = tuple(w for w in ways if all(k in self.names.histograms for k in w))
        if not ways:
            raise SpecError(f"{self.where}: {self.names.engine}'s metric names give no {what}; a {self.role} pool "
                            f"cannot be fitted from them")
        way = next((w for w in ways if all(k in self.histograms for k in w)), None)
        if way is None:
            w = ways[0]
            have = [self.names.histograms[k] for k in w if k in self.histograms]
            missing = ", ".join(self.names.histograms[k] for k in w if k not in self.histograms)
            raise SpecError(f"{self.where}: no {missing} ({'with ' + ', '.join(have) + ': ' if have else ''}{what}); "
                            f"{self._fix()}")
        hs = [self.histograms[k] for k in way]
        mean = (hs[0].mean or 0.0) - sum(h.mean or 0.0 for h in hs[1:])
        tokens = 1.0 if per_token is None else per_token
        if mean > 0 and tokens > 0 and all(h.count > 0 for h in hs):
            return mean / tokens
        got = " less ".join(f"{self.names.histograms[k]} {h.total:g} s over {h.count:g}" for k, h in zip(way, hs, strict=True))
        over = f"{hs[0].count:g} requests" if per_token is None else f"{max(tokens, 0) * hs[0].count:,g} decode tokens"
        if len(way) == 1:
            got = f"{self.names.histograms[way[0]]} records {hs[0].total:g} s over {over}"
        raise SpecError(f"{self.where}: {got}; a {self.role} pool's fit needs {what}: check the metrics come from "
                        "this fleet's replicas")


@dataclass(frozen=True)
class Modelled:
    """A pool's modelled service at the measured load: means and per-request coefficients of variation."""

    prefill_s: float
    decode_s_per_token: float
    prefill_cv: float
    decode_cv: float
    requests: int


def _cv(x: Any) -> float:
    """Per-request coefficient of variation of service times in arrival order, carrying the
    correlation a shared load gives neighbours (batch means: the spread of CV_BATCHES consecutive
    batches' means, scaled to one request), at least the plain per-request one."""
    import numpy as np

    if x.size < 2 or x.mean() <= 0:
        return 0.0
    plain = float(x.std(ddof=1) / x.mean())
    if x.size < 4 * CV_BATCHES:
        return plain
    means = np.array([b.mean() for b in np.array_split(x, CV_BATCHES)])
    return max(plain, float(math.sqrt(x.size / CV_BATCHES) * means.std(ddof=1) / x.mean()))


def _lengths(plan: PlanSpec, rates: Mapping[str, ServiceRates]) -> tuple[int, int]:
    """Mean (prompt, output) tokens of the measured requests: prompts as the pools that prefill
    them saw, outputs as the pools that decode them did (all pools where none of that role was measured)."""
    role = {p.name: p.role for p in plan.pools}

    def mean(attr: str, skip: str) -> float:
        rs = [r for n, r in rates.items() if role[n] != skip] or list(rates.values())
        return sum(getattr(r, attr) * r.requests for r in rs) / sum(r.requests for r in rs)

    return max(1, round(mean("prompt_tokens", "decode"))), max(2, round(mean("output_tokens", "prefill")))


def _fleet_rate(plan: PlanSpec, rates: Mapping[str, ServiceRates]) -> float:
    """Requests per second the measured P/D fleet served: over the prefill pools (the decode pools
    where no prefill pool was measured), a pool not measured taken at the measured pools' mean per replica."""
    measured = [p for p in plan.pools if p.name in rates]
    role = "prefill" if any(p.role == "prefill" for p in measured) else measured[0].role
    pools = [p for p in plan.pools if p.role == role]
    seen = [p for p in pools if p.name in rates]
    per_replica = sum((rates[p.name].rate_rps or 1.0) * p.replicas for p in seen) / sum(p.replicas for p in seen)
    return sum((rates[p.name].rate_rps or 1.0) * p.replicas if p.name in rates else per_replica * p.replicas
               for p in pools)


def modelled_service(plan: PlanSpec, rates: Mapping[str, ServiceRates], factors: Mapping[str, float],
                     seed: int) -> dict[str, Modelled]:
    """Each measured pool's modelled service at the load it was measured under, its step times x
    its own factor (pools not measured: x1): a colocated pool simulated alone at its measured rate
    per replica (the share the router gave it), prefill/decode pools together at the fleet's rate."""
    pools = [p.model_copy(update={"step_time_factor": factors.get(p.name, 1.0)}) for p in plan.pools]
    if plan.disaggregated:
        sim_plan = plan.model_copy(update={"pools": pools})
        return _simulated(sim_plan, _fleet_rate(plan, rates), _lengths(plan, rates), seed)
    out: dict[str, Modelled] = {}
    for pool in pools:
        if pool.name in rates:
            r = rates[pool.name]
            alone = plan.model_copy(update={"pools": [pool]})
            out.update(_simulated(alone, (r.rate_rps or 1.0) * pool.replicas, _lengths(plan, {pool.name: r}), seed))
    return out


def _simulated(plan: PlanSpec, rate_rps: float, lengths: tuple[int, int], seed: int) -> dict[str, Modelled]:
    """Every pool's modelled service when `plan` serves Poisson arrivals at `rate_rps` of fixed `lengths`."""
    import numpy as np

    from fleetwise.core.request import Request
    from fleetwise.sim.runner import SimOptions, simulate

    gaps = np.random.default_rng(seed).exponential(1.0 / rate_rps, FIT_REQUESTS)
    prompt, output = lengths
    reqs = [Request(f"fit-{i}", float(t), prompt, output) for i, t in enumerate(np.cumsum(gaps))]
    rec = simulate(plan, reqs, options=SimOptions(seed=seed)).records
    pool_of = np.array([p.name for p in plan.pools for _ in range(p.replicas)] + [""])  # worker -1: none
    decoded_by = pool_of[rec.column("worker")]
    prefilled_by = pool_of[rec.column("prefill_worker")] if plan.disaggregated else decoded_by
    start, first, end = rec.column("prefill_start_s"), rec.column("first_token_s"), rec.column("finish_s")
    prefill_end = rec.column("prefill_end_s") if plan.disaggregated else first
    out = {}
    for pool in plan.pools:
        ok_p = (prefilled_by == pool.name) & np.isfinite(start) & np.isfinite(prefill_end)
        ok_d = (decoded_by == pool.name) & np.isfinite(first) & np.isfinite(end)
        pre = prefill_end[ok_p] - start[ok_p]
        dec = (end[ok_d] - first[ok_d]) / (output - 1)
        out[pool.name] = Modelled(float(pre.mean()) if pre.size else 0.0, float(dec.mean()) if dec.size else 0.0,
                                  _cv(pre), _cv(dec), int(max(pre.size, dec.size)))
    return out


def _ratios(plan: PlanSpec, rates: Mapping[str, ServiceRates], factors: Mapping[str, float],
            seed: int) -> dict[str, tuple[float, float]]:
    """Per measured pool: (measured over modelled service at `factors`, its relative standard error)."""
    modelled = modelled_service(plan, rates, factors, seed)
    out = {}
    for pool in plan.pools:
        if pool.name not in rates:
            continue
        r, m = rates[pool.name], modelled[pool.name]
        parts = []  # (measured / modelled, weight, per-request cv)
        if pool.role != "decode" and m.prefill_s > 0:
            parts.append((r.prefill_s / m.prefill_s, r.prefill_s, m.prefill_cv))
        if pool.role != "prefill" and m.decode_s_per_token > 0:
            parts.append((r.decode_s_per_token / m.decode_s_per_token, r.decode_s_per_token * r.output_tokens,
                          m.decode_cv))
        if not parts:
            raise SpecError(f"pool {pool.name}: the model served no request of it at the measured load; "
                            "check that the metrics belong to this fleet")
        weight = sum(w for _, w, _ in parts)
        cv = math.sqrt(sum((w / weight * c) ** 2 for _, w, c in parts))
        out[pool.name] = (sum(x * w for x, w, _ in parts) / weight,
                          cv * math.sqrt(1 / r.requests + 1 / max(m.requests, 1)))
    return out


def fit_factors(plan: PlanSpec, rates: Mapping[str, ServiceRates], seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """Per measured pool: (step-time factor, 95% low, 95% high): the factor at which the modelled
    prefill and decode time (weighted by their share of a request's service) meet the measured
    ones, every pool at its own estimate. Slower steps grow the batch, so the modelled time grows
    faster than the factor near saturation: Newton steps on log(measured / modelled) over log
    factor, the slope from the last two simulations (-1 at first), until within FIT_TOLERANCE or
    FIT_STEPS simulations. The interval takes the per-request spread the model predicts at that
    load (histogram buckets are too coarse to give it) over the measured and simulated counts."""
    factors = {name: 1.0 for name in rates}
    seen: dict[str, tuple[float, float]] = {}  # pool -> (log factor, log ratio) of the simulation before
    for step in range(FIT_STEPS):
        ratios = _ratios(plan, rates, factors, seed)
        nxt = {}
        for name, (ratio, _) in ratios.items():
            lf, lr = math.log(factors[name]), math.log(ratio)
            slope = -1.0
            if name in seen and lf != seen[name][0]:
                slope = min(-0.2, max(-5.0, (lr - seen[name][1]) / (lf - seen[name][0])))
            seen[name] = (lf, lr)
            nxt[name] = math.exp(lf - lr / slope)
        done = all(abs(r - 1) <= FIT_TOLERANCE for r, _ in ratios.values())
        factors = nxt
        if done and step > 0:
            break
    out = {}
    for name, (_, rel_se) in ratios.items():
        factor = factors[name]
        half = Z95 * rel_se * factor
        out[name] = (factor, max(0.0, factor - half), factor + half)
    return out


def fit_document(plan: PlanSpec, by_pool: dict[str, list[ReplicaMetrics]], seed: int = 0) -> dict[str, Any]:
    """The `fleetwise-measured/1` document: per measured pool its service rates, the modelled
    ones and the fitted step-time factor with its 95% interval."""
    role = {p.name: p for p in plan.pools}
    rates = {name: service_rates(reps, role[name].role) for name, reps in by_pool.items()}
    fits = fit_factors(plan, rates, seed)
    pools = []
    for name, reps in by_pool.items():
        pool, r = role[name], rates[name]
        factor, lo, hi = fits[name]
        pools.append({"pool": name, "role": pool.role, "accelerator": pool.accelerator, "model": pool.model,
                      "replicas_measured": len(reps), "requests": r.requests,
                      "rate_rps_per_replica": None if r.rate_rps is None else round(r.rate_rps, 6),
                      "prompt_tokens_mean": round(r.prompt_tokens, 3),
                      "output_tokens_mean": round(r.output_tokens, 3),
                      "prefill_tokens_per_s": round(r.prefill_tokens_per_s, 3),
                      "decode_tokens_per_s": round(r.decode_tokens_per_s, 3),
                      "step_time_factor": round(factor, 4), "ci95": [round(lo, 4), round(hi, 4)],
                      "sources": [m.source for m in reps]})
    return {"schema": MEASURED_SCHEMA, "fleet": plan.name, "pools": pools}


def _measured_pool(p: Any, at: str) -> tuple[str, float, float, tuple[float, float]]:
    """(accelerator, requests, step-time factor, 95% interval) of one measured pool; SpecError
    naming the field of a missing, non-numeric or nonsensical figure."""
    if not isinstance(p, dict) or not {"accelerator", "model", "step_time_factor", "ci95", "requests"} <= set(p):
        raise SpecError(f"{at}: needs accelerator, model, step_time_factor, ci95 and requests")
    n = finite(p["requests"], f"{at}.requests", strictly_positive=True)
    f = finite(p["step_time_factor"], f"{at}.step_time_factor", strictly_positive=True, maximum=MAX_FACTOR)
    ci = p["ci95"]
    if isinstance(ci, list) and len(ci) == 2:
        lo, hi = (finite(x, f"{at}.ci95.{k}", minimum=0.0) for k, x in enumerate(ci))
        if lo <= f <= hi:
            return str(p["accelerator"]), n, f, (lo, hi)
    raise SpecError(f"{at}.ci95: expected [low, high] around step_time_factor {f:g}, got {quote(ci)}; "
                    "write it with `fleetwise calibrate --from-metrics`")


def load_measured(doc: Any, where: str, model: str, accelerators: Sequence[str] | None = None) -> list[MeasuredService]:
    """The step-time factors of a `fleetwise-measured/1` document, one per accelerator (replicas
    on one card pooled, weighted by requests; only where both phases were measured on it: a mixed
    pool, or prefill and decode pools) and one per role of its prefill and decode pools (which
    price only their own phase); SpecError naming the field of a bad document, of
    a measurement of another model than `model` (the factor corrects one model on one card), or
    of one on none of `accelerators` (the spec's cards: it would change nothing)."""
    if not isinstance(doc, dict) or doc.get("schema") != MEASURED_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise SpecError(f"{where}: schema: {got!r} is not {MEASURED_SCHEMA}; write it with "
                        "`fleetwise calibrate --from-metrics ... --plan FLEET -o FILE`")
    pools = doc.get("pools")
    if pools is None or pools == []:
        raise SpecError(f"{where}: pools: empty; nothing was measured; write it with "
                        "`fleetwise calibrate --from-metrics ... --plan FLEET -o FILE`")
    acc: dict[tuple[str, str | None], list[tuple[str, float, float, tuple[float, float]]]] = {}
    rows = pools if isinstance(pools, list) else [pools]
    phases: dict[str, set[Any]] = {}
    for i, p in enumerate(rows):
        gpu, n, f, ci = _measured_pool(p, f"{where}: pools.{i}")
        phases.setdefault(gpu, set()).add(p.get("role"))
        if p["model"] != model:
            raise SpecError(f"{where}: pools.{i}.model: measured on {p['model']!r}, but the spec plans {model!r}; "
                            "measure a fleet of this model")
        row = (str(p.get("pool", "?")), n, f, ci)
        acc.setdefault((gpu, None), []).append(row)
        if p.get("role") in ("prefill", "decode"):  # P/D pools keep their own factor too
            acc.setdefault((gpu, p["role"]), []).append(row)
    cards = {gpu for gpu, _ in acc}
    if accelerators is not None and not cards & set(accelerators):
        raise SpecError(f"{where}: measured on {', '.join(sorted(cards))}, but the spec plans on "
                        f"{', '.join(accelerators)}; the measurement would change nothing: measure a fleet on one of "
                        "them or add its card")
    out = []
    for (gpu, role), ps in acc.items():
        if role is None and phases[gpu] in ({"prefill"}, {"decode"}):
            continue  # one phase only: no measurement of the other phase's steps on this card
        n = sum(q[1] for q in ps)
        f = sum(q[2] * q[1] for q in ps) / n
        lo = min(q[3][0] for q in ps)
        hi = max(q[3][1] for q in ps)
        src = f"{where}: {', '.join(q[0] for q in ps)}, {n:g} requests"
        out.append(MeasuredService(accelerator=gpu, step_time_factor=f, ci95=(lo, hi), source=src, role=role))
    return out


def provenance(search: Search, c: Candidate) -> list[str]:
    """Where a ranked plan's numbers come from: the routing every simulation used, and per pool
    whether its replicas were sized from measured service rates or from the perf model alone."""
    spec = search.spec
    why = "the spec's routing_policy" if spec.routing_policy else "the gateway's default; the spec names none"
    out = [f"routing: every simulation routed with {simulated_policy(spec)} ({why})"]
    assert c.refined is not None
    for p in c.refined.full.pools:
        m = spec.measured_for(p.layout.accelerator, p.role)
        if m is not None:
            lo, hi = m.ci95
            out.append(f"{p.role} replicas: sized from measured service: step times x{m.step_time_factor:.3f} "
                       f"(95% CI {lo:.3f}-{hi:.3f}; {m.source}) on the modelled ones, latency floors and capacities "
                       "included; fit and memory modelled")
        elif (p.role, p.layout) in search.measured:
            out.append(f"{p.role} replicas: sized from a load test ({search.measured[(p.role, p.layout)]})")
        else:
            out.append(f"{p.role} replicas: sized from the perf model (no measurement of {p.role} pools on {p.layout.accelerator})")
    return out
