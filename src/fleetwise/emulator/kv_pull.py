"""Decode role: pulling a prompt's KV from the prefill replica that holds it (`KvPulls`), and the
clock hold that keeps a step from starting without a request whose pull has landed here but
whose answer has not come yet (the prefill side is `fleetwise.emulator.kv_leases`).

The prompt's KV moves over this replica's ingress port (`KvPort`, shared with the other pulls in
flight) from the moment the request arrived, and over the prefill replica's egress port, which
prices it there and answers the pull message with how long it took (`transfer_s`). The request
reaches the engine when both have landed it: at `arrival + max(ingress, egress)`, the
simulator's two-port sharing as far as the two ends see it (see `kv_link`). A refused or broken
pull drops the request and answers with the error. The message's own wall-clock round trip is
the emulation's, not the modelled transfer's (vLLM's NIXL reads the remote blocks directly), so
it is not on the modelled path. When the pull lands on this port before the answer has come
(the usual case: the answer takes 1-5 ms of wall time, a transfer alone ~0.3 ms at time scale 5):

- if the prefill replica's last answer said its egress carried no other decode replica's
  transfer (`egress_shared` false), its price will be this port's: the request reaches the
  engine now, at the landing, and nothing streams to the client until the answer confirms the
  pull (a refusal drops it with the error; an egress that did turn out shared and later counts
  in `pull_early`);
- else the clock is held until the answer comes (`AsyncioClock.hold`, at most
  KV_PULL_HOLD_MAX_S), so no step starts without a request that should have joined it.

Either way the request reaches the engine at the modelled landing, as in the simulator; the
hold costs the other streams its wall time, so it is kept to the case that needs it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from fleetwise.core.openai_request import ApiError
from fleetwise.core.request import Request
from fleetwise.emulator.config import EmulatorConfig
from fleetwise.emulator.kv_format import check_pull, format_params, params_format
from fleetwise.emulator.kv_leases import MAX_DST_KINDS, KvLeases
from fleetwise.emulator.kv_link import KvPort
from fleetwise.emulator.metrics import ReplicaMetrics
from fleetwise.emulator.running import Live, ReplicaStatus
from fleetwise.engine.clock import ORDER_ARRIVAL
from fleetwise.errors import SpecError
from fleetwise.live import AsyncioClock
from fleetwise.perf.kv import kv_shards, kv_transfer_bytes
from fleetwise.perf.types import Deployment
from fleetwise.spec.kv_format import KvFormat

__all__ = ["KV_PULL_HOLD_MAX_S", "KvPulls", "PullClient", "PullHost"]

KV_PULL_HOLD_MAX_S = 0.02
"""Wall seconds a decode replica holds its clock for a KV pull's answer once the pull has landed
on its own port (the answer says when it landed on the prefill's port, which decides when the
request reaches the engine). On this host an answer takes ~2 ms of wall time; a prefill replica
slower than this (hung, overloaded) must not freeze every stream here: past it the clock runs on
and the request reaches the engine when the answer comes (late; counted in `pull_late`)."""

PullClient = Callable[[dict[str, Any], dict[str, Any]], Any]
"""Sends a pull message (kv_transfer_params, message) to the prefill replica; awaits its answer."""


class PullHost(Protocol):
    """What `KvPulls` reads of the decode replica that pulls (`EmulatedReplica`)."""

    cfg: EmulatorConfig
    deployment: Deployment
    kv_format: KvFormat
    kv_port: KvPort | None
    clock: AsyncioClock | None
    status: ReplicaStatus
    metrics: ReplicaMetrics
    leases: KvLeases

    def kv_port_name(self) -> str:
        """This replica's KV port as its peers name it."""

    def admit(self, t: float, arg: tuple[Live, Request]) -> None:
        """Hand the request to the engine at modelled `t`."""

    def fail(self, lv: Live, err: ApiError) -> None:
        """Drop the request and answer with `err`."""


