"""L2: workloads — what requests arrive, when, and how long they are.

Owns turning a `WorkloadSpec` and a seed into `Request`s (`generate`), the one sampler of each
length distribution and arrival process (`sample`), and reading request traces (`traces`, with
the registered formats in `formats/`: Azure, Mooncake, BurstGPT, length statistics; the shared
column parsers in `parse`; a file's own columns through `columns`). Below the simulator, so the
simulator, the planner and a live load generator use the same samplers and loaders. No clock,
no engines, no routing.
"""
