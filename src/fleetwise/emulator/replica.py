"""`EmulatedReplica`: one engine replica driven by the wall clock, with per-request token streams.

Owns the replica's live requests and their token streams, the metrics it records, the KV leases
of the prefill role and the KV events it publishes. Stepping is the shared `EngineDriver`
(`fleetwise.engine.driver`) on an `AsyncioClock` (`fleetwise.live`): the same step loop as the
simulator's, sleeping to each step's absolute deadline. HTTP is `fleetwise.emulator.app`.

Clock: modelled seconds = wall seconds since start x `time_scale`. A late wake-up never shifts
the steps after it (the clock hands every callback its scheduled time); how late each step end
ran is the deadline overrun (`fleetwise:step_deadline_overrun_seconds`). Every time reported
(metrics, responses) is in modelled seconds.

Steps are single passes (hard horizon 0: no fused decode passes), so every pass emits one token
per decoding request, as a server streams them (`StepOutput.tokens`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fleetwise.core.openai_request import ApiError
from fleetwise.core.request import Request
from fleetwise.core.tokens import block_hashes, digest
from fleetwise.emulator import faults as fault_kinds
from fleetwise.emulator.config import EmulatorConfig
from fleetwise.emulator.generation import OutputLengthModel
from fleetwise.emulator.kv_events import KvEventPublisher
from fleetwise.emulator.kv_format import format_params
from fleetwise.emulator.kv_leases import KvLeases
from fleetwise.emulator.kv_link import KvPort
from fleetwise.emulator.kv_pull import KvPulls, PullClient
from fleetwise.emulator.metrics import ReplicaMetrics
from fleetwise.emulator.protocol import GenRequest
from fleetwise.emulator.running import MAX_RECORDS, Live, ReplicaStatus, output_length, single_passes
from fleetwise.engine.clock import ORDER_ARRIVAL
from fleetwise.engine.driver import DOWN, EngineDriver
from fleetwise.engine.pools import build_pool
from fleetwise.engine.records import StepOutput
from fleetwise.live import AsyncioClock
from fleetwise.perf.kv import kv_shards
from fleetwise.perf.profile import Profile
from fleetwise.perf.roofline import PerfModel
from fleetwise.spec.kv_format import declared_format

WHERE = "emulator"
"""How errors in the emulator's options name their source."""