class KvPulls:
    """One decode replica's KV pulls (see the module docstring)."""

    def __init__(self, host: PullHost, client: PullClient | None) -> None:
        self.h = host
        self.client = client
        self.egress_exclusive: dict[str, bool] = {}
        """Per prefill KV port, whether its last pull's answer said no other decode replica's
        transfer shared its egress."""

    def message(self, ktp: dict[str, Any]) -> dict[str, Any]:
        """The pull message to the prefill replica named by `ktp` (its kv_transfer_params)."""
        cfg = self.h.cfg
        dst = {"model": cfg.model, "accelerator": cfg.gpu, "tp": cfg.tp, "pp": cfg.pp, "kv_dtype": cfg.kv_dtype}
        return {"remote_request_id": ktp.get("remote_request_id"), "remote_engine_id": ktp.get("remote_engine_id"),
                "dst": dst, "dst_port": self.h.kv_port_name(), "link_bytes_per_s": cfg.kv_link.bytes_per_s,
                "kv_format": {**format_params(self.h.kv_format), "tp_size": cfg.tp}}

    def _refusal(self, ktp: dict[str, Any]) -> ApiError | None:
        """Why this replica cannot pull the KV `ktp` names (no client, incompatible format), or None."""
        h = self.h
        if self.client is None or h.kv_port is None or h.clock is None:
            return ApiError(503, "this replica cannot reach prefill replicas (no KV client)")
        try:  # an incompatible KV format is refused before anything moves
            check_pull(params_format(ktp, h.cfg.model_version), h.kv_format, "this decode replica")
        except ApiError as err:
            return err
        return None

    async def pull(self, lv: Live, er: Request, ktp: dict[str, Any]) -> None:
        """Pull `lv`'s prompt KV as `ktp` names it; the request reaches the engine when it has landed."""
        h = self.h
        refused = self._refusal(ktp)
        if refused is not None:
            h.fail(lv, refused)
            return
        req = self.message(ktp)
        try:
            src_bw = h.cfg.kv_link.bytes_per_s * kv_shards(h.leases.src_deployment(ktp))
        except (SpecError, ValueError, TypeError) as err:
            h.fail(lv, ApiError(400, f"kv_transfer_params: {str(err)[:200]}", "kv_transfer_params"))
            return
        src = f"{ktp.get('remote_engine_id')}@{ktp.get('remote_host')}:{ktp.get('remote_port')}"
        p = PullInFlight(self, lv, er, src, kv_transfer_bytes(er.prompt_tokens, h.deployment))
        assert h.clock is not None and h.kv_port is not None and self.client is not None
        port = h.kv_port

        def start(t: float, _: Any) -> None:
            # On the clock, as arrivals are: a late process first ends the pulls that were due.
            if not lv.done:
                lv.pull_id = port.start(t, src, src_bw, p.nbytes, p.ingress_landed)

        lv.pull_start_s = p.start_s
        h.clock.call_at(p.start_s, ORDER_ARRIVAL, start)
        try:
            res = await self.client(ktp, req)
        except ApiError as err:
            h.metrics.nixl_failed.inc()
            h.fail(lv, ApiError(503 if err.status >= 500 else err.status, f"KV pull failed: {err.message}",
                                "kv_transfer_params"))
            return
        bad = answer_error(res, len(lv.req.prompt_ids))
        if bad is not None:
            h.fail(lv, bad)
            return
        if len(self.egress_exclusive) >= MAX_DST_KINDS:
            self.egress_exclusive.clear()
        self.egress_exclusive[src] = res.get("egress_shared") is False
        p.landed_on("egress", p.start_s + float(res["transfer_s"]))
        self.unhold(lv)
        if lv.gated:
            lv.gated = False
            lv.notify()

    def hold(self, lv: Live) -> None:
        """Hold the clock for `lv`'s pull answer (at most KV_PULL_HOLD_MAX_S of wall time)."""
        h = self.h
        assert h.clock is not None
        h.clock.hold()
        h.status.pull_holds += 1
        lv.hold = asyncio.get_running_loop().call_later(KV_PULL_HOLD_MAX_S, self._hold_expired, lv)
        lv.hold_since = time.monotonic()

    def _hold_expired(self, lv: Live) -> None:
        h = self.h
        if lv.hold is not None and h.clock is not None:
            lv.hold = None
            h.status.pull_late += 1
            h.status.pull_hold_wall_s += time.monotonic() - lv.hold_since
            h.clock.release()

    def unhold(self, lv: Live) -> None:
        """End `lv`'s hold on the clock, if it has one."""
        h, hd = self.h, lv.hold
        if hd is not None and h.clock is not None:
            lv.hold = None
            hd.cancel()
            h.status.pull_hold_wall_s += time.monotonic() - lv.hold_since
            h.clock.release()


