"""What each serving engine calls its Prometheus metrics: one registered entry per engine.

Owns every engine metric name fleetwise reads or writes, by field: the live load signals the
gateway scrapes (`fleetwise.gateway.scrape`), the counters and per-request histograms
`calibrate --from-metrics` reads (`fleetwise.planner.metrics_page`), and the rest of vLLM's names
`fleetwise emulate` serves (`fleetwise.emulator.metrics`). Each engine's module in this package
registers its entry with `register` (found and imported when this package loads: a new engine is
a new file, no list to edit). Every name is a metric family's: a counter's without `_total`, a
histogram's without `_sum`, `_count` or `_bucket`; readers add the suffix of the sample they read.

Live fields (`LIVE_FIELDS`), each a tuple of names, newest generation first: gauges `running`,
`waiting`, `kv_usage` (fraction 0..1), `prefix_hit_rate` (fraction 0..1); counters
`prefix_queries`, `prefix_hits` (tokens); histograms `ttft`, `itl` (seconds), `kv_xfer` (seconds
per KV transfer received), `kv_bytes` (bytes per KV transfer).

Calibration counter fields (`COUNTER_FIELDS`): `requests` (requests finished), `prompt_tokens`,
`generation_tokens`, `prefix_hits`, `prefix_queries`. Histogram fields (`HISTOGRAM_FIELDS`;
seconds or tokens per finished request unless said): `prefill` (scheduled to first token),
`decode` (first to last token), `queue`, `ttft` (arrival to first token, observed at the first
token), `e2e`, `itl`, `tpot`, `prompt` and `output` (tokens of each finished request). Where an
engine has no `prefill` or `decode` histogram the fit derives them: `ttft` less `queue`, and
`e2e` less `ttft`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetwise.registry import Registry

LIVE_FIELDS = ("running", "waiting", "kv_usage", "prefix_hit_rate", "prefix_queries", "prefix_hits",
               "ttft", "itl", "kv_xfer", "kv_bytes")
"""The live load signals an engine's page may carry (the gateway's view of a worker)."""
COUNTER_FIELDS = ("requests", "prompt_tokens", "generation_tokens", "prefix_hits", "prefix_queries")
"""The counters calibration reads."""
TIME_SCALE_METRIC = "fleetwise:time_scale"
"""Gauge `fleetwise emulate` adds to its vLLM page: the replica's modelled seconds per wall second
(its `--time-scale`), which `calibrate --from-metrics` converts a wall-clock span with."""
HISTOGRAM_FIELDS = ("prefill", "decode", "queue", "ttft", "e2e", "itl", "tpot", "prompt", "output")
"""The per-request histograms calibration reads."""


@dataclass(frozen=True)
class EngineMetrics:
    """One engine's metric family names by field, and how its pages are laid out."""

    key: str
    """Registry key and module name (`vllm`)."""
    engine: str
    """The engine's name in messages (`vLLM`)."""
    prefix: str
    """The prefix every one of its metric names has (`vllm:`): how a page's engine is recognised."""
    precedence: int
    """Where one page has several engines' names for a live field, the lowest precedence's wins
    (vLLM 0, SGLang 1, llama.cpp 2: the order the gateway has always read them in)."""
    live: Mapping[str, tuple[str, ...]]
    """Live field -> its names, newest generation first (an engine exports one of them)."""
    counters: Mapping[str, str]
    """Calibration counter field -> its name (empty: calibration cannot read this engine)."""
    histograms: Mapping[str, str]
    """Calibration histogram field -> its name."""
    replica_label: str | None
    """A label whose values are separate engines on one page (data-parallel ranks, each a replica), if any."""
    hint: str
    """Where such a page comes from, for messages."""
    shared_rank_label: str | None = None
    """A label some series carry (the schedulers') whose values count data-parallel ranks that the
    request metrics add up: the page is that many replicas, each an equal share."""
    unread: Mapping[str, str] = field(default_factory=dict)
    """Other names the engine exports that no reader reads, by field (`fleetwise emulate` serves
    them as the engine does)."""

    def __post_init__(self) -> None:
        for what, fields, known in (("live", self.live, LIVE_FIELDS), ("counter", self.counters, COUNTER_FIELDS),
                                    ("histogram", self.histograms, HISTOGRAM_FIELDS)):
            bad = next((f for f in fields if f not in known), None)
            if bad is not None:
                raise ValueError(f"{self.key} metric names: {what} field {bad!r} is not one of "
                                 f"{', '.join(known)}; use one of those or add it there")
        for name in self.names():
            if not name.startswith(self.prefix):
                raise ValueError(f"{self.key} metric names: {name!r} lacks the engine's prefix {self.prefix!r}; "
                                 "spell it as the engine exports it")

    def newest(self, live_field: str) -> str:
        """The newest of a live field's names (the one a current release exports)."""
        return self.live[live_field][0]

    def names(self) -> list[str]:
        """Every family name of this entry (live ones in field order, newest first), each once."""
        every = [n for names in self.live.values() for n in names]
        every += [*self.counters.values(), *self.histograms.values(), *self.unread.values()]
        return list(dict.fromkeys(every))


METRIC_NAMES: Registry[str, EngineMetrics] = Registry("engine metric names")
"""Engine key -> its names, in module-name order."""


def register(names: EngineMetrics) -> EngineMetrics:
    """Register an engine's metric names under its key (once)."""
    return METRIC_NAMES.add(names.key, names)


for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
