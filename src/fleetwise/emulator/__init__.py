"""L5: an emulated engine server that speaks vLLM (`fleetwise emulate`).

Owns the wall-clock driver of one engine replica (`replica`), vLLM's HTTP interface (`app`,
`protocol`), the lean HTTP/1.1 server it is served on (`server`), a deterministic local tokenizer and generated text (`tokenizer`, `generation`),
Prometheus metrics with vLLM's names (`metrics`), KV events (`kv_events`) and injectable faults
(`faults`). It never imports `fleetwise.sim`: the engine, perf model and specs are shared.
"""