def answer_error(res: dict[str, Any], prompt_tokens: int) -> ApiError | None:
    """What is wrong with a prefill replica's answer to a pull of `prompt_tokens` tokens, or None."""
    if int(res.get("prompt_tokens", -1)) != prompt_tokens:
        return ApiError(400, f"KV pull: the prefill replica holds {res.get('prompt_tokens')} prompt "
                             f"tokens, this request has {prompt_tokens}; send the same prompt "
                             "to both", "prompt")
    egress_s = res.get("transfer_s")
    if isinstance(egress_s, bool) or not isinstance(egress_s, int | float) or not math.isfinite(egress_s) \
            or egress_s < 0:
        return ApiError(502, f"KV pull: the prefill replica answered transfer_s={egress_s!r}, not a "
                             "non-negative number of seconds", "kv_transfer_params")
    return None


class PullInFlight:
    """One pull under way: when each end (this replica's ingress, the prefill's egress) has
    landed it, and the request's way into the engine once both have."""

    def __init__(self, pulls: KvPulls, lv: Live, er: Request, src: str, nbytes: float) -> None:
        self.pulls, self.lv, self.er, self.src, self.nbytes = pulls, lv, er, src, nbytes
        self.start_s = lv.arrival_s
        self.ends: dict[str, float] = {}
        """When each end has landed the pull: "ingress" (this port), "egress" (the prefill's)."""

    def landed_on(self, end: str, t: float) -> None:
        """`end` has landed the pull at modelled `t`; with both, the request reaches the engine."""
        ends, lv = self.ends, self.lv
        ends[end] = t
        if len(ends) == 2 and not lv.done:
            if lv.admitted:  # it reached the engine at its ingress landing, ahead of the answer
                if ends["egress"] > ends["ingress"]:
                    self.pulls.h.status.pull_early += 1
                return
            clock = self.pulls.h.clock
            assert clock is not None
            clock.call_at(max(ends.values()), ORDER_ARRIVAL, self.reach_engine)

    def reach_engine(self, t: float, _: Any) -> None:
        """The request reaches the engine at modelled `t`, its pull landed."""
        lv, h = self.lv, self.pulls.h
        if lv.done:
            return
        lv.pull_end_s = t
        h.metrics.kv_transfer.observe(t - self.start_s)
        h.metrics.nixl_xfer_time.observe(t - self.start_s)
        h.metrics.nixl_bytes.observe(self.nbytes)
        h.admit(t, (lv, self.er))

    def ingress_landed(self, t: float, _seconds: float, _shared: bool) -> None:
        """This replica's port has landed the pull (a `KvPort` callback)."""
        lv = self.lv
        lv.pull_id = None
        if "egress" not in self.ends and not lv.done:
            if self.pulls.egress_exclusive.get(self.src, False):
                # The source's egress carried nothing else last time: its price will be this
                # port's; reach the engine now and let nothing stream until the answer says so.
                self.pulls.h.status.pull_speculated += 1
                lv.gated = True
                self.reach_engine(t, None)
            else:  # the answer says whether the request reaches the engine now or later
                self.pulls.hold(lv)
        self.landed_on("ingress", t)
