"""Measured expert load: per-layer expert token counts turned into the expert-parallel imbalance.

Owns reading an expert-load histogram (the per-layer, per-expert routed token counts an engine
records, such as vLLM's expert-parallel load balancer's `expert_load_pass` / `expert_load_window`,
or any JSON of counts) and the imbalance it implies for an EP degree: the busiest rank's routed
rows over the mean, which scales the routed-expert work and the all-to-all volume of the busiest
rank (`Deployment.expert_load_imbalance`, see `roofline`). Does not price anything.

Accepted JSON (counts are non-negative numbers):
- `[c0, c1, ...]`: one layer's counts per expert;
- `[[...], [...], ...]`: one row per MoE layer;
- `[[[...], ...], ...]`: a window of passes, each layers x experts (summed over the window);
- an object holding one of those under `expert_load_window`, `expert_load_pass`, `expert_load`,
  `counts` or `layers` (an object `{layer: counts}` is also read as one row per layer).

Placement: rank r of `ep` holds experts [r*E/ep, (r+1)*E/ep), the contiguous placement an engine
uses without rebalancing. The imbalance over a step is sum over layers of the busiest rank's
rows over the sum of the mean rank's rows: every layer waits for its busiest rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.spec.base import read_document

LOAD_KEYS = ("expert_load_window", "expert_load_pass", "expert_load", "counts", "layers")
"""Keys under which an object holds the counts, in the order they are looked for."""
ASSUMED_IMBALANCE_NOTE = "assumed, not measured: set moe.expert_load to a per-layer expert token-count JSON"
"""How a plan states an imbalance that no measured histogram supports."""


@dataclass(frozen=True)
class ExpertLoad:
    """Routed token counts: one tuple of per-expert counts per MoE layer (layers with no load dropped)."""

    layers: tuple[tuple[float, ...], ...]
    source: str = ""

    @property
    def experts(self) -> int:
        """Experts per layer in the histogram."""
        return len(self.layers[0])

    def rank_imbalance(self, ep: int) -> float:
        """Busiest rank's routed rows over the mean rank's, summed over layers, for `ep` ranks (1.0 at ep=1)."""
        if ep <= 1:
            return 1.0
        if self.experts % ep:
            raise SpecError(f"{self.source}: {self.experts} experts per layer do not split over ep={ep} ranks; "
                            f"use an ep that divides {self.experts}")
        per = self.experts // ep
        busiest = mean = 0.0
        for counts in self.layers:
            ranks = [sum(counts[r * per:(r + 1) * per]) for r in range(ep)]
            busiest += max(ranks)
            mean += sum(ranks) / ep
        return busiest / mean

    def expert_imbalance(self) -> float:
        """Busiest expert's routed rows over the mean expert's, summed over layers (the skew at ep = experts)."""
        return self.rank_imbalance(self.experts)


def _rows(doc: Any, where: str) -> list[list[Any]]:
    """The counts of a document as layers x experts (a window summed)."""
    if isinstance(doc, dict):
        key = next((k for k in LOAD_KEYS if k in doc), None)
        if key is None:
            raise SpecError(f"{where}: no expert counts found; expected a list of counts or an object with one of "
                            f"{', '.join(LOAD_KEYS)}")
        doc = doc[key]
        where = f"{where}: {key}"
        if isinstance(doc, dict):
            doc = [doc[k] for k in sorted(doc, key=lambda k: (len(str(k)), str(k)))]
    if not isinstance(doc, list) or not doc:
        raise SpecError(f"{where}: expected a non-empty list of expert counts, got {type(doc).__name__}")
    if not isinstance(doc[0], list):
        return [doc]
    if doc[0] and isinstance(doc[0][0], list):  # a window: passes x layers x experts
        passes = [_rows(p, f"{where}[{i}]") for i, p in enumerate(doc)]
        shape = (len(passes[0]), len(passes[0][0]))
        if any((len(p), len(p[0])) != shape for p in passes):
            raise SpecError(f"{where}: every pass of the window must be {shape[0]} layers x {shape[1]} experts")
        return [[sum(_count(p[layer][e], f"{where}[{i}][{layer}][{e}]") for i, p in enumerate(passes))
                 for e in range(shape[1])] for layer in range(shape[0])]
    return doc


def _count(value: Any, where: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise SpecError(f"{where}: expected a token count (a non-negative number), got {value!r}; fix the histogram")
    return float(value)


def parse_expert_load(doc: Any, where: str) -> ExpertLoad:
    """The `ExpertLoad` of a JSON document (SpecError naming the place of the first bad value)."""
    rows = _rows(doc, where)
    width = len(rows[0]) if isinstance(rows[0], list) else 0
    layers: list[tuple[float, ...]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != width or width == 0:
            raise SpecError(f"{where}: layer {i} has {len(row) if isinstance(row, list) else 'no'} expert counts, "
                            f"expected {width or 'at least one'} like layer 0")
        counts = tuple(_count(v, f"{where}: layer {i}, expert {e}") for e, v in enumerate(row))
        if sum(counts) > 0:
            layers.append(counts)
    if not layers:
        raise SpecError(f"{where}: every layer's counts are zero; record the load while the engine serves traffic")
    return ExpertLoad(tuple(layers), where)


@lru_cache(maxsize=32)
def load_expert_load(path: str) -> ExpertLoad:
    """Read an expert-load histogram file (cached per path: plans ask it once per layout)."""
    return parse_expert_load(read_document(Path(path)), path)


def planned_imbalance(assumed: float, load_path: str | None, ep: int, experts: int | None = None) -> float:
    """Busiest EP rank's routed rows over the mean for `ep` ranks: from the measured histogram at `load_path`
    when one is given (it must count at least the model's `experts` per layer), else `assumed`."""
    if load_path is None:
        return assumed
    load = load_expert_load(load_path)
    if experts is not None and load.experts < experts:
        raise SpecError(f"moe.expert_load: {load_path} counts {load.experts} experts per layer, the model has "
                        f"{experts}; record the histogram from this model")
    return load.rank_imbalance(ep)
