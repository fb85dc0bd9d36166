"""L5: the live gateway: fleetwise's routing policies in front of OpenAI-compatible engines.

Owns the HTTP front (completions, chat, models, health, readiness, metrics, admin), the backend
registry with health checks, circuit breakers and scraped load, the upstream client, tenant
limits, P/D orchestration with vLLM's `kv_transfer_params` protocol, and retries before the
first byte. Routing itself is `fleetwise.routing` (the same policy objects as the simulator);
this package never imports `fleetwise.sim`.
"""

from fleetwise.gateway.app import Gateway
from fleetwise.gateway.config import BackendSpec, GatewayConfig
from fleetwise.gateway.server import serve

__all__ = ["BackendSpec", "Gateway", "GatewayConfig", "serve"]
