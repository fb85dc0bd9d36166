"""L5: an emulated engine server that speaks vLLM (`fleetwise emulate`).

Owns the wall-clock driver of one engine replica (`replica`), vLLM's HTTP interface (`app`,
`protocol`; the request parser is `fleetwise.core.openai_request`, the HTTP server
`fleetwise.live.http`), generated text (`generation`),
Prometheus metrics with vLLM's names (`metrics`), KV events over ZeroMQ as vLLM publishes them
(`kv_events`) and injectable faults
(`faults`). It never imports `fleetwise.sim`: the engine, perf model and specs are shared.
"""
