"""The gateway's backends: their declared labels, health, circuit breaker, last scrape, in-flight
count and observed latencies, and the `FleetView` a policy routes on.

`Backends` is the one registry (config, watched file and admin API all add, update and remove
through it). A removed backend is drained: it leaves the view at once, and its state object lives
until its last in-flight request ends. Times are the gateway clock's seconds (`now_s`).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from fleetwise.core.views import FleetView, KvLinkView, WorkerView
from fleetwise.errors import UnknownNameError
from fleetwise.gateway.config import BackendSpec, BreakerSpec
from fleetwise.gateway.kv_links import LinkEstimate
from fleetwise.gateway.scrape import EngineLoad
from fleetwise.spec.catalog import get_gpu
from fleetwise.spec.hardware import AcceleratorSpec
from fleetwise.spec.kv_format import KvFormat, declared_format

__all__ = ["Backend", "Backends", "Breaker", "Decision"]

LATENCY_EWMA_ALPHA = 0.2
"""Weight of one observation in the per-backend TTFT/TPOT averages shown in /admin/fleet."""


class Breaker:
    """Closed -> open after `failures` consecutive faults; after `open_s` one probe goes through
    (half-open); the probe's success closes it, its fault re-opens it."""

    def __init__(self, spec: BreakerSpec) -> None:
        self.spec = spec
        self.consecutive = 0
        self.opened_at_s: float | None = None
        self.probing = False
        self.opens = 0
        self.held = False
        """It would be open, but its role already has `max_ejection_percent` of its backends out."""

    def allows(self, now_s: float) -> bool:
        """Whether a request may go to the backend now (half-open lets the caller probe)."""
        if self.opened_at_s is None:
            return True
        return not self.probing and now_s - self.opened_at_s >= self.spec.open_s

    def state(self, now_s: float) -> str:
        """`closed`, `open` or `half_open`."""
        if self.opened_at_s is None:
            return "closed"
        return "half_open" if now_s - self.opened_at_s >= self.spec.open_s else "open"

    def attempt(self, now_s: float) -> None:
        """A request is being sent (marks the half-open probe as taken)."""
        if self.opened_at_s is not None and now_s - self.opened_at_s >= self.spec.open_s:
            self.probing = True

    def success(self) -> None:
        """A request succeeded (any answer that is not a backend fault)."""
        self.consecutive, self.opened_at_s, self.probing, self.held = 0, None, False, False

    def fault(self, now_s: float, may_open: bool = True) -> None:
        """Connect error, timeout or 5xx; a closed breaker due to open stays closed (`held`)
        unless `may_open` (its role's ejection budget allows one more)."""
        self.consecutive += 1
        if self.probing:  # the half-open probe failed: open again (still counted as ejected)
            self.opened_at_s, self.probing = now_s, False
            self.opens += 1
        elif self.opened_at_s is None and self.consecutive >= self.spec.failures:
            self.held = not may_open
            if may_open:
                self.opened_at_s = now_s
                self.opens += 1


@dataclass(slots=True)
class Decision:
    """One routing decision as /admin/fleet shows it."""

    request_id: str
    at_s: float
    kind: str
    reason: str
    score: float | None


