"""L1: runtime vocabulary shared by engine, routing, sim, planner and the live half.

Seeded rng streams, what a router sees (`FleetView`), what it decides (`RoutingDecision`), what it
hears back (`Feedback`). No clocks, no I/O: time is always passed in as a number of seconds.
"""
