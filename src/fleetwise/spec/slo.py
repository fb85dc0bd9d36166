"""`SLOSpec`: per-request latency targets a request must meet to count toward goodput; `PlanSLOSpec`:
the targets a plan is sized for (at a percentile, with the attainment required).

Owns the thresholds only; the simulator's results (and the gateway's metrics) decide whether a
request met them. A target left unset is not checked. `PlanSLOSpec` lives here rather than
beside the planning spec: a plan names it, and loading a plan then does not load the planning
and workload models (about 0.3 s of a simulation's imports).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from fleetwise.spec.base import Spec
from fleetwise.spec.limits import MAX_DURATION_S

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike, NDArray


class SLOSpec(Spec):
    """Latency targets per request; a request meets the SLO when it completes and meets every set target."""

    ttft_max_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)
    """Longest acceptable time to first token (arrival to first output token)."""
    tpot_max_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)
    """Longest acceptable mean time per output token after the first."""
    e2e_max_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)
    """Longest acceptable end-to-end latency (arrival to last token)."""

    def met(self, ttft_s: ArrayLike, tpot_s: ArrayLike, e2e_s: ArrayLike) -> NDArray[np.bool_]:
        """Whether completed requests meet every set target, element-wise over arrays of seconds
        (one request's three floats give a 0-d array): each figure at or under its target; a NaN
        `tpot_s` (a one-token output has no TPOT) meets any TPOT target, a NaN TTFT or E2E none."""
        import numpy as np  # here, not at import: loading a spec does not load numpy

        ok = np.ones(np.broadcast(ttft_s, tpot_s, e2e_s).shape, dtype=bool)
        if self.ttft_max_s is not None:
            ok &= np.less_equal(ttft_s, self.ttft_max_s)
        if self.tpot_max_s is not None:
            ok &= ~np.greater(tpot_s, self.tpot_max_s)
        if self.e2e_max_s is not None:
            ok &= np.less_equal(e2e_s, self.e2e_max_s)
        return ok


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
