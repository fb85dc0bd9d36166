"""L3: the engine as a clockless state machine (KV block pool, continuous batching, roles)."""
