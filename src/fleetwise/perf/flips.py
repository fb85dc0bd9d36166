"""Decisions at the ends of the uncertainty band: would a choice made on predicted step times change
if the steps ran at the fast or at the slow end of their bands?

Owns `Flip` (a decision's outcome at the predicted times and at each end of the band), the scale a
band puts on a predicted time (`band_scales`) and `decide_at_band_ends`, which re-runs any decision
rule with every step time scaled to one end of its own band. The rule is the caller's (the planner's
fit, TP, disaggregation and P:D choices); this module only knows bands. Does not price steps (see
`roofline`) or build bands (see `uncertainty`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fleetwise.perf.uncertainty import Band

K = TypeVar("K", bound=Hashable)

Scale = Callable[[Any], float]
"""Multiplier of a predicted step time by key (1.0 at the prediction, the band's end otherwise)."""


@dataclass(frozen=True, slots=True)
class Flip:
    """One decision's outcome at the predicted step times and at the fast and slow ends of their bands."""

    decision: str
    chosen: str
    fast: str
    slow: str
    basis: str = ""
    """How the decision was re-made at the ends (what was scaled), in plain words."""

    @property
    def flips(self) -> bool:
        """Whether the outcome differs at either end of the band."""
        return self.fast != self.chosen or self.slow != self.chosen

    def as_dict(self) -> dict[str, Any]:
        """`{decision, chosen, at_fast_end, at_slow_end, flips, basis}`."""
        return {"decision": self.decision, "chosen": self.chosen, "at_fast_end": self.fast,
                "at_slow_end": self.slow, "flips": self.flips, "basis": self.basis}

    def text(self) -> str:
        """One clause: the outcome, and whether it holds across the band."""
        if not self.flips:
            return f"{self.decision}: {self.chosen} at both ends of the band"
        return (f"{self.decision}: {self.chosen}, but {self.fast} at the band's fast end and {self.slow} at its "
                "slow end: this decision could flip")


def band_scales(b: Band) -> tuple[float, float]:
    """(fast end, slow end) of `b` as multipliers of its predicted time; (1, 1) for an empty band."""
    if b.mid_s <= 0 or b.points == 0:
        return 1.0, 1.0
    return b.low_s / b.mid_s, b.high_s / b.mid_s


def decide_at_band_ends(decision: str, choose: Callable[[Scale], str], bands: Mapping[K, Band],
                        basis: str = "") -> Flip:
    """`choose(scale)` is a decision rule that multiplies each predicted step time keyed `k` by
    `scale(k)`; it is run at the predictions (scale 1), with every time at the fast end of its own band,
    and with every time at the slow end. Keys missing from `bands` keep scale 1."""
    ends = {k: band_scales(b) for k, b in bands.items()}
    chosen = choose(lambda k: 1.0)
    fast = choose(lambda k: ends[k][0] if k in ends else 1.0)
    slow = choose(lambda k: ends[k][1] if k in ends else 1.0)
    return Flip(decision, chosen, fast, slow, basis)
