"""L5: the planner: fit -> latency -> replicas -> disaggregation -> ranked, simulated plans."""
