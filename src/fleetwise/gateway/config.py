"""`GatewayConfig`: the gateway's YAML document (backends, routing, limits, tenants, timeouts).

```yaml
host: 127.0.0.1
port: 8000
backends:
  - {url: http://10.0.0.1:8000, role: mixed, model_version: v1, region: eu, accelerator: H200}
backends_file: fleet.yaml          # optional; watched, reconciled on change (list of backends)
routing: {policy: fleetwise-default, safe_mode: {stale_after_s: 5}}
tenants:
  - {name: acme, api_keys: [sk-acme-1], requests_per_s: 50, tokens_per_s: 200000, max_concurrency: 64}
admin_token_env: FLEETWISE_ADMIN_TOKEN
```

Every field has a default; `fleetwise gateway --backend URL ...` builds the same document from
flags. Durations are seconds, sizes bytes, rates per second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from fleetwise.spec.base import Spec
from fleetwise.spec.dtypes import KvDtype
from fleetwise.spec.failure_domains import FailureDomainSpec
from fleetwise.spec.http import HttpLimitsSpec
from fleetwise.spec.limits import MAX_BLOCK_TOKENS, MAX_BODY_BYTES, MAX_TCP_PORT
from fleetwise.spec.routing import RoutingSpec

if TYPE_CHECKING:
    from fleetwise.spec.plan import PlanSpec

__all__ = [
    "FLEETWISE_TOKENIZER", "BackendSpec", "BreakerSpec", "GatewayConfig", "IdempotencySpec", "KvEventsSpec", "LedgerOutageSpec", "LimitsSpec", "RetrySpec", "ScrapeSpec", "StallSpec", "TenantSpec",
    "TimeoutSpec", "backend_name", "duplicate_names", "fleet_backends", "fleet_settings",
]

Role = Literal["mixed", "prefill", "decode"]
FLEETWISE_TOKENIZER = "fleetwise"
"""The `tokenizer:` value naming fleetwise's own deterministic tokenizer (`fleetwise.core.tokens`)."""


OPENAI_API_PATH = "/v1"
"""The path OpenAI clients' `base_url` ends in (`http://host:8000/v1`, as LiteLLM's `api_base` and
vLLM's docs write it); the gateway appends `/v1/completions` itself, and `/metrics` and `/health`
live at the server's root, so a backend URL ending in it is taken as the root."""


def backend_name(url: str) -> str:
    """The default name of a backend: its `host:port`."""
    parts = urlsplit(url)
    return parts.netloc or url


class KvEventsSpec(Spec):
    """Where an engine publishes its KV events over ZeroMQ (vLLM's `--kv-events-config` with
    `"publisher": "zmq"`; docs/gateway.md)."""

    transport: Literal["zmq"] = "zmq"
    endpoint: str
    """The publisher's PUB socket, e.g. `tcp://10.0.0.1:5557` (vLLM binds `tcp://*:5557`)."""
    replay_endpoint: str | None = None
    """Its replay (ROUTER) socket, e.g. `tcp://10.0.0.1:5558`; null: gaps reset the index."""
    topic: str = ""
    """Topic prefix subscribed to (vLLM's `topic`, empty by default)."""

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("tcp://", "ipc://")):
            raise ValueError(f"kv_events endpoint {v!r} must look like tcp://host:port")
        return v


