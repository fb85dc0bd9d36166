"""L2: workloads — what requests arrive, when, and how long they are.

Owns turning a `WorkloadSpec` and a seed into `Request`s (`generate`), and reading request
traces (`traces`: Azure, Mooncake, BurstGPT, length statistics). Below the simulator, so the
simulator, the planner and a live load generator use the same samplers and loaders. No clock,
no engines, no routing.
"""
