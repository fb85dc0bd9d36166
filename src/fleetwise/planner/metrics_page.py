"""A replica's Prometheus metrics page (or saved dump) read into the fields the fit uses.

Recognises the page's engine by the prefix most of its families carry (one registered entry per
engine in `fleetwise.spec.engine_metrics`, among those with calibration names), sums each field's
series over their labels, splits an engine's data-parallel ranks (its `replica_label`) into one
replica each, or, where the request metrics add the ranks up (its `shared_rank_label`), into that
many equal shares, and differences two scrapes of the same replica. Unknown metrics are ignored; a
field's value that is not a finite count, a counter that fell or a process start time that moved
between two scrapes, and a page with no engine's request metrics are refused with the source, the
metric and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.spec.engine_metrics import METRIC_NAMES, TIME_SCALE_METRIC, EngineMetrics

PROCESS_START = "process_start_time_seconds"
"""Prometheus' process collector's start time of the serving process (vLLM's default registry exports it)."""


@dataclass
class Histo:
    """One histogram's count, sum and cumulative buckets (upper bound -> count), summed over series."""

    count: float = 0.0
    total: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)

    def __add__(self, other: Histo) -> Histo:
        keys = set(self.buckets) | set(other.buckets)
        return Histo(self.count + other.count, self.total + other.total,
                     {le: self.buckets.get(le, 0.0) + other.buckets.get(le, 0.0) for le in keys})

    def minus(self, other: Histo) -> Histo:
        """This histogram's growth since `other` (an earlier scrape)."""
        return Histo(self.count - other.count, self.total - other.total,
                     {le: n - other.buckets.get(le, 0.0) for le, n in self.buckets.items()})

    @property
    def mean(self) -> float | None:
        """Mean observation (None when nothing was observed)."""
        return self.total / self.count if self.count > 0 else None


@dataclass
class ReplicaMetrics:
    """What one replica's metrics say over the measured span (each field summed over its series)."""

    source: str
    names: EngineMetrics
    """The engine whose names the page has."""
    rank: str = ""
    """The value of the engine's `replica_label` this replica's series carry ("" when none)."""
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histo] = field(default_factory=dict)
    span_s: float | None = None
    """Seconds between the two scrapes whose difference this is (None: totals since start)."""
    started_s: float | None = None
    """The page's `process_start_time_seconds` (Prometheus' process collector), when it has one."""
    time_scale: float | None = None
    """An emulated replica's modelled seconds per wall second (its page's `TIME_SCALE_METRIC`; None elsewhere)."""

    def minus(self, earlier: ReplicaMetrics, span_s: float) -> ReplicaMetrics:
        """The growth since an `earlier` scrape of the same replica, `span_s` seconds before;
        SpecError naming a counter that fell (the replica restarted in between)."""
        names = self.names
        if None not in (self.started_s, earlier.started_s) and self.started_s != earlier.started_s:
            raise SpecError(f"{self.source}: {PROCESS_START} moved from {earlier.started_s:.0f} to {self.started_s:.0f} "
                            "between the two scrapes (the replica restarted); measure again over a span without a restart")
        pairs = [(names.counters[k] + "_total", earlier.counters.get(k, 0.0), v) for k, v in self.counters.items()]
        for k, h in self.histograms.items():
            e = earlier.histograms.get(k, Histo())
            pairs += [(names.histograms[k] + "_count", e.count, h.count), (names.histograms[k] + "_sum", e.total, h.total)]
        for name, a, b in pairs:
            if b < a:
                raise SpecError(f"{self.source}: {name} fell from {a:g} to {b:g} between the two scrapes (the replica "
                                "restarted?); measure again over a span without a restart")
        return ReplicaMetrics(self.source, names, self.rank,
                              {k: v - earlier.counters.get(k, 0.0) for k, v in self.counters.items()},
                              {k: h.minus(earlier.histograms.get(k, Histo())) for k, h in self.histograms.items()},
                              span_s, self.started_s, self.time_scale)

    def counter(self, name: str) -> float:
        """A counter's value (0 when the replica does not export it)."""
        return self.counters.get(name, 0.0)

    def histo(self, name: str) -> Histo:
        """A histogram (empty when absent)."""
        return self.histograms.get(name, Histo())


def _families(text: str, source: str) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except ValueError as err:
        first = (str(err).splitlines() or [""])[0][:80]
        raise SpecError(f"{source}: not Prometheus text format ({first}); give a /metrics URL or a saved dump") from None


