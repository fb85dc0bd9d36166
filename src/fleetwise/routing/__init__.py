"""L3: routing policies (filters -> scorers -> picker), pure and synchronous.

`make_policy(spec_or_preset, seed)` builds one; `policy_names()` lists the presets;
`DEFAULT_POLICY` names the default.
"""

from fleetwise.routing.base import RoutingPolicy
from fleetwise.routing.registry import DEFAULT_POLICY, make_policy, policy_names

__all__ = ["DEFAULT_POLICY", "RoutingPolicy", "make_policy", "policy_names"]
