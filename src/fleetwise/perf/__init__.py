"""L2: the performance model: step costs, memory fit, KV transfer. Pure functions of specs."""
