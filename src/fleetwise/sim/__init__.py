"""L4: discrete-event fleet simulator driving engines, KV links, routing and faults in virtual time.

Entry point: `simulate(plan, requests, faults=None, options=SimOptions()) -> SimResult`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import fleetwise.engine  # noqa: F401  (first: it decides whether compiled modules or sources load)

if TYPE_CHECKING:
    from fleetwise.sim.runner import SimOptions, SimResult, simulate

__all__ = ["SimOptions", "SimResult", "simulate"]


def __getattr__(name: str) -> Any:
    # Lazy: importing one module of the simulator must not pull the whole runner.
    if name in __all__:
        from fleetwise.sim import runner

        return getattr(runner, name)
    raise AttributeError(name)
