"""`SLOSpec`: per-request latency targets a request must meet to count toward goodput; `PlanSLOSpec`:
the targets a plan is sized for (at a percentile, with the attainment required).

Owns the thresholds only; the simulator's results (and the gateway's metrics) decide whether a
request met them. A target left unset is not checked. `PlanSLOSpec` lives here rather than
beside the planning spec: a plan names it, and loading a plan then does not load the planning
and workload models (about 0.3 s of a simulation's imports).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fleetwise.spec.base import Spec
from fleetwise.spec.limits import MAX_DURATION_S


class SLOSpec(Spec):
    """Latency targets per request; a request meets the SLO when it completes and meets every set target."""

    ttft_max_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)
    """Longest acceptable time to first token (arrival to first output token)."""
    tpot_max_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)
    """Longest acceptable mean time per output token after the first."""
    e2e_max_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)
    """Longest acceptable end-to-end latency (arrival to last token)."""

    def met(self, ttft_s: float, tpot_s: float, e2e_s: float) -> bool:
        """Whether one completed request meets every set target; a NaN `tpot_s` (a one-token
        output has no TPOT) meets any TPOT target."""
        return (
            (self.ttft_max_s is None or ttft_s <= self.ttft_max_s)
            and (self.tpot_max_s is None or not tpot_s > self.tpot_max_s)
            and (self.e2e_max_s is None or e2e_s <= self.e2e_max_s)
        )


class PlanSLOSpec(Spec):
    """Service-level objectives: latency targets at a percentile and the attainment required."""

    ttft_s: float = Field(gt=0)
    """Time-to-first-token target, seconds, at `percentile`."""
    tpot_s: float = Field(gt=0)
    """Time-per-output-token target (after the first token), seconds, at `percentile`."""
    percentile: Literal[50, 90, 99] = 90
    """Percentile at which the targets apply (90 means p90 TTFT <= ttft_s and p90 TPOT <= tpot_s)."""
    attainment: float = Field(default=0.9, gt=0, le=1)
    """Fraction of requests that must meet both targets."""
