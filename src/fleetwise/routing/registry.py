"""Build a routing policy from a `RoutingSpec` or a preset name.

The presets themselves are data in `fleetwise.spec.routing.PRESETS` (so plan files validate at
the edge); this module turns them into policy objects.
"""

from __future__ import annotations

from fleetwise.routing.base import RoutingPolicy
from fleetwise.routing.policy import ComposedPolicy
from fleetwise.spec.routing import DEFAULT_POLICY, PRESETS, RoutingSpec

__all__ = ["DEFAULT_POLICY", "make_policy", "policy_names"]


def policy_names() -> list[str]:
    """Every preset name, the default first."""
    return [DEFAULT_POLICY, *sorted(n for n in PRESETS if n != DEFAULT_POLICY)]


def make_policy(spec: RoutingSpec | str, seed: int = 0) -> RoutingPolicy:
    """A fresh policy object. `spec` is a `RoutingSpec` or a preset name; `seed` drives every
    random choice the policy makes (tie-breaks, random and power-of-two pickers)."""
    if isinstance(spec, str):
        spec = RoutingSpec(policy=spec)
    return ComposedPolicy(spec.policy, spec.resolved(), spec.safe_mode, seed=seed)
