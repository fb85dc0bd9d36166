"""Prefill role: the KV a finished prefill keeps under a lease until a decode replica pulls it
(`KvLeases`: the leases, their expiry, serving a pull on the replica's egress port), and the
deployments of the replicas at the other end of a pull (memoised)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Protocol

from fleetwise.core.openai_request import ApiError
from fleetwise.emulator.config import EmulatorConfig
from fleetwise.emulator.kv_format import check_pull, params_format
from fleetwise.emulator.kv_link import KvPort
from fleetwise.emulator.metrics import ReplicaMetrics
from fleetwise.emulator.running import Lease, Live
from fleetwise.engine.clock import ORDER_ARRIVAL
from fleetwise.engine.driver import DOWN, EngineDriver
from fleetwise.engine.scheduler import Engine
from fleetwise.errors import SpecError
from fleetwise.live import AsyncioClock
from fleetwise.perf.kv import kv_shards, kv_transfer_bytes
from fleetwise.perf.roofline import PerfModel
from fleetwise.perf.types import Deployment, pool_deployment
from fleetwise.spec.kv_format import KvFormat
from fleetwise.spec.plan import PoolSpec, resolve_pool

__all__ = ["MAX_DST_KINDS", "KvLeases", "LeaseHost"]

MAX_DST_KINDS = 64
"""Decode-side deployments remembered by a prefill replica (more are rebuilt on demand)."""


class LeaseHost(Protocol):
    """What `KvLeases` reads of the replica that holds them (`EmulatedReplica`), so the leases
    depend on no replica module."""

    cfg: EmulatorConfig
    deployment: Deployment
    kv_format: KvFormat
    perf_model: PerfModel
    engine: Engine
    driver: EngineDriver | None
    clock: AsyncioClock | None
    kv_port: KvPort | None
    metrics: ReplicaMetrics

    def now_s(self) -> float:
        """The replica's modelled time, seconds."""

    def kick(self) -> None:
        """Let the engine run a step (blocks were freed)."""


