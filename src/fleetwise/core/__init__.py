"""L1: runtime vocabulary shared by engine, routing, sim, planner and the live half.

Seeded rng streams, what a router sees (`FleetView`), what it decides (`RoutingDecision`), what it
hears back (`Feedback`), and the deterministic tokenizer with its chained KV block hashes
(`tokens`), which the emulator serves with and a router matches engine KV events against.
No clocks, no I/O: time is always passed in as a number of seconds.
"""

from fleetwise.core.compiled import install as _install_compiled

_install_compiled()  # before `views` and `feedback` load: compiled or source (fleetwise.core.compiled)
