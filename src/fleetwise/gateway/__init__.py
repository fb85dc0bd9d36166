"""L5: the live gateway: fleetwise's routing policies in front of OpenAI-compatible engines.

Owns the HTTP front (completions, chat, models, health, readiness, metrics, admin), the backend
registry with health checks, circuit breakers and scraped load, the upstream client, tenant
limits, P/D orchestration with vLLM's `kv_transfer_params` protocol, retries before the first
byte, stall detection and active probes, `Idempotency-Key` replays, and the ledger's outage
behaviour seen from the front (readiness, metrics). `Gateway` is assembled from one module per
stage of a request's path (see `gateway.app`). Routing itself is `fleetwise.routing` (the same policy objects as the simulator);
this package never imports `fleetwise.sim`.
"""

from fleetwise.gateway.app import Gateway
from fleetwise.gateway.config import BackendSpec, GatewayConfig
from fleetwise.gateway.server import serve

__all__ = ["BackendSpec", "Gateway", "GatewayConfig", "serve"]
