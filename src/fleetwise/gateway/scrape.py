"""Engine load from a Prometheus `/metrics` page: the live load signals of every registered engine
(`fleetwise.spec.engine_metrics`: vLLM, SGLang, llama.cpp's server) mapped onto the fields of a
`WorkerView`.

One table (`ALIASES`, built from the registry) says which exposed sample feeds which field; the
first name present wins, so a backend that exports several generations of names is read once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from fleetwise.spec.engine_metrics import METRIC_NAMES, EngineMetrics

__all__ = ["ALIASES", "BadSample", "EngineLoad", "MAX_REQUEST_COUNT", "SAMPLES", "aliases", "parse_metrics"]

SAMPLES: dict[str, tuple[str, str]] = {
    "running": ("running", ""), "waiting": ("waiting", ""), "kv_usage": ("kv_usage", ""),
    "prefix_queries": ("prefix_queries", "_total"), "prefix_hits": ("prefix_hits", "_total"),
    "prefix_hit_rate": ("prefix_hit_rate", ""),
    "ttft_sum": ("ttft", "_sum"), "ttft_count": ("ttft", "_count"),
    "itl_sum": ("itl", "_sum"), "itl_count": ("itl", "_count"),
    "kv_xfer_sum": ("kv_xfer", "_sum"), "kv_xfer_count": ("kv_xfer", "_count"),
    "kv_bytes_sum": ("kv_bytes", "_sum"),
}
"""WorkerView-side field -> (the registry's live field, the sample's suffix): a gauge's value, a
counter's `_total`, a histogram's `_sum` or `_count`."""


def aliases(engines: Iterable[EngineMetrics]) -> dict[str, tuple[str, ...]]:
    """WorkerView-side field -> the exposed sample names of `engines`, preferred first: engines by
    their `precedence` (whatever order they come in), each engine's newest generation first."""
    ranked = sorted(engines, key=lambda e: (e.precedence, e.key))
    table = {f: tuple(name + suffix for e in ranked for name in e.live.get(live, ()))
             for f, (live, suffix) in SAMPLES.items()}
    return {f: names for f, names in table.items() if names}


ALIASES = aliases(METRIC_NAMES.values())
"""WorkerView-side field -> exposed metric names, preferred first."""

_WANTED = {name: field for field, names in ALIASES.items() for name in names}

MAX_REQUEST_COUNT = 10_000_000
"""Most requests a page may say an engine runs or queues: vLLM's `max_num_seqs` is at most a few
thousand and its waiting queue is bounded by memory, so a count above ten million is a broken
exporter, not load."""
FRACTIONS = ("kv_usage", "prefix_hit_rate")
"""Fields that are fractions (0..1): vLLM's `kv_cache_usage_perc` is a fraction despite its name."""


class BadSample(ValueError):
    """A /metrics page holding numbers no engine can report (NaN, infinite, a negative count, a
    fraction above 1): the whole sample is rejected, so it never steers routing."""


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One scrape, summed over label sets (an engine serving several model names, data-parallel
    engine indices); fractions are their mean."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    """Fraction of KV cache in use, 0..1."""
    prefix_hit_rate: float | None = None
    """Cumulative prefix-cache hit rate (hits / queries), None when not exported."""
    ttft_mean_s: float | None = None
    """Mean time to first token over the engine's lifetime, None when not exported."""
    itl_mean_s: float | None = None
    """Mean inter-token latency over the engine's lifetime, None when not exported."""
    kv_xfer_s_total: float = 0.0
    """Seconds of KV transfers the engine has received (vLLM's `nixl_xfer_time_seconds_sum`)."""
    kv_xfer_count: float = 0.0
    """KV transfers the engine has received (`nixl_xfer_time_seconds_count`)."""
    kv_xfer_bytes_total: float = 0.0
    """Bytes of those transfers (`nixl_bytes_transferred_sum`)."""
    names_seen: int = 0
    """How many of the known metric names the page had (0: not a page we understand)."""


def parse_metrics(text: str) -> EngineLoad:
    """The engine load on a Prometheus text page (unknown lines ignored); BadSample naming the
    metric and its value when a known one is NaN, infinite or out of its range."""
    found: dict[str, dict[str, float]] = {}
    seen: dict[str, int] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        cut = line.find("{")
        name = line[:cut] if cut >= 0 else line.split(" ", 1)[0]
        field = _WANTED.get(name)
        if field is None:
            continue
        try:
            value = float(line.rsplit("}", 1)[-1].split()[0] if cut >= 0 else line.split()[1])
        except (ValueError, IndexError):
            continue
        if not math.isfinite(value) or value < 0:
            raise BadSample(f"{name} is {value}")
        if value > 1 and field in FRACTIONS:
            raise BadSample(f"{name} is {value:g}, above 1")
        per = found.setdefault(field, {})
        per[name] = per.get(name, 0.0) + value
        seen[name] = seen.get(name, 0) + 1
    vals: dict[str, float] = {}
    for field, names in ALIASES.items():
        got = found.get(field)
        if got:
            name = next(n for n in names if n in got)
            vals[field] = got[name] / seen[name] if field in FRACTIONS else got[name]
    if "prefix_queries" in vals and vals["prefix_queries"] > 0:
        vals["prefix_hit_rate"] = vals.get("prefix_hits", 0.0) / vals["prefix_queries"]
    _check(vals)
    return EngineLoad(
        running=int(vals.get("running", 0)),
        waiting=int(vals.get("waiting", 0)),
        kv_usage=vals.get("kv_usage", 0.0),
        prefix_hit_rate=vals.get("prefix_hit_rate"),
        ttft_mean_s=_mean(vals, "ttft"),
        itl_mean_s=_mean(vals, "itl"),
        kv_xfer_s_total=vals.get("kv_xfer_sum", 0.0),
        kv_xfer_count=vals.get("kv_xfer_count", 0.0),
        kv_xfer_bytes_total=vals.get("kv_bytes_sum", 0.0),
        names_seen=sum(len(p) for p in found.values()),
    )


def _check(vals: dict[str, float]) -> None:
    """BadSample for counts beyond any engine and more prefix hits than queries (after summing label sets)."""
    for field in ("running", "waiting"):
        if vals.get(field, 0.0) > MAX_REQUEST_COUNT:
            raise BadSample(f"{field} is {vals[field]:g}, above {MAX_REQUEST_COUNT:,} requests")
    if vals.get("prefix_hit_rate", 0.0) > 1.0:
        raise BadSample(f"prefix hits / queries is {vals['prefix_hit_rate']:g}, above 1")


def _mean(vals: dict[str, float], key: str) -> float | None:
    n = vals.get(f"{key}_count", 0.0)
    return vals[f"{key}_sum"] / n if n > 0 and f"{key}_sum" in vals else None
