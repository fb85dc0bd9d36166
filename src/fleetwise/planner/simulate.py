"""Simulator-backed measurements: a fleet shape as a `PlanSpec`, one run judged against the SLO,
and the bisection that finds a replica's *effective* goodput under the target length mix.

Owns `FleetShape` (pools of layouts with replica counts), `run_fleet` (one seeded simulation,
summarised into a `SimVerdict`; a run repeated with identical inputs in the same process is
answered from a bounded memo, `simulate_fleet` being the uncached reference; `FleetRun` is one
such run as a value, which another process may simulate and the memo then keep; `memo_only`
replays a decision from the memo alone to learn which run it needs next), `passes` (a
verdict-only run, stopped once certain, `early`) and `bisect_rate` (the largest arrival rate
at which the SLO still holds, found by doubling then halving). A pass needs the SLO percentile of TTFT and of TPOT under
their targets and the attainment (requests meeting both, failed ones counting as missed) at
least the required fraction; a stage check (`ttft` or `tpot`) looks at one target only. Does not
choose what to measure (goodput) or how many replicas to buy (sizing).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from functools import cached_property
from operator import attrgetter
from typing import Any, Literal

from fleetwise.core.request import Request
from fleetwise.planner.early import KEEP_UP_BACKLOG, CertainMiss, CertainPass, VerdictWatch, backlog_growth
from fleetwise.planner.layout import Layout, layout_imbalance, pool_spec
from fleetwise.planner.workload import LengthMix, requests_at
from fleetwise.spec.faults import FaultScenario, ReplicaCrash
from fleetwise.spec.plan import KvLinkSpec, PlanSpec
from fleetwise.spec.planning import PlanningSpec
from fleetwise.spec.roles import Role
from fleetwise.spec.routing import DEFAULT_POLICY
from fleetwise.spec.slo import SLOSpec

Check = Literal["both", "ttft", "tpot"]
MIN_REQUESTS_PER_RUN = 200
MAX_REQUESTS_PER_RUN = 2400
SECONDS_PER_RUN = 60.0  # aim for about a minute of simulated traffic, within the bounds above
SIM_MEMO_ENTRIES = 256
"""Verdicts `run_fleet` keeps per process, least recently used dropped first. A search repeats
some runs exactly (a plan's confirmation at peak rate is its first seed's run when the peak is the
target rate and it has no spares; the equal-cost check's colocated run is a confirmation); each
kept verdict is a few hundred bytes plus its key (mostly the mix's arrays as bytes, tens of kB)."""


@dataclass(frozen=True)
class PoolShape:
    """`replicas` replicas of one layout in one role."""

    role: Role
    layout: Layout
    replicas: int

    @property
    def gpus(self) -> int:
        return self.replicas * self.layout.gpus


@dataclass(frozen=True)
class FleetShape:
    """A candidate fleet: one mixed pool, or a prefill and a decode pool."""

    pools: tuple[PoolShape, ...]
    kv_link_bytes_per_s: float | None = None
    kv_link_latency_s: float = 20e-6

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def disaggregated(self) -> bool:
        return self.pools[0].role != "mixed"

    def pool(self, role: str) -> PoolShape:
        return next(p for p in self.pools if p.role == role)

    def with_replicas(self, **counts: int) -> FleetShape:
        pools = tuple(PoolShape(p.role, p.layout, counts.get(p.role, p.replicas)) for p in self.pools)
        return FleetShape(pools, self.kv_link_bytes_per_s, self.kv_link_latency_s)

    @property
    def label(self) -> str:
        return " + ".join(f"{p.replicas}x {p.role} [{p.layout.label}]" for p in self.pools)


@dataclass(frozen=True)
class SimVerdict:
    """One simulation judged against the SLO, with the figures a report quotes."""

    passed: bool
    rate_rps: float
    seed: int
    ttft: dict[str, float]
    tpot: dict[str, float]
    attainment: float
    goodput_rps: float
    """SLO-meeting requests per second of arrivals (`steady_goodput`), not the summary's
    per-span figure, which the drain after the last arrival biases low."""
    failed: int
    kv_transfer: dict[str, float] = field(default_factory=dict)
    utilization: dict[str, float] = field(default_factory=dict)
    """Mean utilisation per role."""
    retried: int = 0
    """Requests routed a second time (a crash with retry, a refused KV hand-off)."""
    failure_reasons: dict[str, int] = field(default_factory=dict)
    waits: dict[str, float] = field(default_factory=dict)
    """SLO-percentile seconds of `prefill_queue` (arrival to first prefill step) and, in PD plans,
    `decode_wait` (KV landed to first token: the decode pool's admission queue)."""
    backlog_growth: float = 0.0
    """`early.backlog_growth` of the run: above `KEEP_UP_BACKLOG` the fleet did not keep up with its
    arrivals and the run fails whatever its TTFT and TPOT."""


def to_plan_spec(spec: PlanningSpec, fleet: FleetShape, prices: dict[str, float]) -> PlanSpec:
    """The simulator's plan document for a fleet shape."""
    pools = [pool_spec(p.layout, spec.model, spec.kv_dtype,
                       layout_imbalance(spec.moe.expert_imbalance, spec.moe.expert_load, p.layout), p.role,
                       p.replicas, prices[p.layout.accelerator]) for p in fleet.pools]
    pools = [p.model_copy(update={"step_time_factor": spec.step_time_factor(p.accelerator, p.role)})
             if spec.step_time_factor(p.accelerator, p.role) != 1.0 else p for p in pools]
    kv = KvLinkSpec(bandwidth_bytes_per_s=fleet.kv_link_bytes_per_s, latency_s=fleet.kv_link_latency_s) \
        if fleet.kv_link_bytes_per_s else KvLinkSpec()
    return PlanSpec(name=spec.name, pools=pools, kv_link=kv, routing=simulated_policy(spec),
                    perf_profile=spec.profile, failure_domains=spec.failure_domains)


def simulated_policy(spec: PlanningSpec) -> str:
    """The routing policy the search simulates: the spec's, else the gateway's default, since that is
    what the fleet will run behind `fleetwise gateway`."""
    return spec.routing_policy or DEFAULT_POLICY


def requests_for(rate_rps: float, sample: int) -> int:
    return int(min(MAX_REQUESTS_PER_RUN, max(MIN_REQUESTS_PER_RUN, sample, rate_rps * SECONDS_PER_RUN)))


def _sim_slo(spec: PlanningSpec, check: Check) -> SLOSpec:
    return SLOSpec(ttft_max_s=spec.slo.ttft_s if check != "tpot" else None,
                   tpot_max_s=spec.slo.tpot_s if check != "ttft" else None)


def steady_goodput(records: Any, slo: SLOSpec) -> float:
    """SLO-meeting requests per second of arrivals: the met fraction times the arrival rate
    ((n-1) gaps over first to last arrival). The drain after the last arrival is not in the
    denominator, so a fleet that keeps up reports its offered rate times its attainment."""
    from fleetwise.sim.results import request_metrics

    arr = records.arrival()
    n = int(arr.size)
    if n < 2 or float(arr.max()) <= float(arr.min()):
        return 0.0
    ttft, tpot, e2e, done = request_metrics(records)
    good = int((done & slo.met(ttft, tpot, e2e)).sum())
    return good / n * (n - 1) / (float(arr.max()) - float(arr.min()))


def _waits(records: Any, pct: int) -> dict[str, float]:
    import numpy as np

    arr = records.arrival()
    out: dict[str, float] = {}
    q = records.column("prefill_start_s") - arr
    q = q[np.isfinite(q)]
    out["prefill_queue"] = float(np.percentile(q, pct)) if q.size else 0.0
    d = records.column("first_token_s") - records.column("kv_end_s")
    d = d[np.isfinite(d)]
    if d.size:
        out["decode_wait"] = float(np.percentile(d, pct))
    return out


def _judge(summary: dict[str, Any], spec: PlanningSpec, check: Check, rate: float, seed: int,
           records: Any = None) -> SimVerdict:
    key = f"p{spec.slo.percentile}"
    # TPOT is undefined (null) when no output has two tokens: it meets any target, read as 0.0 s.
    ttft, tpot = summary["ttft_s"], {k: v or 0.0 for k, v in summary["tpot_s"].items()}
    ok = summary["slo_attainment"] >= spec.slo.attainment
    if check != "tpot":
        ok = ok and ttft[key] <= spec.slo.ttft_s
    if check != "ttft":
        ok = ok and tpot[key] <= spec.slo.tpot_s
    util: dict[str, list[float]] = {}
    for r in summary.get("per_replica", []):
        util.setdefault(r.get("role", "mixed"), []).append(float(r.get("utilization", 0.0)))
    kv = summary.get("kv_transfer") or {}
    good = steady_goodput(records, _sim_slo(spec, check)) if records is not None else float(summary["goodput_rps"])
    waits = _waits(records, spec.slo.percentile) if records is not None else {}
    backlog = backlog_growth(records.arrival(), records.column("first_token_s")) if records is not None else 0.0
    ok = ok and backlog <= KEEP_UP_BACKLOG
    return SimVerdict(
        bool(ok), rate, seed, {k: float(ttft[k]) for k in ("p50", "p90", "p99")},
        {k: float(tpot[k]) for k in ("p50", "p90", "p99")}, float(summary["slo_attainment"]),
        good, int(summary["requests_failed"]),
        {k: float(kv[k]) for k in ("p50_s", "p99_s") if k in kv},
        {role: sum(v) / len(v) for role, v in util.items() if v}, int(summary.get("requests_retried", 0)),
        dict(summary.get("failure_reasons", {})), waits, backlog)


_memo: OrderedDict[Hashable, SimVerdict] = OrderedDict()


def requests_digest(requests: list[Request] | None) -> bytes | None:
    """The SHA-256 of a caller's arrivals, every field of every request, one field's column at a
    time (`_column_bytes`): the key of the requests' own repr without a repr per request; None
    for none."""
    if requests is None:
        return None
    h = hashlib.sha256(str(len(requests)).encode())
    for f in REQUEST_FIELDS:
        h.update(f"\x00{f}:".encode())
        h.update(_column_bytes(list(map(attrgetter(f), requests))))
    return h.digest()


REQUEST_FIELDS = tuple(f.name for f in fields(Request))
"""The fields `requests_digest` covers: all of `core.request.Request`'s."""


def _column_bytes(col: list[Any]) -> bytes:
    """One column of values as bytes that tell apart any two different columns of one length: a
    column of one type as its packed values (floats as IEEE-754 doubles, ints as int64, strings as
    their lengths and UTF-8 text, all None as nothing), any other by its repr, which tells 1 from
    1.0 and round-trips floats; a one-letter tag says which."""
    kinds = set(map(type, col))
    if len(kinds) == 1:
        kind = kinds.pop()
        if kind is float:
            return b"d" + array("d", col).tobytes()
        if kind is int and all(INT64_MIN <= v <= INT64_MAX for v in (min(col), max(col))):
            return b"q" + array("q", col).tobytes()
        if kind is str:
            return b"s" + array("q", map(len, col)).tobytes() + "".join(col).encode("utf-8", "surrogatepass")
        if kind is type(None):
            return b"n"
    return b"r" + repr(col).encode()


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range `_column_bytes` packs ints in (array typecode `q`); a column beyond it goes by repr."""


def _memo_key(spec: PlanningSpec, mix: LengthMix, fleet: FleetShape, prices: dict[str, float], rate_rps: float,
              seed: int, check: Check, faults: FaultScenario | None, reqs: bytes | None) -> Hashable:
    """Everything a run's verdict depends on: compared exactly, except a caller's arrivals, which
    enter as their `requests_digest` so the memo does not keep thousands of requests alive per entry."""
    return (spec.model_dump_json(), mix.prompt.tobytes(), mix.output.tobytes(), mix.unit_gaps.tobytes(), fleet,
            tuple(sorted(prices.items())), rate_rps, seed, check,
            faults.model_dump_json() if faults is not None else None, reqs)


def run_fleet(spec: PlanningSpec, mix: LengthMix, fleet: FleetShape, prices: dict[str, float], rate_rps: float,
              seed: int, check: Check = "both", faults: FaultScenario | None = None,
              requests: list[Request] | None = None) -> SimVerdict:
    """`simulate_fleet`, answered from the per-process memo when the same run was already made."""
    key = _memo_key(spec, mix, fleet, prices, rate_rps, seed, check, faults, requests_digest(requests))
    return _run_keyed(key, spec, mix, fleet, prices, rate_rps, seed, check, faults, requests)


def _run_keyed(key: Hashable, spec: PlanningSpec, mix: LengthMix, fleet: FleetShape, prices: dict[str, float],
               rate_rps: float, seed: int, check: Check, faults: FaultScenario | None,
               requests: list[Request] | None) -> SimVerdict:
    hit = _memo.get(key)
    if hit is not None:
        _memo.move_to_end(key)
        return hit
    return _remember(key, simulate_fleet(spec, mix, fleet, prices, rate_rps, seed, check, faults, requests))


def _remember(key: Hashable, v: SimVerdict) -> SimVerdict:
    _memo[key] = v
    if len(_memo) > SIM_MEMO_ENTRIES:
        _memo.popitem(last=False)
    return v


@dataclass(frozen=True)
class FleetRun:
    """One `run_fleet` call whose spec and prices are the search's: what a task simulating it ahead
    of need is sent (`checks`), and what the memo keeps its verdict under."""

    mix: LengthMix
    fleet: FleetShape
    rate_rps: float
    seed: int
    faults: FaultScenario | None = None
    requests: list[Request] | None = None

    def verdict(self, spec: PlanningSpec, prices: dict[str, float]) -> SimVerdict:
        """`run_fleet` of this run (from the memo when it was made, or remembered, before); inside
        `memo_only()`, a run the memo lacks raises `NotSimulated` instead of being simulated."""
        key = self.key(spec, prices)
        if _memo_only.get() and key not in _memo:
            raise NotSimulated(self)
        return _run_keyed(key, spec, self.mix, self.fleet, prices, self.rate_rps, self.seed, "both", self.faults,
                          self.requests)

    @cached_property
    def requests_digest(self) -> bytes | None:
        """`requests_digest(self.requests)`, made once per run (its key is asked for many times)."""
        return requests_digest(self.requests)

    def key(self, spec: PlanningSpec, prices: dict[str, float]) -> Hashable:
        """What the memo keeps this run's verdict under."""
        return _memo_key(spec, self.mix, self.fleet, prices, self.rate_rps, self.seed, "both", self.faults,
                         self.requests_digest)

    def in_memo(self, spec: PlanningSpec, prices: dict[str, float]) -> bool:
        """Whether the memo holds this run's verdict."""
        return self.key(spec, prices) in _memo

    def remember(self, spec: PlanningSpec, prices: dict[str, float], v: SimVerdict) -> None:
        """Keep `v`, this run's verdict simulated in another process, as `run_fleet` would have."""
        _remember(self.key(spec, prices), v)


class NotSimulated(Exception):
    """Raised inside `memo_only()` by a `FleetRun` the memo does not hold (`run`)."""

    def __init__(self, run: FleetRun) -> None:
        super().__init__("run not in the memo")
        self.run = run


_memo_only: ContextVar[bool] = ContextVar("memo_only", default=False)


@contextmanager
def memo_only() -> Iterator[None]:
    """Within this block `FleetRun.verdict` answers only from the memo: a caller replays a
    decision to learn which run it needs next (`checks`), then simulates it elsewhere."""
    token = _memo_only.set(True)
    try:
        yield
    finally:
        _memo_only.reset(token)


def _arrivals(spec: PlanningSpec, mix: LengthMix, rate_rps: float, seed: int) -> list[Request]:
    """The standard run's arrivals at `rate_rps` for `seed`."""
    reqs = requests_at(mix, rate_rps, requests_for(rate_rps, spec.search.sample_requests))
    return _shift_seed(mix, rate_rps, len(reqs), seed) if seed else reqs


def simulate_fleet(spec: PlanningSpec, mix: LengthMix, fleet: FleetShape, prices: dict[str, float], rate_rps: float,
                   seed: int, check: Check = "both", faults: FaultScenario | None = None,
                   requests: list[Request] | None = None) -> SimVerdict:
    """Simulate `fleet` under the mix at `rate_rps` with one seed and judge the run (`requests`:
    arrivals built by the caller instead of the standard run's, e.g. a longer run or a burst)."""
    from fleetwise.sim.runner import SimOptions, simulate

    reqs = requests if requests is not None else _arrivals(spec, mix, rate_rps, seed)
    plan = to_plan_spec(spec, fleet, prices)
    result = simulate(plan, reqs, faults=faults,
                      options=SimOptions(seed=seed, slo=_sim_slo(spec, check), replica_series=False))
    return _judge(result.summary, spec, check, rate_rps, seed, result.records)


def passes(spec: PlanningSpec, mix: LengthMix, fleet: FleetShape, prices: dict[str, float], rate_rps: float,
           seed: int, check: Check = "both") -> bool:
    """`run_fleet(...).passed` of a standard run, for callers that need only the verdict (the
    goodput bisection): the simulation stops as soon as the rest of the run cannot change the
    verdict (`early.VerdictWatch`: so many requests missed that the attainment cannot reach the
    SLO's, or so many met it that neither the attainment nor a percentile can fall short). A run
    that completes is judged and kept in the memo like `run_fleet`'s."""
    from fleetwise.routing.registry import make_policy
    from fleetwise.sim.runner import SimOptions, simulate

    key = _memo_key(spec, mix, fleet, prices, rate_rps, seed, check, None, None)
    hit = _memo.get(key)
    if hit is not None:
        _memo.move_to_end(key)
        return hit.passed
    slo = _sim_slo(spec, check)
    reqs = _arrivals(spec, mix, rate_rps, seed)
    plan = to_plan_spec(spec, fleet, prices)
    watch = VerdictWatch(make_policy(plan.routing, seed=seed), slo.ttft_max_s, slo.tpot_max_s, len(reqs),
                         spec.slo.attainment, spec.slo.percentile, 2 * plan.regions.latency_s,
                         {r.request_id: r.arrival_s for r in reqs})
    try:
        result = simulate(plan, reqs, options=SimOptions(seed=seed, slo=slo, policy=watch,  # type: ignore[arg-type]
                                                         replica_series=False))
    except CertainMiss:
        return False
    except CertainPass:
        return True
    return _remember(key, _judge(result.summary, spec, check, rate_rps, seed, result.records)).passed


def run_span_s(spec: PlanningSpec, rate_rps: float) -> float:
    """Seconds of arrivals in a standard run at `rate_rps`."""
    return requests_for(rate_rps, spec.search.sample_requests) / rate_rps


def requests_over(mix: LengthMix, rate_rps: float, duration_s: float,
                  retime: Callable[[Any], Any] | None = None) -> list[Request]:
    """Arrivals at mean `rate_rps` for `duration_s` seconds: the mix repeated as often as needed
    (the mix's lengths and gap shape; ceil(rate x duration) requests); `retime` as `requests_at`'s."""
    import numpy as np

    n = max(1, math.ceil(rate_rps * duration_s - 1e-9))
    if n > len(mix.prompt):
        mix = LengthMix(np.resize(mix.prompt, n), np.resize(mix.output, n), np.resize(mix.unit_gaps, n), mix.source)
    return requests_at(mix, rate_rps, n, retime)


def burst_requests(mix: LengthMix, rate_rps: float, factor: float, start_s: float, window_s: float,
                   after_s: float) -> list[Request]:
    """Arrivals at `rate_rps` with a burst: from `start_s` for `window_s` seconds the rate is
    `factor` x `rate_rps`, then `rate_rps` again for `after_s`. The mix's arrivals at one rate are
    re-timed through the piecewise rate (inverse of the cumulative arrival count), so the window
    holds `factor` times the arrivals of a window at the mean rate."""
    import numpy as np

    base_n = rate_rps * start_s
    burst_n = rate_rps * factor * window_s

    def retime(t: Any) -> Any:
        u = t * rate_rps  # cumulative expected arrivals at the constant rate
        return np.where(u < base_n, u / rate_rps,
                        np.where(u < base_n + burst_n, start_s + (u - base_n) / (rate_rps * factor),
                                 start_s + window_s + (u - base_n - burst_n) / rate_rps))

    return requests_over(mix, rate_rps, start_s + factor * window_s + after_s, retime)


def _shift_seed(mix: LengthMix, rate_rps: float, n: int, seed: int) -> list[Any]:
    """Another window of the same mix for another seed (rotated start), so seeds see different requests."""
    import numpy as np

    k = (seed * 7919) % len(mix.prompt)
    rolled = LengthMix(np.roll(mix.prompt, -k), np.roll(mix.output, -k), np.roll(mix.unit_gaps, -k), mix.source)
    return requests_at(rolled, rate_rps, n)


def crash_scenario(fleet: FleetShape, role: str, count: int, last: bool = False) -> FaultScenario:
    """`count` replicas of the `role` pool down from t=0 for the whole run (no restart): its first
    ones in plan order, or with `last` its last ones (those a rolling upgrade reaches last)."""
    first = fleet.pool(role).replicas - count if last else 0
    crashes = [ReplicaCrash(replica=f"{role}-{i}", at_s=0.0, restart_after_s=None) for i in range(first, first + count)]
    return FaultScenario(name=f"{count} {role} replicas down", faults=list(crashes))


def bisect_rate(evaluate: Callable[[float], bool], guess_rps: float, steps: int, floor_rps: float = 0.0) -> float:
    """Largest rate (requests/s) where `evaluate` passes: double from `guess` until a failure, then bisect.

    Below `floor_rps` a replica is useless to the plan (more replicas than the GPU limit allows
    would be needed), so the search stops there. Returns 0.0 when no rate tried passes.
    """
    lo, hi = 0.0, None
    rate = max(guess_rps, floor_rps, 1e-3)
    for _ in range(steps):
        if evaluate(rate):
            lo = rate
            rate = rate * 2 if hi is None else (lo + hi) / 2
            continue
        if lo == 0 and rate <= floor_rps:
            return 0.0
        hi = rate
        rate = (lo + hi) / 2 if lo > 0 else max(rate / 4, floor_rps)
    return lo
