"""What each serving engine calls the figures `calibrate --from-metrics` reads: one registered mapping per engine.

A figure has one name across fleetwise (the field); each engine's module in this package maps the
fields to its Prometheus metric names and registers them with `register` (found and imported when
this package loads: a new engine is a new file, no list to edit). `fleetwise.planner.metrics_page`
recognises a page's engine by its metric prefix and reads the fields; the fit
(`fleetwise.planner.measured`) reads only fields, so it is the same for every engine.

Counter fields: `requests` (requests finished), `prompt_tokens`, `generation_tokens`,
`prefix_hits`, `prefix_queries`. Histogram fields (seconds or tokens per finished request unless
said): `prefill` (scheduled to first token), `decode` (first to last token), `queue`, `ttft`
(arrival to first token, observed at the first token), `e2e`, `itl`, `tpot`, `prompt` and `output`
(tokens of each finished request). Where an engine has no `prefill` or `decode` histogram the fit
derives them: `ttft` less `queue`, and `e2e` less `ttft`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass

from fleetwise.registry import Registry


@dataclass(frozen=True)
class EngineMetrics:
    """One engine's names of the fields: counters and histograms by their family name (a
    counter's without `_total`)."""

    key: str
    """Registry key and module name (`vllm`)."""
    engine: str
    """The engine's name in messages (`vLLM`)."""
    prefix: str
    """The prefix every one of its metric names has (`vllm:`): how a page's engine is recognised."""
    counters: Mapping[str, str]
    histograms: Mapping[str, str]
    replica_label: str | None
    """A label whose values are separate engines on one page (data-parallel ranks, each a replica), if any."""
    hint: str
    """Where such a page comes from, for messages."""
    shared_rank_label: str | None = None
    """A label some series carry (the schedulers') whose values count data-parallel ranks that the
    request metrics add up: the page is that many replicas, each an equal share."""


METRIC_NAMES: Registry[str, EngineMetrics] = Registry("engine metric names")
"""Engine key -> its names, in module-name order."""


def register(names: EngineMetrics) -> EngineMetrics:
    """Register an engine's metric names under its key (once)."""
    return METRIC_NAMES.add(names.key, names)


for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
