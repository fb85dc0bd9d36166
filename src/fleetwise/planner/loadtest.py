"""Effective goodput from a measurement: a load test of one real replica, read from its JSON.

Owns reading the result files of aiperf (`profile_export_aiperf.json`: top-level metric blocks
with `unit`, `avg`, `p50`/`p90`/`p99`), guidellm (`benchmarks[].metrics.<metric>.successful`
with `mean` and `percentiles`, one entry per rate of a sweep) and fleetwise's own load test or
simulation summary (`ttft_s`/`tpot_s` percentile blocks in seconds, rate from
`throughput.requests_per_s` or given in the spec), and turning the points into one number: the
highest measured request rate whose TTFT and TPOT at the SLO percentile meet the targets (0 when
none does). TPOT is the inter-token latency after the first token (aiperf's and guidellm's
`inter_token_latency`). Does not decide where the number is used (the goodput phase does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.spec.base import read_document
from fleetwise.spec.planning import MeasuredThroughput, PlanSLOSpec

MS = 1e-3


@dataclass(frozen=True)
class MeasuredPoint:
    """One load level of a test: achieved request rate and latency percentiles in seconds."""

    rate_rps: float
    ttft_s: dict[str, float]
    tpot_s: dict[str, float]


@dataclass(frozen=True)
class Measurement:
    """What a result file says, and the goodput it gives under an SLO."""

    source: str
    tool: str
    points: list[MeasuredPoint]

    def goodput_rps(self, slo: PlanSLOSpec, role: str = "mixed") -> float:
        """Highest measured rate meeting the targets at the SLO percentile (0.0 when none); a
        prefill replica is judged on TTFT only, as in simulation."""
        k = f"p{slo.percentile}"
        ok = [p.rate_rps for p in self.points if p.ttft_s.get(k, math.inf) <= slo.ttft_s
              and (role == "prefill" or p.tpot_s.get(k, math.inf) <= slo.tpot_s)]
        return max(ok, default=0.0)

    def describe(self, slo: PlanSLOSpec) -> str:
        k = f"p{slo.percentile}"
        pts = "; ".join(f"{p.rate_rps:.2f} req/s: TTFT {k} {p.ttft_s.get(k, math.nan) * 1e3:.0f} ms, TPOT {k} "
                        f"{p.tpot_s.get(k, math.nan) * 1e3:.1f} ms" for p in self.points)
        return f"{self.tool} result {self.source} ({pts})"


def _pcts(block: Any, scale: float) -> dict[str, float]:
    if not isinstance(block, dict):
        return {}
    return {k: float(block[k]) * scale for k in ("p50", "p90", "p99") if isinstance(block.get(k), int | float)}


def _aiperf(doc: dict[str, Any]) -> list[MeasuredPoint]:
    def scale(block: Any) -> float:
        unit = str(block.get("unit", "ms")) if isinstance(block, dict) else "ms"
        return {"ms": MS, "s": 1.0, "sec": 1.0, "us": 1e-6, "ns": 1e-9}.get(unit, MS)

    tp = doc["request_throughput"]
    ttft, itl = doc.get("time_to_first_token", {}), doc.get("inter_token_latency", {})
    return [MeasuredPoint(float(tp["avg"]), _pcts(ttft, scale(ttft)), _pcts(itl, scale(itl)))]


def _guidellm(doc: dict[str, Any]) -> list[MeasuredPoint]:
    out = []
    for b in doc["benchmarks"]:
        m = b["metrics"]
        rate = float(m["requests_per_second"]["successful"]["mean"])
        ttft = m["time_to_first_token_ms"]["successful"]["percentiles"]
        itl = m["inter_token_latency_ms"]["successful"]["percentiles"]
        out.append(MeasuredPoint(rate, _pcts(ttft, MS), _pcts(itl, MS)))
    return out


def _fleetwise(doc: dict[str, Any], rate: float | None) -> list[MeasuredPoint]:
    thr = doc.get("throughput") or {}
    r = rate if rate is not None else thr.get("requests_per_s")
    if r is None:
        raise KeyError("rate_rps")
    return [MeasuredPoint(float(r), _pcts(doc["ttft_s"], 1.0), _pcts(doc["tpot_s"], 1.0))]


def load_measurement(m: MeasuredThroughput, where: str) -> Measurement:
    """Read one result file (SpecError naming the field when it is unreadable or incomplete)."""
    doc = read_document(m.path)
    if not isinstance(doc, dict):
        raise SpecError(f"{where}.path: {m.path} is not a JSON object; give an aiperf, guidellm or fleetwise result")
    try:
        if "request_throughput" in doc:
            return Measurement(m.path, "aiperf", _aiperf(doc))
        if "benchmarks" in doc:
            return Measurement(m.path, "guidellm", _guidellm(doc))
        if "ttft_s" in doc and "tpot_s" in doc:
            return Measurement(m.path, "fleetwise load test", _fleetwise(doc, m.rate_rps))
    except KeyError as err:
        if err.args == ("rate_rps",):
            raise SpecError(f"{where}.rate_rps: {m.path} does not record the offered rate; set rate_rps to the "
                            "test's request rate") from None
        raise SpecError(f"{where}.path: {m.path} lacks {err}; expected a complete aiperf/guidellm result") from None
    raise SpecError(f"{where}.path: {m.path} is not a known load-test result (no `request_throughput` (aiperf), "
                    "`benchmarks` (guidellm) or `ttft_s`/`tpot_s` (fleetwise))")