class KvLeases:
    """One replica's KV leases (prefill role) and the deployments its pulls name."""

    def __init__(self, replica: LeaseHost) -> None:
        self.r = replica
        self.held: dict[str, Lease] = {}
        """Request id -> its lease, until pulled or expired."""
        self._dst_cache: dict[str, Deployment] = {}

    def hold(self, lv: Live, t: float) -> None:
        """Keep `lv`'s KV (its prefill ended at modelled `t`) for `kv_lease_s` modelled seconds."""
        r = self.r
        lease = Lease(lv, len(lv.req.prompt_ids), t)
        self.held[lv.rid] = lease
        wall_s = (t + r.cfg.kv_lease_s - r.now_s()) / r.cfg.time_scale
        lease.expires = asyncio.get_running_loop().call_later(wall_s, self._expire, lv.rid)
        r.metrics.kv_leases.set(len(self.held))

    def cancel_timers(self) -> None:
        """Stop every lease's expiry (the replica is stopping)."""
        for lease in self.held.values():
            if lease.expires is not None:
                lease.expires.cancel()

    def _expire(self, rid: str) -> None:
        self.release(rid)

    def release(self, rid: str) -> bool:
        """Free a lease no decode replica will pull (expired, or released by the router after a
        refused hand-off, as vLLM's NIXL connector frees on abort); its bytes x modelled seconds
        count as orphaned KV. False when there is no such lease."""
        lease = self.held.pop(rid, None)
        if lease is None:
            return False
        if lease.expires is not None:
            lease.expires.cancel()
        nbytes = kv_transfer_bytes(lease.prompt_tokens, self.r.deployment)
        self.r.metrics.kv_orphaned.inc(nbytes * max(0.0, self.r.now_s() - lease.start_s))
        self.r.metrics.kv_leases.set(len(self.held))
        self._release(lease.live.eid)
        return True

    async def serve_pull(self, body: dict[str, Any]) -> dict[str, Any]:
        """Prefill role: a decode replica pulls a leased request's KV. The transfer runs on this
        replica's egress port (`KvPort`, shared with every pull in flight to any decode replica)
        from the moment the pull arrives; the pull is held open until it lands (a crash in that
        time breaks it), then the blocks are freed and the answer says how long the transfer
        took as priced on this port (`transfer_s`, modelled seconds; the decode side lands it at
        the later of that and its own ingress pricing)."""
        rid = body.get("remote_request_id")
        if not isinstance(rid, str) or rid not in self.held:
            raise ApiError(404, f"no KV lease for remote_request_id={rid!r} (expired, pulled already, or "
                                "never prefilled here)", "remote_request_id")
        if body.get("remote_engine_id") not in (None, self.r.cfg.engine_id):
            raise ApiError(404, f"remote_engine_id={body.get('remote_engine_id')!r} is not this engine "
                                f"({self.r.cfg.engine_id})", "remote_engine_id")
        dst = body.get("dst") or {}
        check_pull(self.r.kv_format, params_format(body.get("kv_format") or {}, self.r.cfg.model_version),
                   "the prefill replica")
        try:
            dst_dep = self.dst_deployment(dst)
            dst_bw = float(body.get("link_bytes_per_s", self.r.cfg.kv_link.bytes_per_s)) * kv_shards(dst_dep)
            if not (math.isfinite(dst_bw) and dst_bw > 0):
                raise ValueError(f"link_bytes_per_s={body.get('link_bytes_per_s')!r} must be a positive number")
        except (SpecError, ValueError, TypeError) as err:
            raise ApiError(400, f"KV pull: {str(err)[:200]}", "dst") from None
        # The decode replica's port; a pull that does not name it shares no port but ours.
        dst_port = str(body.get("dst_port") or f"pull:{rid}")
        lease = self.held.pop(rid)
        self.r.metrics.kv_leases.set(len(self.held))
        if lease.expires is not None:
            lease.expires.cancel()
        port, clock = self.r.kv_port, self.r.clock
        assert port is not None and clock is not None  # serving means started
        nbytes = kv_transfer_bytes(lease.prompt_tokens, self.r.deployment)
        landed: asyncio.Future[tuple[float, float, bool]] = asyncio.get_running_loop().create_future()
        pid: list[int] = []

        def on_landed(t: float, seconds: float, shared: bool) -> None:
            if not landed.done():
                landed.set_result((t, seconds, shared))

        def start(t: float, _: Any) -> None:
            # On the clock, as arrivals are: a late process first ends the transfers that were due.
            pid.append(port.start(t, dst_port, dst_bw, nbytes, on_landed))

        clock.call_at(self.r.now_s(), ORDER_ARRIVAL, start)
        try:
            end_s, seconds, shared = await landed
        finally:
            if not landed.done() and pid:
                port.cancel(self.r.now_s(), pid[0])  # the pull was broken off: the others speed up
        self._release(lease.live.eid)
        return {"remote_request_id": rid, "prompt_tokens": lease.prompt_tokens, "transfer_s": seconds,
                "transfer_start_s": end_s - seconds, "remote_engine_id": self.r.cfg.engine_id,
                "egress_shared": shared}

    def _release(self, eid: str) -> None:
        if self.r.driver is not None and self.r.driver.state == DOWN and self.r.engine.busy:
            return  # stopped with a step in flight: nothing to free any more
        self.r.engine.release(eid)
        self.r.kick()

    def dst_deployment(self, dst: dict[str, Any]) -> Deployment:
        """The decode side's deployment named in a pull, for its KV shards (memoised: a fleet has few
        kinds): model, card and layout as named, not fitted here (the other side's weights and
        memory share are its own: it serves, so they fit)."""
        key = json.dumps(dst, sort_keys=True)
        dep = self._dst_cache.get(key)
        if dep is None:
            if len(self._dst_cache) >= MAX_DST_KINDS:
                self._dst_cache.clear()
            pool = PoolSpec.model_validate({
                "name": "dst", "role": "decode", "accelerator": dst.get("accelerator", self.r.cfg.gpu),
                "model": dst.get("model", self.r.cfg.model),
                "parallelism": {"tp": dst.get("tp", 1), "pp": dst.get("pp", 1)},
                "kv_dtype": dst.get("kv_dtype", self.r.cfg.kv_dtype)})
            model, gpu = resolve_pool(pool, "KV pull dst")
            dep = self._dst_cache[key] = pool_deployment(model, gpu, pool)
        return dep

    def src_deployment(self, ktp: dict[str, Any]) -> Deployment:
        """The prefill side's deployment as its kv_transfer_params name it (its TP and PP; the KV
        shards depend on nothing else, so this replica's model and card stand in for the rest)."""
        tp, pp = ktp.get("tp_size", 1), ktp.get("pp_size", 1)
        return self.dst_deployment({"model": self.r.cfg.model, "accelerator": self.r.cfg.gpu, "tp": tp, "pp": pp,
                                     "kv_dtype": self.r.cfg.kv_dtype})
