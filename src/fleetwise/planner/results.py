"""The records the phases leave in the search state, kept apart from the phases that make them.

Owns `LayoutEstimate` (latency phase), `Sizing` (sizing phase), `Refined` and `HeadroomCheck`
(refinement phase) and `Claims` (disaggregation phase): plain values with their own wording, so
`state.Search` and `state.Candidate` name them without importing any phase, and phases read each
other's results through this module. Computes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fleetwise.planner.layout import Layout
from fleetwise.planner.simulate import FleetShape, SimVerdict
from fleetwise.spec.planning import HeadroomSpec


def cold_start_text(start_s: float, load_s: float) -> tuple[str, str]:
    """(total, weight read) of a cold start as the explanations print them, in seconds: the read to
    0.1 s and the total as the start plus that printed read, so the sentence adds up."""
    load = round(load_s, 1)
    return f"{round(start_s + load, 1):g}", f"{load:.1f}"

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
    prefill_service_cv2: float = 0.0
    """C^2 of the prefill service time over the prompt-length distribution (the M/G/1 queue's)."""

    @property
    def latency_ok(self) -> bool:
        return self.ttft_ok and self.tpot_ok


@dataclass(frozen=True)
class Sizing:
    """A replica count with each term that produced it."""

    role: str
    goodput_per_replica_rps: float
    rate_rps: float
    burst_factor: float
    load_replicas: float
    ramp_replicas: float
    serving: int
    failures: int
    upgrade: int
    load_s: float = 0.0
    """Seconds a replica reads its weights on a cold start (added to `cold_start_s`)."""

    @property
    def total(self) -> int:
        return self.serving + self.failures + self.upgrade

    def explain(self, headroom: HeadroomSpec) -> str:
        """One plain sentence with every term and its inputs."""
        total, load = cold_start_text(headroom.cold_start_s, self.load_s)
        cold = f"{total} s = {headroom.cold_start_s:g} s start + {load} s reading the weights"
        ramp = (f" + cold-start ramp {self.ramp_replicas:.2f} ({headroom.rate_growth_per_min:.0%}/min growth over "
                f"{cold})" if self.ramp_replicas > 0 else
                f" (cold start {cold} adds no ramp term: rate_growth_per_min is 0)")
        upgrade_why = ("an upgrade batch also out during failures" if headroom.failures_during_upgrade
                       else "upgrade batch beyond the failure spares")
        return (
            f"{self.role} replicas: {self.rate_rps:g} req/s x burst {self.burst_factor:.2f} / effective goodput "
            f"{self.goodput_per_replica_rps:.2f} req/s per replica = {self.load_replicas:.2f}{ramp} -> "
            f"{self.serving} serving + {self.failures} for {headroom.failures_to_survive} failure(s) + "
            f"{self.upgrade} for {upgrade_why} ({headroom.upgrade_batch_replicas} at a time) = {self.total}"
        )



def size_pool(role: str, goodput_rps: float, rate_rps: float, burst: float, headroom: HeadroomSpec,
              load_s: float = 0.0) -> Sizing:
    """Replicas for one pool (goodput must be > 0: callers drop candidates that cannot meet the
    SLO); `load_s`: seconds a replica reads its weights on a cold start."""
    if goodput_rps <= 0:
        raise ValueError("goodput_rps must be positive")
    load = rate_rps * burst / goodput_rps
    ramp = load * headroom.rate_growth_per_min * (headroom.cold_start_s + load_s) / 60.0
    serving = max(1, math.ceil(load + ramp - 1e-9))
    failures = headroom.failures_to_survive
    if headroom.failures_during_upgrade:
        upgrade = headroom.upgrade_batch_replicas
    else:
        upgrade = max(0, headroom.upgrade_batch_replicas - failures)
    return Sizing(role, goodput_rps, rate_rps, burst, load, ramp, serving, failures, upgrade, load_s)


@dataclass
class HeadroomCheck:
    """One headroom term simulated at the target rate against the full plan."""

    term: str
    role: str
    verdict: SimVerdict
    added: int = 0
    requests: int = 0
    """Requests in the run."""
    span_s: float = 0.0
    """Seconds of arrivals in the run."""
    first: SimVerdict | None = None
    """The run against the plan as sized, when it missed and replicas were added."""

    def line(self, pct: int, slo_ttft_s: float, slo_tpot_s: float) -> str:
        v, k = self.verdict, f"p{pct}"
        f = self.first
        was = (f" (as sized: attainment {f.attainment:.1%}, TTFT {k} {f.ttft[k] * 1e3:.0f} ms, TPOT {k} "
               f"{f.tpot[k] * 1e3:.1f} ms)" if f is not None else "")
        fix = (f"; missed first{was}, so {self.added} {self.role} replica(s) were added" if self.added and v.passed
               else f"; STILL MISSES after adding {self.added} {self.role} replica(s){was}" if self.added else "")
        return (f"headroom checked in simulation: {self.term}: {self.requests} requests over {self.span_s:.0f} s, "
                f"attainment {v.attainment:.1%}, TTFT {k} {v.ttft[k] * 1e3:.0f} ms (target {slo_ttft_s * 1e3:.0f}), "
                f"TPOT {k} {v.tpot[k] * 1e3:.1f} ms (target {slo_tpot_s * 1e3:.0f}) -> "
                f"{'holds' if v.passed else 'misses'}{fix}")


@dataclass
class Refined:
    """A fleet after confirmation, its seeds at the target rate, and its run with failures spent."""

    key: str
    serving: FleetShape
    full: FleetShape
    corrections: list[str] = field(default_factory=list)
    confirm: SimVerdict | None = None
    seeds: list[SimVerdict] = field(default_factory=list)
    headroom: list[HeadroomCheck] = field(default_factory=list)
    """Each headroom term simulated against the sized plan (and what was added when one missed)."""
    runs: int = 0
    tried: list[tuple[FleetShape, SimVerdict]] = field(default_factory=list)
    """Each fleet the confirmation ran at peak rate, in order (the P:D ratios tried, for PD plans)."""

    @property
    def passed(self) -> bool:
        return bool(self.seeds) and all(v.passed for v in self.seeds)


@dataclass
class Claims:
    """The four claims of a PD plan, each with its evidence; a failed one demotes the plan."""

    results: list[dict[str, object]]
    runs: int

    @property
    def failed(self) -> list[str]:
        return [str(r["claim"]) for r in self.results if not r["holds"]]

    @property
    def failed_by(self) -> list[str]:
        """Each failed claim with by how much it failed: `claim (shortfall)`."""
        return [f"{r['claim']} ({r['short_by']})" if r.get("short_by") else str(r["claim"])
                for r in self.results if not r["holds"]]

    @property
    def procedure(self) -> str | None:
        """The upgrade procedure the plan's upgrade claim holds with (None: no such claim, or it failed)."""
        return next((str(r["procedure"]) for r in self.results if r.get("procedure")), None)