class BackendSpec(Spec):
    """One OpenAI-compatible engine server the gateway may send requests to."""

    retired_fields = {"kv_events_path": "KV events now come over ZeroMQ as vLLM publishes them: give "
                      "`kv_events: {endpoint: tcp://host:port}` (docs/gateway.md, KV events)"}

    url: str
    """Base URL, `http://host:port` (paths such as /v1/completions are appended). A path is the
    prefix the server is mounted under (`http://proxy/engine-a`); a trailing `/v1` is the OpenAI
    client's `base_url` form and is dropped (`http://host:8000/v1` is `http://host:8000`)."""
    name: str = ""
    """Unique name in views, metrics and /admin/fleet; defaults to `host:port`."""
    role: Role = "mixed"
    """`mixed` serves whole requests; `prefill`/`decode` are the two legs of a P/D pair."""
    pool: str = "default"
    """Pool label (reported; replicas of one pool share hardware and configuration)."""
    model_version: str = "v1"
    """Version label; a request pinned to a version only goes to backends carrying it."""
    region: str = "default"
    """Region label; a request naming a region only goes to backends in it."""
    accelerator: str = ""
    """Accelerator label (reported); a catalog name also declares the card's vendor and KV encodings."""
    kv_dtype: KvDtype | None = None
    """KV-cache dtype the engine stores (declared: P/D pairs only compatible formats); null: undeclared."""
    block_size: int | None = Field(default=None, gt=0, le=MAX_BLOCK_TOKENS)
    """Tokens per KV block of the engine (declared); null: undeclared."""
    tp: int | None = Field(default=None, gt=0)
    """Tensor-parallel degree of the engine (declared); null: undeclared."""
    weight: float = Field(default=1.0, gt=0.0)
    """Relative capacity: round-robin and random picks are proportional to it, and scored policies
    divide a backend's predicted cost by it (2 = takes twice the work of a weight-1 backend)."""
    metrics_path: str | None = "/metrics"
    """Prometheus endpoint scraped for load; null when the server has none (the view then holds
    only the gateway's own in-flight counts and is always fresh)."""
    health_path: str = "/health"
    """Liveness endpoint polled by the health checker."""
    kv_events: KvEventsSpec | None = None
    """The engine's KV events over ZeroMQ (vLLM's `--kv-events-config` publisher, which
    `fleetwise emulate` speaks too), followed for prefix-aware policies; null: none (the prefix
    index then learns from this gateway's own dispatches)."""

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend url {v!r} must look like http://host:port")
        try:
            why = "port 0" if parts.port == 0 else ""  # urlsplit checks the port when it is read
        except ValueError as err:
            why = str(err)
        if why:
            raise ValueError(f"backend url {v!r}: {why}; give a port in 1-65535, as in http://host:8000")
        if parts.query or parts.fragment:
            raise ValueError(f"backend url {v!r} has a query or fragment; give the server's base URL, as in "
                             "http://host:8000")
        base = v.rstrip("/")
        return base[:-len(OPENAI_API_PATH)] if base.endswith(OPENAI_API_PATH) else base

    @field_validator("metrics_path", "health_path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"{v!r} must be a path starting with '/', such as '/{v}'")
        return v

    @property
    def key(self) -> str:
        """The backend's name (given, or `host:port`)."""
        return self.name or backend_name(self.url)


def duplicate_names(backends: Sequence[BackendSpec]) -> list[str]:
    """The backend names given more than once, sorted."""
    names = [b.key for b in backends]
    return sorted({n for n in names if names.count(n) > 1})


HEALTHY_PANIC_THRESHOLD = 0.5
"""Envoy's `healthy_panic_threshold` default (50%): below it, load balancing ignores host health."""


class ScrapeSpec(Spec):
    """How often each backend's /metrics and /health are read."""

    interval_s: float = Field(default=1.0, gt=0.0)
    """Metrics scrape period."""
    timeout_s: float = Field(default=1.0, gt=0.0)
    """Give up on one scrape (it then counts as missing: the view ages)."""
    health_interval_s: float = Field(default=2.0, gt=0.0)
    """Health check period."""
    health_failures: int = Field(default=2, ge=1)
    """Consecutive failed health checks before a backend is marked down."""
    panic_threshold: float = Field(default=HEALTHY_PANIC_THRESHOLD, ge=0.0, le=1.0)
    """Below this fraction of a role's backends passing their health checks, health verdicts are
    ignored for that role and every one of its backends whose breaker allows is routed to (a
    health outage never empties the fleet). 0 = never."""
    watch_interval_s: float = Field(default=2.0, gt=0.0)
    """How often `backends_file` is checked for changes."""


MAX_EJECTION_PERCENT = 50.0
"""Default share of a role's backends open breakers may hold out. Envoy's `max_ejection_percent`
defaults to 10% (and ejects at least one host); LLM fleets have 2 to 16 replicas a role, where
10% means one, and a second dead replica would stay in rotation. 50% matches the health panic
threshold (Envoy's `healthy_panic_threshold`): breakers and health checks alike leave at least
half of a role routable."""


class BreakerSpec(Spec):
    """Per-backend circuit breaker over backend faults (connect errors, timeouts, 5xx; never 4xx)."""

    failures: int = Field(default=5, ge=1)
    """Consecutive faults that open the breaker."""
    open_s: float = Field(default=5.0, gt=0.0)
    """How long an open breaker refuses traffic before one probe request is let through."""
    max_ejection_percent: float = Field(default=MAX_EJECTION_PERCENT, ge=0.0, le=100.0)
    """Most of a role's backends (percent, rounded down, at least one) whose breakers may be open
    at once, never all of them (Envoy's outlier detection `max_ejection_percent`): a breaker that
    would open beyond it stays closed, so the backends that failed last stay routable. 100 = all
    but one; 0 = breakers never open."""


class TimeoutSpec(Spec):
    """Upstream timeouts."""

    connect_s: float = Field(default=2.0, gt=0.0)
    """TCP connect to a backend."""
    first_byte_s: float = Field(default=60.0, gt=0.0)
    """From sending the request to the response's first body byte (prefill included)."""
    idle_s: float = Field(default=60.0, gt=0.0)
    """Longest gap between two chunks of a stream before it counts as a hang."""


class StallSpec(Spec):
    """Per-request stall detection: a replica that accepts requests and answers health checks
    but produces no token (docs/gateway.md). Bounds are `factor` times what the replica's own
    recent latency predicts, never below the minimums, never above `timeouts`."""

    enabled: bool = True
    factor: float = Field(default=4.0, ge=1.0)
    """Bound = factor x the expected wait (first token: recent TTFT scaled by the queue ahead; next
    token: recent TPOT)."""
    min_first_token_s: float = Field(default=2.0, gt=0.0)
    """Shortest first-token bound (a replica with a very short recent TTFT still gets this long)."""
    min_next_token_s: float = Field(default=1.0, gt=0.0)
    """Shortest gap allowed between two chunks of a stream."""
    probe_interval_s: float = Field(default=5.0, ge=0.0)
    """Seconds between active probes of each mixed backend (a one-token completion, bounded by the
    first-token bound); a failed probe counts as a failed health check. 0 = no probes."""


class RetrySpec(Spec):
    """Retries before the first byte reached the client (connect error, timeout, 5xx)."""

    max_retries: int = Field(default=2, ge=0, le=16)
    """Further attempts on other eligible backends after the first one fails."""
    budget_percent: float | None = Field(default=None, ge=0.0, le=100.0)
    """Most retries in flight at once, as a percent of the requests in flight (Envoy's
    `retry_budget.budget_percent`, whose default is 20): where backends fail because the whole
    fleet is overloaded, retries then do not multiply the load. null (the default): no budget. A
    hung replica fails its requests together (their first-token bounds run out at once), so a
    budget also refuses those failovers: with 20%, one hung replica of four failed 4 requests of a
    closed loop (tests/gateway/test_stall.py) that the other three would have served."""
    min_retry_concurrency: int = Field(default=3, ge=0)
    """Retries allowed in flight whatever the percent (Envoy's `retry_budget.min_retry_concurrency`, default 3)."""


class LimitsSpec(Spec):
    """What one request may ask for."""

    max_body_bytes: int = Field(default=MAX_BODY_BYTES, gt=0)
    """Largest request body (413 above it)."""
    max_output_tokens: int = Field(default=1_000_000, gt=0)
    """Largest `max_tokens` a client may ask for (400 above it)."""
    chars_per_token: float = Field(default=4.0, gt=0.0)
    """Prompt-token estimate when the backend's tokenizer is not local (characters per token)."""
    hash_block_tokens: int = Field(default=64, gt=0)
    """Prompt tokens per prefix-hash block used for prefix-aware routing; with KV events, the
    engine's KV block size (`fleetwise emulate --block-size`, 16 by default), so hashes match."""
    default_max_tokens: int = Field(default=256, gt=0)
    """`max_tokens` assumed for routing when a request sets none."""
    vocab_size: int | None = Field(default=None, gt=0)
    """Token ids a prompt may hold are in [0, vocab_size) (400 otherwise); null = the tokenizer's
    vocabulary, else the catalog model's of the request's `model`, else any 32-bit id."""


class LedgerOutageSpec(Spec):
    """What the gateway does while its ledger cannot take writes (docs/gateway.md, production checklist)."""

    spool_path: str | None = None
    """Local file usage records are fsynced to while the ledger is unreachable, replayed when it
    returns; null = the SQLite ledger's path + `.spool`, or `fleetwise-ledger.spool` in the
    working directory for PostgreSQL. Several processes take `PATH`, `PATH.1`, ..."""
    commit_wait_s: float = Field(default=1.0, gt=0.0)
    """Longest a request's end waits for the ledger's commit before its record is spooled instead."""
    retry_s: float = Field(default=1.0, gt=0.0)
    """Interval between attempts to replay the spool into the ledger."""
    max_spool_bytes: int = Field(default=1 << 30, gt=0)
    """Spool size limit; beyond it records are lost (counted, logged, /readiness 503)."""
    unready_when_degraded: bool = False
    """/readiness answers 503 while records are being spooled. Off by default: a spooling gateway
    serves and bills correctly, and gateways sharing one database would all turn unready at once."""


class IdempotencySpec(Spec):
    """How long completed answers are kept for `Idempotency-Key` replays (docs/gateway.md)."""

    ttl_s: float = Field(default=86400.0, gt=0.0)
    """A key's answer is replayed for this long after the first request (Stripe keeps 24 h)."""
    max_bytes: int = Field(default=256 << 20, gt=0)
    """Memory for kept answers; the oldest are dropped first (a dropped key's reuse is a 409)."""


class TenantSpec(Spec):
    """A tenant: its API keys and its limits (0 = unlimited)."""

    name: str
    api_keys: tuple[str, ...] = ()
    """Bearer keys that identify this tenant."""
    requests_per_s: float = Field(default=0.0, ge=0.0)
    """Sustained request rate; `burst_s` seconds of it may arrive at once."""
    tokens_per_s: float = Field(default=0.0, ge=0.0)
    """Sustained prompt + max_tokens rate."""
    max_concurrency: int = Field(default=0, ge=0)
    """Requests in flight at once."""
    burst_s: float = Field(default=1.0, gt=0.0)
    """Bucket depth in seconds of the rate."""
    model_version: str | None = None
    """Pin every request of this tenant to a model version."""
    region: str | None = None
    """Keep every request of this tenant in a region."""


class GatewayConfig(Spec):
    """The whole gateway document."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=MAX_TCP_PORT)
    models: tuple[str, ...] = ()
    """Model names served; empty = whatever the backends' /v1/models report."""
    backends: tuple[BackendSpec, ...] = ()
    backends_file: str | None = None
    """A YAML/JSON list of backends (or `{backends: [...]}`), watched and reconciled on change."""
    routing: RoutingSpec = RoutingSpec()
    tokenizer: str | None = None
    """How prompts are tokenized for routing: null (estimate from `limits.chars_per_token`),
    `fleetwise` (the emulator's tokenizer: exact lengths, block hashes equal to its KV events'),
    or the path of a HuggingFace tokenizer.json (needs the `tokenizers` package)."""
    seed: int = 0
    """Seed of the policy's random choices."""
    scrape: ScrapeSpec = ScrapeSpec()
    breaker: BreakerSpec = BreakerSpec()
    timeouts: TimeoutSpec = TimeoutSpec()
    stall: StallSpec = StallSpec()
    retries: RetrySpec = RetrySpec()
    limits: LimitsSpec = LimitsSpec()
    http: HttpLimitsSpec = HttpLimitsSpec()
    """Connection limits and timeouts (head, body, keep-alive, header count and size)."""
    tenants: tuple[TenantSpec, ...] = ()
    require_api_key: bool = False
    """Refuse requests without a key (401); otherwise they run as tenant `default`."""
    unknown_keys: Literal["default", "reject"] = "default"
    """A request whose API key no tenant lists: `reject` (401; what the examples use) or
    `default` (served as tenant `default`, under its limits)."""
    metrics_token: str | None = None
    """Bearer token /metrics requires; prefer `metrics_token_env`. Without either, /metrics is open
    (as vLLM's is)."""
    metrics_token_env: str = "FLEETWISE_METRICS_TOKEN"
    """Environment variable holding the /metrics token."""
    default_tenant: TenantSpec = TenantSpec(name="default")
    """Limits for requests without a key (when keys are not required)."""
    admin_token: str | None = None
    """Bearer token for /admin/*; prefer `admin_token_env`. Without either, /admin is refused."""
    admin_token_env: str = "FLEETWISE_ADMIN_TOKEN"
    """Environment variable holding the admin token."""
    recent_decisions: int = Field(default=16, ge=0, le=1024)
    """Decisions kept per backend for /admin/fleet."""
    ledger: str | None = None
    """Usage ledger: a SQLite file (or sqlite:///PATH) or postgresql://... shared by several
    gateways; one record per request and idempotency key (docs/failure-domains.md). null = off."""
    ledger_outage: LedgerOutageSpec = LedgerOutageSpec()
    idempotency: IdempotencySpec = IdempotencySpec()
    """Replays of completed requests by `Idempotency-Key` (with a ledger)."""
    """The ledger's spool, write bound and replay interval."""
    failure_domains: FailureDomainSpec = FailureDomainSpec()
    """Recovery and billing decisions (docs/failure-domains.md)."""

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        dup = duplicate_names(self.backends)
        if dup:
            raise ValueError(f"backends: duplicate name(s) {', '.join(dup)}; give each a distinct `name`")
        zmq = [b.key for b in self.backends if b.kv_events is not None]
        if zmq and self.tokenizer is None:
            raise ValueError(f"backends: {zmq[0]} has kv_events but no tokenizer is set; the gateway names an "
                             "engine's blocks by hashing their token ids as it hashes prompts, so set tokenizer: "
                             "the model's tokenizer.json (or fleetwise for `fleetwise emulate`)")
        keys = [k for t in self.tenants for k in t.api_keys]
        dupk = len(keys) - len(set(keys))
        if dupk:
            raise ValueError(f"tenants: {dupk} API key(s) listed under more than one tenant; keep each key once")
        return self


def fleet_backends(plan: PlanSpec, url_of: Callable[[str, int], str],
                   kv_events_of: Callable[[int], dict[str, Any] | None] | None = None) -> list[dict[str, Any]]:
    """The gateway's backend entries for every replica of a fleet document, `url_of(pool, index)`
    giving each replica's base URL and `kv_events_of(n)` the `kv_events` entry of the n-th replica
    in plan order (None: it publishes none); what `emulate --endpoints` writes and
    `--backends-file` reads."""
    out: list[dict[str, Any]] = []
    for pool in plan.pools:
        for i in range(pool.replicas):
            entry: dict[str, Any] = {"name": f"{pool.name}-{i}", "url": url_of(pool.name, i), "role": pool.role,
                                     "pool": pool.name, "model_version": pool.model_version,
                                     "region": pool.region, "accelerator": pool.accelerator}
            kv = kv_events_of(len(out)) if kv_events_of is not None else None
            if kv is not None:
                entry["kv_events"] = kv
            out.append(entry)
    return out


def fleet_settings(plan: PlanSpec) -> dict[str, Any]:
    """The part of a gateway document a fleet document decides: its routing policy (with
    parameters and safe mode) and its failure-domain decisions."""
    routing = {"policy": plan.routing} if isinstance(plan.routing, str) else plan.routing.model_dump(mode="json")
    return {"routing": routing, "failure_domains": plan.failure_domains.model_dump(mode="json")}