@dataclass(slots=True)
class Backend:
    """One backend's live state."""

    spec: BackendSpec
    breaker: Breaker
    healthy: bool = True
    health_failures: int = 0
    load: EngineLoad = field(default_factory=EngineLoad)
    scraped_at_s: float | None = None
    scrape_errors: int = 0
    scrape_rejected: str | None = None
    """Why the last scrape's sample was rejected (`scrape.BadSample`); None after a good one."""
    in_flight: int = 0
    own_prefill_tokens: int = 0
    """Prompt tokens of this gateway's requests on the backend still before their first token."""
    own_decode_tokens: int = 0
    """`max_tokens` of this gateway's requests on the backend not yet finished."""
    view_prefill_tokens: int = 0
    """`own_prefill_tokens` when the last scrape landed (what /metrics cannot say: the view's
    queued prefill tokens, as of `scraped_at_s`; the policy adds what it sent since)."""
    view_decode_tokens: int = 0
    """`own_decode_tokens` when the last scrape landed (the view's remaining decode tokens)."""
    selected: int = 0
    faults: int = 0
    ttft_ewma_s: float | None = None
    tpot_ewma_s: float | None = None
    recent: deque[Decision] = field(default_factory=deque)
    removed: bool = False
    probe_ok: bool = True
    """The last active probe (a one-token completion) answered within its bound."""
    kv_format: KvFormat | None = None
    """The KV format its config declares (`backend_kv_format`, set when the backend is added)."""
    kv_link: LinkEstimate = field(default_factory=LinkEstimate)
    """Its KV transfers' measured bandwidth (decode backends; from the scraped NIXL metrics)."""

    def __post_init__(self) -> None:
        if self.kv_format is None:
            self.kv_format = backend_kv_format(self.spec)

    @property
    def name(self) -> str:
        return self.spec.key

    def available(self, now_s: float) -> bool:
        """Healthy, breaker letting traffic through, not being removed (`routable` outside a panic)."""
        return self.routable(now_s, False)

    def routable(self, now_s: float, panic: bool) -> bool:
        """`available`, or in a panic (too few of its role healthy) whatever its health verdict."""
        return (self.healthy or panic) and not self.removed and self.breaker.allows(now_s)

    def observe_latency(self, ttft_s: float | None, tpot_s: float | None) -> None:
        """Fold one stream's TTFT/TPOT into the averages."""
        a = LATENCY_EWMA_ALPHA
        if ttft_s is not None:
            self.ttft_ewma_s = ttft_s if self.ttft_ewma_s is None else (1 - a) * self.ttft_ewma_s + a * ttft_s
        if tpot_s is not None:
            self.tpot_ewma_s = tpot_s if self.tpot_ewma_s is None else (1 - a) * self.tpot_ewma_s + a * tpot_s

    def view(self, now_s: float, panic: bool = False) -> WorkerView:
        """This backend as a policy sees it (`panic`: its role is below the panic threshold, so its
        health verdict is ignored). Without a metrics endpoint the view is the gateway's own
        in-flight count, always fresh; with one it is the last scrape (or, before the first
        scrape, an empty view dated 0: stale until a scrape arrives)."""
        s = self.spec
        if s.metrics_path is None:
            running, waiting, kv, at = self.in_flight, 0, 0.0, now_s
            pre, dec = self.own_prefill_tokens, self.own_decode_tokens
        else:
            ld = self.load
            running, waiting, kv = ld.running, ld.waiting, ld.kv_usage
            at = self.scraped_at_s if self.scraped_at_s is not None else 0.0
            pre, dec = self.view_prefill_tokens, self.view_decode_tokens
        return WorkerView(name=s.key, role=s.role, pool=s.pool, accelerator=s.accelerator,
                          model_version=s.model_version, region=s.region, healthy=self.routable(now_s, panic),
                          queued_requests=waiting, running_requests=running, queued_prefill_tokens=pre,
                          running_decode_tokens=dec, kv_usage=kv, weight=s.weight, reported_at_s=at,
                          kv_format=self.kv_format)

    def scraped(self, load: EngineLoad, now_s: float) -> None:
        """A scrape landed: the engine's load, and the gateway's own token counts as of now."""
        self.load, self.scraped_at_s = load, now_s
        self.kv_link.scraped(load.kv_xfer_s_total, load.kv_xfer_count, load.kv_xfer_bytes_total, now_s)
        self.view_prefill_tokens, self.view_decode_tokens = self.own_prefill_tokens, self.own_decode_tokens

    def work(self, prompt_tokens: int, output_tokens: int) -> tuple[int, int]:
        """Count a request's tokens as this backend's (prefill, decode) work; returns the amounts
        to pass to `done` (a decode replica does no prefill, a prefill one no decode)."""
        pre = 0 if self.spec.role == "decode" else prompt_tokens
        dec = 0 if self.spec.role == "prefill" else output_tokens
        self.own_prefill_tokens += pre
        self.own_decode_tokens += dec
        return pre, dec

    def done(self, prefill_tokens: int, decode_tokens: int) -> None:
        """Remove work counted by `work` (the prefill part at the first token, the rest at the end)."""
        self.own_prefill_tokens -= prefill_tokens
        self.own_decode_tokens -= decode_tokens

    def admin(self, now_s: float) -> dict[str, Any]:
        """The /admin/fleet entry of this backend (shape documented in docs/gateway.md)."""
        s, ld = self.spec, self.load
        return {
            "name": s.key, "url": s.url, "role": s.role, "pool": s.pool, "model_version": s.model_version,
            "region": s.region, "accelerator": s.accelerator, "weight": s.weight,
            "healthy": self.healthy, "breaker": self.breaker.state(now_s), "breaker_held": self.breaker.held,
            "available": self.available(now_s), "in_flight": self.in_flight, "queued": ld.waiting, "running": ld.running, "kv_usage": ld.kv_usage,
            "prefix_hit_rate": ld.prefix_hit_rate,
            "engine_ttft_mean_s": ld.ttft_mean_s, "engine_itl_mean_s": ld.itl_mean_s,
            "observed_ttft_s": self.ttft_ewma_s, "observed_tpot_s": self.tpot_ewma_s,
            "scrape_age_s": None if self.scraped_at_s is None else round(now_s - self.scraped_at_s, 3),
            "scrape_errors": self.scrape_errors, "scrape_rejected": self.scrape_rejected, "selected": self.selected, "faults": self.faults,
            "recent": [{"request_id": d.request_id, "at_s": round(d.at_s, 3), "kind": d.kind,
                        "reason": d.reason, "score": d.score} for d in self.recent],
        }


