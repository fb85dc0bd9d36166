"""The planner's one state object, passed forward through the phases, and what workers get.

`Search` is created by the fit phase and filled by each phase in turn (latency -> goodput ->
sizing -> refinement -> checks -> disaggregation -> ranking; `api.plan` runs them); the report reads it.
`Context` is the part simulation tasks need (spec, request mix, prices, peak rate), sent to
worker processes. Does not compute anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleetwise.perf.roofline import PerfModel
from fleetwise.spec.planning import PlanningSpec

if TYPE_CHECKING:
    from fleetwise.planner.layout import Enumeration, Hardware, Layout, Rejection
    from fleetwise.planner.results import Claims, LayoutEstimate, Refined, Sizing
    from fleetwise.planner.simulate import FleetShape
    from fleetwise.planner.workload import LengthMix, LengthStats


@dataclass(frozen=True)
class Context:
    """What every task needs: the spec, the request mix, prices, the peak rate."""

    spec: PlanningSpec
    mix: LengthMix
    prices: dict[str, float]
    burst: float
    weight_bytes: dict[str, float] = field(default_factory=dict)
    """The model's weight bytes per weight dtype (what a cold start reads from storage)."""
    storage_bytes_per_s: dict[str, float] = field(default_factory=dict)
    """Each allowed card's storage read rate per GPU (`AcceleratorSpec.storage_bytes_per_s`)."""

    def load_s(self, lay: Layout) -> float:
        """Seconds a `lay` replica reads its weights on a cold start: each card's share of the
        weights over its storage read rate (0 when the context does not know the card)."""
        rate = self.storage_bytes_per_s.get(lay.accelerator)
        return self.weight_bytes.get(lay.weight_dtype, 0.0) / lay.gpus / rate if rate else 0.0

    def cold_s(self, lay: Layout) -> float:
        """A cold start of a `lay` replica: the spec's `cold_start_s` plus its weights' load time."""
        return self.spec.headroom.cold_start_s + self.load_s(lay)

    @property
    def peak_rps(self) -> float:
        return self.spec.workload.rate_rps * self.burst


@dataclass(frozen=True)
class PlanOptions:
    """How to run the search (not what to search: that is the spec)."""

    workers: int = 1
    """Worker processes for simulations (1 = in this process)."""
    top_k: int | None = None
    """Plans to report; None uses spec.search.top_k."""
    ray_address: str | None = None
    """Fan simulations out over a Ray cluster instead (needs the `fleetwise[ray]` extra)."""
    progress: Callable[[float], None] | None = None
    """Told the fraction of the search done (0..1) as phases and simulation tasks finish."""


@dataclass
class Candidate:
    """A sized fleet before refinement, with the steps that produced it."""

    key: str
    kind: str
    """`colocated`, `disaggregated` or `heterogeneous`."""
    fleet: FleetShape
    sizings: dict[str, Sizing]
    steps: list[str]
    cost_per_hour: float = 0.0
    refined: Refined | None = None
    claims: Claims | None = None

    @property
    def demoted(self) -> str | None:
        """Why the plan ranks below the plans whose claims and headroom hold (None when they hold):
        a failed claim, or a headroom term that still missed after its replicas were added."""
        why = []
        if self.claims is not None and self.claims.failed:
            why.append("claim(s) failed in simulation: " + "; ".join(self.claims.failed_by))
        missed = [h for h in (self.refined.headroom if self.refined else []) if not h.verdict.passed]
        if missed:
            why.append("headroom still missed after adding replicas: " + "; ".join(
                f"{h.term} (attainment {h.verdict.attainment:.1%} with {h.added} {h.role} replica(s) added)"
                for h in missed))
        return "demoted: " + "; ".join(why) if why else None


@dataclass
class Search:
    """Everything the phases produce; the report reads it."""

    spec: PlanningSpec
    hw: Hardware
    stats: LengthStats
    burst: float
    burst_source: str
    perf: PerfModel
    """Prices every step of the estimate; the simulator loads the same profile (`spec.profile`)."""
    ctx: Context
    """What simulation tasks get (spec, request mix, prices, peak rate)."""
    enumeration: Enumeration | None = None
    """The fit phase's layouts (fitting, with their KV capacity) before the latency phase filters them."""
    shortlists: dict[str, list[Layout]] = field(default_factory=dict)
    """Layouts measured per role (`mixed`, `prefill`, `decode`) by the goodput phase."""
    refined: list[Candidate] = field(default_factory=list)
    """Candidates the refinement phase simulated, in the order refined."""
    estimates: dict[Layout, LayoutEstimate] = field(default_factory=dict)
    fits: dict[Layout, str] = field(default_factory=dict)
    goodput: dict[tuple[str, Layout], float] = field(default_factory=dict)
    measured: dict[tuple[str, Layout], str] = field(default_factory=dict)
    """Goodputs taken from a load test instead of the simulator, with the evidence."""
    candidates: list[Candidate] = field(default_factory=list)
    sized: list[Candidate] = field(default_factory=list)
    """Every fleet the sizing phase built, within the GPU limits or not (the plan document's `candidates`)."""
    ranked: list[Candidate] = field(default_factory=list)
    ranked_exact: int = 0
    """How many of `ranked`, from the first, have their exact rank (the rest rank below some
    candidate left unchecked, whose place is not known)."""
    unchecked: list[Candidate] = field(default_factory=list)
    """Refined candidates that met the SLO but whose headroom and claims were not simulated: they
    could not be reported whatever those gave (`checks`)."""
    rejected: list[Rejection] = field(default_factory=list)
    disaggregation: dict[str, object] = field(default_factory=dict)
    simulations: int = 0
    wall_s: float = 0.0
    top_k: int = 3
    infeasible: str | None = None
