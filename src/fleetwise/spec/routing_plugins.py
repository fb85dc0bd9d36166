"""`ROUTING_PLUGINS`: the one registry of routing plugins (filters, scorers, pickers, pair scorers).

A plugin is declared here by kind and name with a one-line summary: that is what a plan file
may name, and what `PolicyParams` validation reads. The routing layer (`fleetwise.routing`)
attaches each implementation to its declared name with `@ROUTING_PLUGINS.implements(kind,
name)`, and the policy builder looks implementations up here too, so spec validation and the
policy read one list. Adding a scorer: declare it below, then write one small module in
`fleetwise/routing/` with the decorated function (and import it from `fleetwise.routing.plugins`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from fleetwise.errors import SpecError

PluginKind = Literal["filter", "scorer", "picker", "pair_scorer"]
KINDS: tuple[PluginKind, ...] = ("filter", "scorer", "picker", "pair_scorer")
"""Filters keep workers, scorers rank one side's candidates, pickers choose, pair scorers rank a
prefill->decode pair as a whole (the hand-off between the two profiles of a P/D fleet)."""
F = TypeVar("F", bound=Callable[..., Any])


class PluginRegistry:
    """Declared plugin names per kind (with summaries) and the implementations attached to them."""

    def __init__(self) -> None:
        self._declared: dict[str, dict[str, str]] = {k: {} for k in KINDS}
        self._impl: dict[str, dict[str, Any]] = {k: {} for k in KINDS}

    def declare(self, kind: PluginKind, name: str, summary: str) -> None:
        """Declare plugin `name` of `kind` (what a plan file may name); once per name."""
        if name in self._declared[kind]:
            raise ValueError(f"routing {kind} {name!r} declared twice")
        self._declared[kind][name] = summary

    def names(self, kind: PluginKind) -> tuple[str, ...]:
        """Declared names of `kind`, in declaration order."""
        return tuple(self._declared[kind])

    def summary(self, kind: PluginKind, name: str) -> str:
        """The one-line summary `name` was declared with."""
        return self._declared[kind][name]

    def check(self, kind: PluginKind, name: str) -> str:
        """`name` if declared; else a ValueError naming the closest or the known names."""
        if name in self._declared[kind]:
            return name
        known = list(self._declared[kind])
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(known)}"
        raise ValueError(f"unknown {kind} {name!r}; {hint}")

    def implements(self, kind: PluginKind, name: str) -> Callable[[F], F]:
        """Decorator attaching the implementation of declared plugin `name` (once)."""
        def attach(fn: F) -> F:
            if name not in self._declared[kind]:
                raise ValueError(f"routing {kind} {name!r} is implemented but not declared in fleetwise.spec.routing_plugins")
            if name in self._impl[kind]:
                raise ValueError(f"routing {kind} {name!r} implemented twice")
            self._impl[kind][name] = fn
            return fn
        return attach

    def implementations(self, kind: PluginKind) -> dict[str, Any]:
        """Name -> implementation of every attached plugin of `kind` (the live mapping)."""
        return self._impl[kind]

    def get(self, kind: PluginKind, name: str) -> Any:
        """The implementation of `name`; SpecError when it is declared but nothing attached it."""
        impl = self._impl[kind].get(name)
        if impl is None:
            raise SpecError(f"routing {kind} {name!r} has no implementation (import fleetwise.routing first)")
        return impl

    def missing(self) -> list[str]:
        """`kind:name` of every declared plugin without an implementation."""
        return [f"{k}:{n}" for k in KINDS for n in self._declared[k] if n not in self._impl[k]]


ROUTING_PLUGINS = PluginRegistry()
"""The registry every layer reads; declarations below, implementations in `fleetwise.routing`."""

for _kind, _name, _summary in (
    ("filter", "healthy", "Workers reported healthy and not marked down by feedback."),
    ("filter", "model_version", "Workers serving the request's pinned model version (when pinned)."),
    ("filter", "region", "Workers in the request's region, all of them when none is there (soft)."),
    ("filter", "role", "Mixed workers, or prefill and decode workers when the fleet is disaggregated."),
    ("scorer", "load", "min cost / cost: predicted token-equivalent work ahead plus the request's own."),
    ("scorer", "requests", "(min requests + 1) / (requests + 1): fewest outstanding requests."),
    ("scorer", "prefix", "Fraction of the prompt's hashed blocks the prefix index says are cached."),
    ("scorer", "kv", "KV headroom: 1 - kv_usage."),
    ("scorer", "feedback", "min slowness / slowness from observed latency."),
    ("scorer", "kv_room", "KV fraction a decode worker has left after admitting the request (P/D decode profile)."),
    ("picker", "max", "Highest weighted total; exact ties broken by tie_break (seeded random or LRU)."),
    ("picker", "round_robin", "Next worker after the previous pick, in name order."),
    ("picker", "random", "Seeded uniform choice."),
    ("picker", "power_of_two", "Two seeded samples; the higher total wins (requests when no scorer is weighted)."),
    ("pair_scorer", "handoff", "KV hand-off over the pair's link: (bandwidth / best healthy bandwidth) / (1 + transfers active on it); 1 without a link."),
):
    ROUTING_PLUGINS.declare(_kind, _name, _summary)  # type: ignore[arg-type]