def backend_kv_format(s: BackendSpec) -> KvFormat:
    """The KV format a backend's config declares: its version, KV dtype (as its card encodes it
    when `accelerator` is a catalog name), block size, TP degree and vendor; undeclared parts None."""
    try:
        gpu: AcceleratorSpec | None = get_gpu(s.accelerator) if s.accelerator else None
    except UnknownNameError:
        gpu = None
    if gpu is not None and s.kv_dtype is not None:
        return declared_format(s.model_version, s.kv_dtype, s.block_size, s.tp, gpu)
    return KvFormat(s.model_version, s.kv_dtype, s.block_size, s.tp, gpu.vendor if gpu else None,
                    tuple(sorted(set(gpu.kv_formats.values()))) if gpu else ())


class Backends:
    """Every backend by name, in insertion order; builds the fleet view."""

    def __init__(self, breaker: BreakerSpec, recent: int, panic_threshold: float = 0.0) -> None:
        self.breaker_spec = breaker
        self.recent = recent
        self.panic_threshold = panic_threshold
        self.panic: set[str] = set()
        """Roles below the panic threshold: their health verdicts are ignored (`update_panic`)."""
        self.live: dict[str, Backend] = {}
        self.draining: dict[str, Backend] = {}
        self._view_key: tuple[Any, ...] | None = None
        self._view_workers: tuple[WorkerView, ...] = ()
        self.version = 0
        """Bumped on every change of membership, health or breaker state."""
        self.handoffs: dict[str, tuple[str, str]] = {}
        """Request id -> (prefill, decode) of each P/D hand-off in flight (prefill answered, decode
        leg's first event not yet come)."""

    def upsert(self, spec: BackendSpec) -> tuple[Backend, bool]:
        """Add a backend, or replace the labels of an existing one; True when newly added."""
        b = self.live.get(spec.key)
        self.version += 1
        if b is None:
            b = self.live[spec.key] = Backend(spec=spec, breaker=Breaker(self.breaker_spec),
                                              recent=deque(maxlen=max(1, self.recent)))
            return b, True
        b.spec = spec
        return b, False

    def remove(self, name: str) -> Backend | None:
        """Take a backend out of routing; it drains (its in-flight requests finish)."""
        b = self.live.pop(name, None)
        if b is not None:
            b.removed = True
            self.version += 1
            if b.in_flight:
                self.draining[name] = b
        return b

    def update_panic(self, role: str) -> bool:
        """Whether `role` is now in a panic (fewer than `panic_threshold` of its live backends
        pass their health checks), recorded in `panic`; True when that changed."""
        members = [b for b in self.live.values() if b.spec.role == role]
        now = bool(members) and sum(b.healthy for b in members) < self.panic_threshold * len(members)
        if now == (role in self.panic):
            return False
        (self.panic.add if now else self.panic.discard)(role)
        self.version += 1
        return True

    def may_eject(self, b: Backend) -> bool:
        """Whether `b`'s breaker may open: fewer of its role's live backends have open breakers than
        `max_ejection_percent` of them (rounded down, at least one, never all)."""
        role = [m for m in self.live.values() if m.spec.role == b.spec.role]
        share = int(len(role) * self.breaker_spec.max_ejection_percent / 100.0)
        budget = min(len(role) - 1, max(1, share)) if self.breaker_spec.max_ejection_percent > 0 else 0
        return sum(m.breaker.opened_at_s is not None for m in role if m is not b) < budget

    def capped_roles(self) -> list[str]:
        """Roles with a breaker held closed by `max_ejection_percent` (sorted)."""
        return sorted({b.spec.role for b in self.live.values() if b.breaker.held})

    def routable_roles(self, now_s: float) -> dict[str, int]:
        """Live backends a policy may route to now, per role (health verdicts ignored in a panic)."""
        out: dict[str, int] = {}
        for b in self.live.values():
            if b.routable(now_s, b.spec.role in self.panic):
                out[b.spec.role] = out.get(b.spec.role, 0) + 1
        return out

    def get(self, name: str) -> Backend | None:
        """A live or draining backend by name."""
        return self.live.get(name) or self.draining.get(name)

    def released(self, b: Backend) -> None:
        """A request on `b` ended; forget a drained backend once idle (only `b` itself: a backend
        of the same name removed since may still be draining)."""
        if b.removed and b.in_flight == 0 and self.draining.get(b.name) is b:
            del self.draining[b.name]

    def fleet(self, now_s: float, exclude: frozenset[str] = frozenset()) -> FleetView:
        """The view a policy routes on; `exclude` hides backends a retry must avoid."""
        workers = tuple(b.view(now_s, b.spec.role in self.panic) for name, b in self.live.items()
                        if name not in exclude)
        return FleetView(now_s=now_s, workers=workers, links=self.links(now_s))

    def links(self, now_s: float) -> tuple[KvLinkView, ...]:
        """Each prefill->decode pair's KV link as measured at its decode backend (`kv_links`): the
        decayed bandwidth estimate, relaxed towards the fleet's best fresh one, and the hand-offs
        this gateway has in flight on the pair; empty until some decode backend has reported a
        transfer."""
        dec = [b for b in self.live.values() if b.spec.role == "decode"]
        fresh = [b.kv_link.bytes_per_s for b in dec if b.kv_link.bytes_per_s is not None]
        if not fresh:
            return ()
        best = max(fresh)
        pre = [b for b in self.live.values() if b.spec.role == "prefill"]
        active = Counter(self.handoffs.values())
        return tuple(KvLinkView(p.name, d.name, d.kv_link.at(now_s, best), 0.0, active[(p.name, d.name)],
                                d.routable(now_s, "decode" in self.panic)) for p in pre for d in dec)

    def handoff_started(self, request_id: str, prefill: str, decode: str) -> None:
        """A prefill leg answered: request `request_id`'s KV is on its way from `prefill` to `decode`."""
        self.handoffs[request_id] = (prefill, decode)

    def handoff_ended(self, request_id: str) -> bool:
        """The decode leg's first event (or answer, or failure) came: the hand-off is over; True
        when it was still in flight."""
        return self.handoffs.pop(request_id, None) is not None