def _engine(families: list[Any], source: str) -> EngineMetrics:
    """The registered engine with calibration names whose prefix most families carry; SpecError
    listing the known ones."""
    engines = [n for n in METRIC_NAMES.values() if "requests" in n.counters]
    hits = [sum(f.name.startswith(n.prefix) for f in families) for n in engines]
    best = max(range(len(engines)), key=lambda i: hits[i])
    if hits[best] == 0:
        known = "; ".join(f"{n.engine}: {n.counters['requests']}_total" for n in engines)
        raise SpecError(f"{source}: no request metrics of a known engine ({known}); point at one replica's /metrics")
    return engines[best]


def growth(after: list[ReplicaMetrics], before: list[ReplicaMetrics], span_s: float) -> list[ReplicaMetrics]:
    """Each replica of a page's growth since the same replica's (rank's) earlier scrape, `span_s` before."""
    earlier = {m.rank: m for m in before}
    return [m.minus(earlier.get(m.rank) or ReplicaMetrics(m.source, m.names, m.rank), span_s) for m in after]


def parse_page(text: str, source: str) -> list[ReplicaMetrics]:
    """The replicas of one metrics page: one, or one per data-parallel rank of the engine
    (`source engine=N`); SpecError naming the source when it is no known engine's page."""
    families = _families(text, source)
    names = _engine(families, source)
    by_counter = {v: k for k, v in names.counters.items()}
    by_histo = {v: k for k, v in names.histograms.items()}
    reps: dict[str, ReplicaMetrics] = {}
    started = next((s.value for f in families if f.name == PROCESS_START for s in f.samples), None)
    scale = next((s.value for f in families if f.name == TIME_SCALE_METRIC for s in f.samples), None)
    for fam in families:
        counter = by_counter.get(fam.name) or by_counter.get(fam.name.removesuffix("_total"))
        histo = by_histo.get(fam.name)
        if counter is None and histo is None:
            continue
        _check_values(fam.samples, source)
        for s in fam.samples:
            rank = s.labels.get(names.replica_label, "") if names.replica_label else ""
            m = reps.setdefault(rank, ReplicaMetrics(source, names, rank))
            if counter is not None and s.name.endswith("_total"):  # `# TYPE x counter` or `x_total counter`
                m.counters[counter] = m.counters.get(counter, 0.0) + s.value
            elif histo is not None:
                _add_sample(m.histograms.setdefault(histo, Histo()), s)
    if len(reps) > 1:
        for rank, m in reps.items():
            m.source = f"{source} {names.replica_label}={rank}"
    out = [reps[k] for k in sorted(reps, key=lambda k: (len(k), k))] or [ReplicaMetrics(source, names)]
    shared = sorted({s.labels[names.shared_rank_label] for f in families for s in f.samples
                     if names.shared_rank_label in s.labels}, key=lambda k: (len(k), k)) if names.shared_rank_label else []
    if len(shared) > 1 and len(out) == 1:
        out = [_share(out[0], f"{source} {names.shared_rank_label}={rank}", rank, len(shared)) for rank in shared]
    for m in out:
        m.started_s, m.time_scale = started, scale
        _check_requests(m)
    return out


def _share(m: ReplicaMetrics, source: str, rank: str, n: int) -> ReplicaMetrics:
    """One of `n` data-parallel ranks whose request metrics `m` adds up: an equal share of each."""
    return ReplicaMetrics(source, m.names, rank, {k: v / n for k, v in m.counters.items()},
                          {k: Histo(h.count / n, h.total / n, {le: c / n for le, c in h.buckets.items()})
                           for k, h in m.histograms.items()})


def _add_sample(h: Histo, s: Any) -> None:
    if s.name.endswith("_count"):
        h.count += s.value
    elif s.name.endswith("_sum"):
        h.total += s.value
    elif s.name.endswith("_bucket"):
        le = float(s.labels["le"])
        h.buckets[le] = h.buckets.get(le, 0.0) + s.value


def _check_requests(m: ReplicaMetrics) -> None:
    """SpecError when a replica's page has request histograms with observations but no finished-requests
    counter (a partial dump); without either it is an idle replica (an engine creates series on first use)."""
    if "requests" in m.counters:
        return
    seen = [(k, h.count) for k, h in m.histograms.items() if h.count > 0]
    if seen:
        k, n = seen[0]
        raise SpecError(f"{m.source}: no {m.names.counters['requests']}_total while {m.names.histograms[k]} counted "
                        f"{n:g}; scrape or save the whole /metrics page of {m.names.hint}")
    m.counters["requests"] = 0.0


def _check_values(samples: Iterable[Any], source: str) -> None:
    """SpecError naming the first sample of a counter or histogram that is not a finite count >= 0."""
    for x in samples:
        if not (math.isfinite(x.value) and x.value >= 0):
            raise SpecError(f"{source}: {x.name} is {x.value:g}; counters and histograms are finite and never "
                            "negative: check the metrics come from a vLLM, SGLang or `fleetwise emulate` replica")
