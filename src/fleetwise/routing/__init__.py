"""L3: routing policies (filters -> scorers -> picker), pure and synchronous.

`make_policy(spec_or_preset, seed)` builds one; `policy_names()` lists the presets;
`DEFAULT_POLICY` names the default.
"""

from fleetwise.core.compiled import install as _install_compiled

_install_compiled()  # before any routing module loads: compiled or source (fleetwise.core.compiled)

from fleetwise.routing.base import RoutingPolicy  # noqa: E402
from fleetwise.routing.registry import DEFAULT_POLICY, make_policy, policy_names  # noqa: E402

__all__ = ["DEFAULT_POLICY", "RoutingPolicy", "make_policy", "policy_names"]
