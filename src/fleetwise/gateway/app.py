"""`Gateway`: the OpenAI-compatible front, routing through a fleetwise policy, assembled from one
module per stage of a request's path, each building on the one below:

- `state`: config, policy, backends, tenants, telemetry, ledger writer; faults and answers;
- `loops`: scrapes, health checks, active probes, the backends file, KV-event feeds, the view;
- `relay`: one attempt to one backend, relayed within the stall bounds;
- `dispatch`: route, P/D legs, retries before the first byte, migration after it, KV release;
- `admit`: body, tenant, limits, pins and checks, the tenant's slot held while the rest runs;
- `admin`: the ASGI app, models, health, readiness, metrics, the admin API and the dashboard.

Per completion request: read the body (bounded) -> tenant and limits -> parse the routing fields
-> `policy.route()` on the current `FleetView` -> send to the chosen backend (for a P/D pair: the
prefill leg, then the decode leg with the returned `kv_transfer_params`) -> relay the answer
chunk by chunk -> record the usage. Before the first byte reaches the client, a connect error,
timeout, stall or 5xx is retried on another eligible backend (bounded, counted); after it, a
broken stream migrates or ends with an OpenAI-style error event. Every outcome is reported to the
policy (`observe`) and to the backend's circuit breaker (faults only: a client's 4xx is not the
backend's fault).
"""

from __future__ import annotations

from fleetwise.gateway.admin import AdminSurface

__all__ = ["Gateway"]


class Gateway(AdminSurface):
    """One gateway process: its state (`state`), the loops that keep its fleet view current
    (`loops`), a request's stages (`admit` -> `dispatch` -> `relay`, metering through the ledger
    writer) and its HTTP surface (`admin`). Each stage is a module that builds on the one below."""