class EmulatedReplica:
    """One replica: engine + driver on the wall clock + live requests. Call `start()` inside a
    running event loop; `stop()` ends it."""

    def __init__(self, cfg: EmulatorConfig, perf: PerfModel | None = None,
                 on_crash: Callable[[], None] | None = None,
                 kv_pull: PullClient | None = None) -> None:
        self.cfg = cfg
        self.pool = pool = cfg.pool()
        if perf is None:
            perf = PerfModel(Profile.load(cfg.profile) if cfg.profile else None)
        self.perf_model = perf
        self.build = build = build_pool(pool, perf, WHERE)
        self.deployment = build.deployment
        self.block_size = build.config.block_size
        self.kv_format = declared_format(cfg.model_version, cfg.kv_dtype, self.block_size, pool.parallelism.tp,
                                         build.deployment.accelerator)
        """The KV format this replica declares in hand-offs and checks every pull against."""
        self.kv_capacity_tokens = build.kv_capacity_tokens
        self.engine = build.engine(cfg.name)
        self.engine.per_request_outputs = True
        self.engine.enable_kv_events()
        self.max_model_len = build.max_model_len
        """The pool's (`engine.pools.effective_max_model_len`): as given, checked against the context and
        the KV cache as vLLM checks it at start-up; unset, the context lowered to what the KV cache holds."""
        self.lengths = OutputLengthModel(cfg.output_lengths, cfg.seed)
        self.metrics = ReplicaMetrics(cfg.name, self.max_model_len)
        self.metrics.time_scale.set(cfg.time_scale)
        self.events = KvEventPublisher(self.block_size, cfg.kv_events)
        self.faults = fault_kinds.FaultState()
        self.status = ReplicaStatus()
        self._on_crash = on_crash
        self._live: dict[str, Live] = {}
        self.leases = KvLeases(self)
        """Prefill role: the KV held for decode replicas to pull."""
        self.pulls = KvPulls(self, kv_pull)
        """Decode role: the KV pulled from prefill replicas."""
        self._next_eid = 0
        self._fault_timers: dict[tuple[str, int], asyncio.TimerHandle] = {}
        self._aborts: list[Live] = []
        """Requests to drop from the engine at the end of the step in flight."""
        self.kv_port: KvPort | None = None
        """The replica's KV port: a prefill replica's egress, a decode replica's ingress."""
        self.clock: AsyncioClock | None = None
        self.driver: EngineDriver | None = None
        self.created = int(time.time())
        self.origin_unix_s = 0.0
        """Unix time of modelled second 0 (lets a client line up several replicas' records)."""
        self.origin_monotonic_s = 0.0
        """`time.monotonic()` of modelled second 0: the same line-up for clients on this machine,
        immune to the wall clock being stepped or slewed meanwhile."""
        self.records: deque[tuple[Any, ...]] = deque(maxlen=MAX_RECORDS)
        """Finished requests, one tuple of `RECORD_COLUMNS` each (modelled seconds); the most
        recent MAX_RECORDS."""

    # ---- clock -------------------------------------------------------------------------------
    def now_s(self) -> float:
        """Modelled seconds since start."""
        return self.clock.now_s() if self.clock is not None else 0.0

    def time_of(self, monotonic_s: float) -> float:
        """Modelled seconds at `time.monotonic()` second `monotonic_s` (0 before the start)."""
        return max(0.0, self.clock.time_of(monotonic_s)) if self.clock is not None else 0.0

    def _wall_s(self, model_s: float) -> float:
        """Wall seconds of `model_s` modelled seconds."""
        return model_s / self.cfg.time_scale

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the clock and the driver (call inside the running event loop)."""
        if self.driver is not None:
            return
        self.clock = clock = AsyncioClock(1.0 / self.cfg.time_scale, spin=self.cfg.spin)
        # Unix time of the clock's start, read in one go (a preemption between two separate
        # readings would shift every record lined up through it)
        self.origin_monotonic_s = clock.wall_of(0.0)
        self.origin_unix_s = time.time() - (time.monotonic() - self.origin_monotonic_s)
        link = self.cfg.kv_link
        self.kv_port = KvPort(self.clock, link.bytes_per_s * kv_shards(self.deployment), link.latency_s)
        self.driver = EngineDriver(self.engine, self.clock, self._on_output, single_passes, self.build.perf,
                                   pool_name=self.pool.name, accelerator=self.deployment.accelerator.name,
                                   model_version=self.pool.model_version, region=self.pool.region,
                                   kv_capacity_tokens=self.kv_capacity_tokens)
        self._faults_changed()  # a measured step-time factor applies from the first step
        self.events.start()

    async def stop(self) -> None:
        """Stop stepping; requests still in flight fail with 503."""
        if self.driver is not None:
            self.driver.stop(self.now_s())
            self.driver.state = DOWN
        for t in self._fault_timers.values():
            t.cancel()
        self.leases.cancel_timers()
        for live in list(self._live.values()):
            self.fail(live, ApiError(503, "the server is shutting down; retry elsewhere"))
        self.events.close()
        if self.clock is not None:
            self.clock.close()

    def kick(self) -> None:
        """Let the driver schedule a step now (something changed between steps)."""
        if self.driver is not None:
            self.driver.kick(self.now_s())

    # ---- intake --------------------------------------------------------------------------------
    def check_intake(self, req: GenRequest) -> None:
        """Refuse what this replica cannot serve (fault, role, context, memory): ApiError."""
        if self.faults.fail_status is not None:
            raise ApiError(self.faults.fail_status, f"the engine is failing requests (injected fault, status "
                                                    f"{self.faults.fail_status}); retry elsewhere")
        role = self.pool.role
        ktp = req.kv_transfer_params or {}
        if role == "prefill" and not ktp.get("do_remote_decode"):
            raise ApiError(400, "this replica has role prefill: send kv_transfer_params.do_remote_decode=true "
                                "(and max_tokens 1); decoding runs on a decode replica", "kv_transfer_params")
        if role == "decode" and not ktp.get("do_remote_prefill"):
            raise ApiError(400, "this replica has role decode: send the kv_transfer_params a prefill replica "
                                "returned (do_remote_prefill=true, remote_host, remote_port, remote_request_id)",
                           "kv_transfer_params")
        if role == "mixed" and (ktp.get("do_remote_decode") or ktp.get("do_remote_prefill")):
            raise ApiError(400, "this replica has role mixed: kv_transfer_params needs a replica started with "
                                "--role prefill or --role decode", "kv_transfer_params")
        p = len(req.prompt_ids)
        limit = self.max_model_len
        want = p + (req.max_tokens or 1)
        if want > limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{want} tokens ({p} in the prompt, {req.max_tokens or 1} in the completion). "
                                "Please reduce the length of the prompt or max_tokens.",
                           "max_tokens" if req.max_tokens and p < limit else "prompt")

    async def submit(self, req: GenRequest, rid: str, on_live: Callable[[Live], None] | None = None,
                     arrival_s: float | None = None) -> Live:
        """Admit a parsed request (ApiError if refused); tokens then arrive on the returned Live.
        `on_live(live)` runs as soon as the request is accepted, before a decode replica's KV
        pull is answered (so a caller can watch for its client going away meanwhile).
        `arrival_s`: when the request reached the server (modelled s; default now), stamped by
        the caller before it read and parsed the body: the emulation's own parsing and
        tokenizing is wall time that the time scale would multiply, not the modelled server's."""
        self.check_intake(req)
        p = len(req.prompt_ids)
        d = digest(req.prompt_ids)
        if self.pool.role == "prefill":
            target, reason = 1, "length"
        else:
            target, reason = output_length(req, self.max_model_len - p, lambda: self.lengths.draw(d))
        eid = str(self._next_eid)
        self._next_eid += 1
        clock = self.clock
        if clock is None:
            raise ApiError(503, "the engine is not running yet; retry")
        now = self.now_s()
        if arrival_s is not None and 0.0 <= arrival_s < now:
            now = arrival_s
        er = Request(eid, now, p, target, block_hashes(req.prompt_ids, self.block_size), self.block_size)
        if not self.engine.fits(er):
            raise ApiError(400, f"prompt ({p} tokens) plus output ({target} tokens) never fit this replica's KV "
                                f"cache ({self.kv_capacity_tokens} tokens); send a shorter prompt or max_tokens",
                           "prompt")
        live = Live(rid, eid, req, d, target, reason, now)
        self.metrics.req_max_tokens.observe(req.max_tokens or target)
        self.status.requests += 1
        self.events.remember(req.prompt_ids, er.block_hashes)
        self._live[eid] = live
        if on_live is not None:
            on_live(live)
        if self.pool.role == "decode":
            await self.pulls.pull(live, er, req.kv_transfer_params or {})
        else:
            # The request reaches the engine at its arrival on the clock: a step that ends then,
            # or ended before it while the process was late, runs first (as in the simulator).
            clock.call_at(now, ORDER_ARRIVAL, self.admit, (live, er))
        return live

    def admit(self, t: float, arg: tuple[Live, Request]) -> None:
        """Hand a request to the engine at modelled `t` (a clock callback; a pull's landing)."""
        live, er = arg
        if live.done:
            return
        live.admitted = True
        if self.pool.role == "decode":
            self.engine.add_transferred(er)
        else:
            self.engine.add_request(er)
        if self.driver is not None:
            self.driver.kick(t)

    def abort(self, live: Live) -> None:
        """The client went away: drop the request (vLLM aborts it and frees its KV). The engine
        lets go of it between steps: now when idle, else at the end of the step in flight."""
        if live.done:
            return
        live.finish_reason = "abort"
        live.gated = False
        self._drop(live)
        self._live.pop(live.eid, None)
        live.done = True
        self.metrics.success["abort"].inc()
        live.notify()

    def _drop(self, live: Live) -> None:
        """Take `live` out of the KV port and the engine (between steps)."""
        self.pulls.unhold(live)
        if live.pull_id is not None and self.kv_port is not None:
            self.kv_port.cancel(self.now_s(), live.pull_id)
            live.pull_id = None
        if not live.admitted:
            live.done = True  # a pending admission finds it done
            return
        live.admitted = False
        if self.engine.busy:
            self._aborts.append(live)
        else:
            self.engine.abort(live.eid)
            self._update_gauges()
            self.kick()

    def _update_gauges(self) -> None:
        eng, m = self.engine, self.metrics
        m.running.set(eng.num_running)
        m.waiting.set(eng.num_waiting)
        m.kv_usage.set(eng.kv_usage)

    def _on_output(self, driver: EngineDriver, end: float, start: float, out: StepOutput) -> None:
        """A step ended at `end` (modelled s): stream its tokens, finish and hand off requests.
        What a client waits on goes first (hand-off answers, then first tokens, then the rest of
        the batch's tokens); the counters and metrics follow, after the sockets were written."""
        late = self.now_s() - end
        if late < 0.0:
            late = 0.0
        st = self.status
        dur = end - start
        st.steps += 1
        st.busy_s += dur
        st.overrun_sum_s += late
        live_of = self._live
        started = []
        for eid, _ in out.scheduled:
            lv = live_of.get(eid)
            if lv is not None and lv.sched_s is None:
                lv.sched_s = start
                started.append(lv)
        for eid in out.handoffs:
            lv = live_of.pop(eid, None)
            if lv is not None:
                self._handoff(lv, end)
        if out.tokens:
            self._stream_tokens(out.tokens, end)
        for eid in out.finished:
            lv = live_of.pop(eid, None)
            if lv is not None:
                self._finish(lv, end)
        self._step_metrics(driver, out, late, dur, started)
        eng = self.engine
        if self._aborts:
            for lv in self._aborts:
                eng.abort(lv.eid)
            self._aborts.clear()
        self._update_gauges()
        if out.kv_events:
            self.events.publish(end, out.kv_events)

    def _stream_tokens(self, tokens: list[tuple[str, int]], end: float) -> None:
        """Emit a step's tokens (engine id, count) at modelled `end`, first tokens first: each
        emission wakes its stream in this order, and a stream's first chunk is what its client's
        TTFT waits for."""
        live_of = self._live
        later = []
        for eid, k in tokens:
            lv = live_of.get(eid)
            if lv is not None:
                if lv.first_token_s is None:
                    self._emit(lv, lv.emitted + k, end)
                else:
                    later.append((lv, k))
        for lv, k in later:
            self._emit(lv, lv.emitted + k, end)

    def _step_metrics(self, driver: EngineDriver, out: StepOutput, late: float, dur: float,
                      started: list[Live]) -> None:
        """Count a step that ran `dur` modelled seconds and ended `late` seconds past its deadline."""
        st, m = self.status, self.metrics
        if late > st.overrun_max_s:
            st.overrun_max_s = late
            m.overrun_max.set(late)
        m.overrun.observe(late)
        m.steps.inc()
        m.busy.inc(dur)
        step = driver.step
        if step is not None:
            m.iteration_tokens.observe(step.prefill_tokens + step.decode_tokens)
        for lv in started:
            m.prefix_queries.inc(len(lv.req.prompt_ids))
        if out.prefix_hit_tokens:
            m.prefix_hits.inc(out.prefix_hit_tokens)
        if out.preempted:
            m.preemptions.inc(len(out.preempted))
        if out.tokens_generated:
            m.generation_tokens.inc(out.tokens_generated)

    def _emit(self, lv: Live, n: int, t: float) -> None:
        first = lv.first_token_s is None
        prev, last = lv.emitted, lv.last_token_s
        if first:
            lv.first_token_s = t
            lv.first_token_seen_s = self.now_s()
        lv.last_token_s = t
        lv.emitted = n
        lv.notify()
        m = self.metrics
        if first:
            m.ttft.observe(t - lv.arrival_s)
            m.prompt_tokens.inc(len(lv.req.prompt_ids))
            if lv.sched_s is not None:
                m.queue.observe(lv.sched_s - lv.arrival_s)
                m.prefill_time.observe(t - lv.sched_s)
            k = n - prev - 1
        else:
            k = n - prev
            gap = t - last
            for _ in range(k):
                m.itl.observe(gap)
            k = 0
        if k > 0:  # several tokens at once (a re-prefill after preemption): zero gaps after the first
            for _ in range(k):
                m.itl.observe(0.0)

    def _finish(self, lv: Live, t: float) -> None:
        self.records.append((lv.rid, lv.arrival_s, lv.first_token_s, t, len(lv.req.prompt_ids), lv.emitted,
                             lv.finish_reason, lv.sched_s, lv.pull_start_s, lv.pull_end_s, self.now_s(),
                             lv.first_token_seen_s))
        lv.finish_s = t
        lv.done = True
        lv.notify()
        m = self.metrics
        m.e2e.observe(t - lv.arrival_s)
        m.req_prompt_tokens.observe(len(lv.req.prompt_ids))
        m.req_generation_tokens.observe(lv.target)
        first = lv.first_token_s if lv.first_token_s is not None else t
        m.decode_time.observe(t - first)
        if lv.sched_s is not None:
            m.inference_time.observe(t - lv.sched_s)
        if lv.target > 1:
            m.tpot.observe((t - first) / (lv.target - 1))
        m.success[lv.finish_reason].inc()

    def fail(self, lv: Live, err: ApiError) -> None:
        """Drop `lv` and answer its client with `err`."""
        self.pulls.unhold(lv)
        lv.gated = False
        if not lv.done:
            self._drop(lv)
        self._live.pop(lv.eid, None)
        lv.error = err
        lv.done = True
        lv.notify()

    # ---- prefill/decode disaggregation ------------------------------------------------------------
    def _handoff(self, lv: Live, t: float) -> None:
        """Prefill role: the prompt is computed; keep its KV under a lease and answer with the
        parameters a decode replica needs to pull it (vLLM's NIXL connector fields)."""
        n_blocks = -(-len(lv.req.prompt_ids) // self.block_size)
        lv.kv_transfer_params = {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_block_ids": list(range(n_blocks)), "remote_engine_id": self.cfg.engine_id,
            "remote_host": self.cfg.host, "remote_port": self.cfg.port, "remote_request_id": lv.rid,
            "tp_size": self.pool.parallelism.tp, "pp_size": self.pool.parallelism.pp, **format_params(self.kv_format),
        }
        self.leases.hold(lv, t)
        self._emit(lv, 1, t)
        self._finish(lv, t)

    async def serve_pull(self, body: dict[str, Any]) -> dict[str, Any]:
        """Prefill role: a decode replica pulls a leased request's KV (`KvLeases.serve_pull`)."""
        return await self.leases.serve_pull(body)

    def kv_port_name(self) -> str:
        """This replica's KV port as its peers name it (`engine_id@host:port`)."""
        return f"{self.cfg.engine_id}@{self.cfg.host}:{self.cfg.port}"

    # ---- faults ---------------------------------------------------------------------------------
    def inject(self, body: dict[str, Any]) -> dict[str, Any]:
        """Apply an admin fault body; returns the active faults. FaultError for a bad body."""
        kind, params = fault_kinds.parse(body)
        st = self.faults
        if kind is None:
            fault_kinds.clear_all(st)
            for t in self._fault_timers.values():
                t.cancel()
            self._fault_timers.clear()
            self._faults_changed()
        else:  # one more instance: overlapping faults of a kind compose (`FaultKind.compose`)
            actions = fault_kinds.FaultActions(crash=self._crash, changed=self.kick)
            instance = kind.apply(st, params, actions)
            self._faults_changed()
            if params.duration_s is not None:
                loop = asyncio.get_running_loop()
                self._fault_timers[(kind.name, instance)] = loop.call_later(
                    self._wall_s(params.duration_s), self._clear_instance, kind.name, instance)
        self.kick()
        return {"active": dict(st.active)}

    def _clear_instance(self, name: str, instance: int) -> None:
        self._fault_timers.pop((name, instance), None)
        fault_kinds.clear_one(self.faults, name, instance)
        self._faults_changed()

    def _faults_changed(self) -> None:
        """Apply the fault state to the driver and the KV port: step-time factor, the port's
        bandwidth factor, hang (stops stepping at the end of the step in flight, as the
        simulator's hang does: `EngineDriver.stalled`)."""
        d = self.driver
        if d is None:
            return
        factor = self.cfg.step_time_factor * self.faults.slowdown  # the fleet's measured speed, then faults
        if d.slowdown != factor:
            d.slowdown = factor
        port = self.kv_port
        if port is not None and port.factor != self.faults.kv_link_factor:
            port.set_factor(self.now_s(), self.faults.kv_link_factor)
        if d.stalled != self.faults.hung:
            d.stalled = self.faults.hung
            if not d.stalled:
                self.kick()

    def _crash(self) -> None:
        if self._on_crash is not None:
            self._on_crash()
