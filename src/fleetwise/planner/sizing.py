"""Step 3 of planning: replica counts from effective goodput, plus each headroom term, shown.

Owns the arithmetic from a measured per-replica goodput G (requests/s at which one replica still
meets the SLO under the target mix) to a replica count:

    load      = rate * burst / G                       (fractional replicas at peak)
    ramp      = load * rate_growth_per_min * cold_start_s / 60
                                                        (growth while a new replica cold-starts)
    serving   = ceil(load + ramp)                      (at least 1)
    failures  = failures_to_survive                    (N+k: survive k replica losses)
    upgrade   = upgrade_batch - failures               (a rolling-upgrade batch out at once; it
                or upgrade_batch when failures_during_upgrade   overlaps the failure spare unless
                                                        both must hold together), at least 0
    total     = serving + failures + upgrade

and the P:D split for disaggregated pools, where each pool is sized from its own stage goodput.
Does not measure anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetwise.spec.planning import HeadroomSpec


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

    @property
    def total(self) -> int:
        return self.serving + self.failures + self.upgrade

    def explain(self, headroom: HeadroomSpec) -> str:
        """One plain sentence with every term and its inputs."""
        ramp = (f" + cold-start ramp {self.ramp_replicas:.2f} ({headroom.rate_growth_per_min:.0%}/min growth over "
                f"{headroom.cold_start_s:.0f} s)" if self.ramp_replicas > 0 else
                f" (cold start {headroom.cold_start_s:.0f} s adds no ramp term: rate_growth_per_min is 0)")
        upgrade_why = ("an upgrade batch also out during failures" if headroom.failures_during_upgrade
                       else "upgrade batch beyond the failure spares")
        return (
            f"{self.role} replicas: {self.rate_rps:g} req/s x burst {self.burst_factor:.2f} / effective goodput "
            f"{self.goodput_per_replica_rps:.2f} req/s per replica = {self.load_replicas:.2f}{ramp} -> "
            f"{self.serving} serving + {self.failures} for {headroom.failures_to_survive} failure(s) + "
            f"{self.upgrade} for {upgrade_why} ({headroom.upgrade_batch_replicas} at a time) = {self.total}"
        )


def size_pool(role: str, goodput_rps: float, rate_rps: float, burst: float, headroom: HeadroomSpec) -> Sizing:
    """Replicas for one pool (goodput must be > 0: callers drop candidates that cannot meet the SLO)."""
    if goodput_rps <= 0:
        raise ValueError("goodput_rps must be positive")
    load = rate_rps * burst / goodput_rps
    ramp = load * headroom.rate_growth_per_min * headroom.cold_start_s / 60.0
    serving = max(1, math.ceil(load + ramp - 1e-9))
    failures = headroom.failures_to_survive
    if headroom.failures_during_upgrade:
        upgrade = headroom.upgrade_batch_replicas
    else:
        upgrade = max(0, headroom.upgrade_batch_replicas - failures)
    return Sizing(role, goodput_rps, rate_rps, burst, load, ramp, serving, failures, upgrade)


def pd_ratio_text(prefill: Sizing, decode: Sizing) -> str:
    """`P:D` with the load each pool carries."""
    return (f"P:D = {prefill.serving}:{decode.serving} serving replicas "
            f"(prefill load {prefill.load_replicas:.2f}, decode load {decode.load_replicas:.2f} replicas)")
