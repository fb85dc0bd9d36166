"""`simulate()`: the one entry point that replays requests against a plan's fleet in virtual time.

Owns the request lifecycle: arrival -> routing -> (prefill -> KV transfer ->) decode -> finish
or failure, the feedback a routing policy hears, and assembling `SimResult`. The fleet steps
engines (`fleet.py`), the network moves KV (`network.py`), faults act through `faults.py`.

Routing modes:
- `feedback_delay_s == 0`: every arrival is routed at its time on a fresh view, with feedback
  delivered as it happens (exact; engines fuse decode passes only up to the next arrival).
- `feedback_delay_s > 0`: every `feedback_delay_s` the view is refreshed, the buffered feedback
  is delivered (the last interval's at the end), and all arrivals of the coming interval are
  routed on that view (`reported_at_s` is the refresh time). Engines then know their own next
  arrival, so they fuse decode passes across other replicas' arrivals: the fast mode for large runs.
A KV transfer landing on a decode replica in the middle of a fused step joins at its end. This
module alone in the simulator reads the wall clock, to report `sim_wall_s`.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetwise.core.feedback import (
    Cancelled,
    Completed,
    Dispatched,
    Failed,
    Feedback,
    FirstToken,
    KvEvicted,
    KvStored,
)
from fleetwise.core.request import Request
from fleetwise.core.views import FleetView, KvLinkView, RouteRequest
from fleetwise.engine.api import StepOutput
from fleetwise.perf.kv import handoff_extra_s, kv_shards
from fleetwise.perf.profile import Profile
from fleetwise.perf.roofline import PerfModel
from fleetwise.routing.base import RoutingPolicy
from fleetwise.routing.plugins import SCORERS
from fleetwise.routing.registry import make_policy
from fleetwise.routing.score_rows import winning_scores
from fleetwise.sim.columns import Records
from fleetwise.sim.events import Arrival, EventLoop, Priority, RoutedArrival, RouteTick, Sample
from fleetwise.sim.faults import FaultInjector
from fleetwise.sim.fleet import DOWN, Fleet, Replica
from fleetwise.sim.network import KvNetwork, TransferRecord
from fleetwise.sim.recording import StepRecorder
from fleetwise.sim.recovery import Recovery
from fleetwise.sim.results import SimResult, summarize
from fleetwise.spec.context import leg_tokens
from fleetwise.spec.faults import FaultScenario
from fleetwise.spec.kv_format import kv_compat
from fleetwise.spec.plan import PlanSpec
from fleetwise.spec.slo import SLOSpec

MAX_MODEL_LEN_REASON = "rejected_max_model_len"
"""Failure reason of a request longer than the fleet's max_model_len (refused on arrival, never routed)."""
MAX_SERIES = 256
"""Queue-length series longer than this are halved (every other point), keeping them bounded."""
RUN_GC_THRESHOLDS = (100_000, 50, 100)
"""Cyclic collector thresholds while a run's events are processed (restored after). A run makes
small objects by the million and keeps the requests and records alive throughout; with Python's
defaults (700, 10, 10) the collector rescans them over and over: 12-18% of the CPU of the busy
100k-request run (benchmarks/sim_speed.py; results are the same either way). Everything alive when
the events start (the requests, their records, the fleet) is also frozen for the run (`gc.freeze`:
out of every generation the collector scans, and back after): about 8% of the long-output row's CPU."""


@dataclass(frozen=True)
class SimOptions:
    """How to run: seed, SLO for goodput, router feedback delay, progress bar, recording."""

    seed: int = 0
    slo: SLOSpec = field(default_factory=SLOSpec)
    feedback_delay_s: float = 0.0
    """0 = exact (route each arrival on a fresh view); > 0 = periodic view refresh (fast)."""
    progress: bool = False
    """Show a rich progress bar (virtual time over the last arrival)."""
    sample_interval_s: float | None = None
    """Queue-length/KV sampling period; None = span of arrivals / 128."""
    on_progress: Callable[[float, float], None] | None = None
    """Called with (virtual now, last arrival) every few thousand events."""
    policy: RoutingPolicy | None = None
    """A policy object to drive instead of building one from `plan.routing` (e.g. to record its
    decisions, or to run the very object a gateway uses)."""
    perf: PerfModel | None = None
    """The perf model every engine's step times come from (None: built from `plan.perf_profile`);
    pass the planner's or the emulator's object to price steps with the very same model."""
    recorder: StepRecorder | None = None
    """Record every engine step and KV transfer (for a trace export); None = no recording cost."""
    replica_series: bool = True
    """Put each replica's sampled time series in the summary (`per_replica[].queue_length`,
    `running`, `kv_usage_series`); False leaves them out, for a caller that reads none of them
    (the planner: about 0.5 ms of rounding per replica and run)."""


class Simulation:
    """One run's state: loop, fleet, network, policy, records."""

    def __init__(self, plan: PlanSpec, requests: list[Request], faults: FaultScenario | None,
                 opts: SimOptions) -> None:
        self.plan, self.opts = plan, opts
        self.reqs = sorted(requests, key=lambda r: r.arrival_s)  # stable: ties keep the input order
        self.rec = Records(self.reqs)
        self.index = {r.request_id: i for i, r in enumerate(self.reqs)}
        self.loop = EventLoop()
        perf = opts.perf if opts.perf is not None else plan_perf(plan)
        on_output = self._on_output if opts.recorder is None else self._on_output_recorded
        self.fleet = Fleet(plan, self.loop, perf, on_output, self._horizon)
        self.reps = self.fleet.replicas
        self.policy = opts.policy if opts.policy is not None else make_policy(plan.routing, seed=opts.seed)
        self.delay = opts.feedback_delay_s
        safe = getattr(self.policy, "safe", None)  # an unchanged replica's view is as fresh as its refresh
        for r in self.reps:
            r.view_max_age_s = safe.spec.stale_after_s if safe is not None else math.inf
        if getattr(self.policy, "wants_kv_events", False):
            for r in self.reps:
                r.engine.enable_kv_events()
        self.net = KvNetwork(self.loop, plan.kv_link.latency_s, self._on_transfer)
        if plan.disaggregated:
            for r in self.reps:
                # One NIC per KV shard: TP ranks and PP stages send their slices in parallel.
                r.port = self.net.add_port(r.name, plan.kv_link.bytes_per_s * kv_shards(r.deployment))
        self.prefill_reps = [r for r in self.reps if r.role == "prefill"]
        self.disaggregated = plan.disaggregated
        self.client_region = plan.regions.clients or plan.pools[0].region
        """Region of the clients of requests that name none."""
        self.cross_region_rtt_s = 2 * plan.regions.latency_s
        self.link_pairs = [(p.name, p.port, d.name, d.port, _extra_per_byte(p, d)) for p in self.prefill_reps
                           for d in self.reps if d.role == "decode"]
        """Every prefill -> decode KV path the router may pick, as `KvNetwork.link_views` takes them
        (with the seconds per byte a pair that is not direct adds: staging copies, conversion)."""
        self.links: tuple[KvLinkView, ...] = ()
        self.scorer_names = tuple(SCORERS)
        """Scorers whose per-worker parts a decision may carry (for the records' decision column)."""
        self.cursor = 0  # next request to arrive (exact mode) or to route (delayed mode)
        self.next_tick_s = math.inf
        self.refreshed_s = -math.inf  # delayed mode: the last `_refresh_delayed`
        self.view: tuple[Any, ...] = ()
        self.view_frozen = False
        self.stalls = 0  # `stale_view` faults in force: the view refreshes again when the last one ends
        self.fb_buffer: list[Feedback] = []
        self.itl_gaps: list[float] = []
        self.itl_counts: list[int] = []
        self.faults = FaultInjector(self, faults)
        self.recovery = Recovery(self, plan.failure_domains)
        last = self.reqs[-1].arrival_s if self.reqs else 0.0
        self.last_arrival_s = last
        self.sample_s = opts.sample_interval_s or max(last / 128, 1e-3)
        self.loop.on(Arrival, self._on_arrival)
        self.loop.on(RoutedArrival, self._on_routed_arrival)
        self.loop.on(RouteTick, self._on_tick)
        self.loop.on(Sample, self._on_sample)

    # ---- feedback ----------------------------------------------------------------------------
    def feedback(self, fb: Feedback) -> None:
        """Report `fb` to the policy now (exact mode) or at the next view refresh (delayed mode)."""
        if self.delay > 0:
            self.fb_buffer.append(fb)
        else:
            self.policy.observe(fb)

    # ---- what faults act on (`fleetwise.sim.fault_api.FaultTarget`) ---------------------------------
    def request_id(self, i: int) -> str:
        """The id of request index `i`."""
        return self.reqs[i].request_id

    def awaiting_kv(self, i: int) -> bool:
        """Request `i` was routed to a decode replica whose KV has not landed yet."""
        return math.isnan(self.rec.kv_end_s[i])

    def lost(self, i: int, now_s: float, reason: str, streamed: int) -> None:
        """Request `i` lost its replica after `streamed` output tokens: recovery decides."""
        self.recovery.lost(i, now_s, reason, streamed)

    def refuse(self, replica: int, refusing: bool) -> None:
        """Replica index `replica` starts (True) or stops refusing new requests (a decode replica: new KV)."""
        self.recovery.refuse(replica, refusing)

    def freeze_view(self, frozen: bool, now_s: float) -> None:
        """One more stall keeps the router's fleet view (True), one fewer (False): it refreshes when
        none is left. A stall before the first decision keeps the fleet as it is at `now_s` (a
        router knows its replicas before its control plane stalls; an empty view rejects all)."""
        if frozen and not self.view:
            self._refresh_view(now_s)
        self.stalls += 1 if frozen else -1
        self.view_frozen = self.stalls > 0

    # ---- arrivals and routing --------------------------------------------------------------------
    def start(self) -> None:
        if self.reqs:
            first = self.reqs[0].arrival_s
            if self.delay > 0:
                self.loop.push(first, Priority.ROUTE, RouteTick())
            else:
                self.loop.push(first, Priority.ARRIVAL, Arrival(0))
            self.loop.push(first, Priority.SAMPLE, Sample())
        self.faults.schedule()

    def _on_arrival(self, now_s: float, ev: Arrival) -> None:
        i = ev.index
        if i + 1 < len(self.reqs):
            self.loop.push(self.reqs[i + 1].arrival_s, Priority.ARRIVAL, Arrival(i + 1))
        self.cursor = i + 1
        self.route_and_dispatch(i, now_s)

    def _refresh_delayed(self, now_s: float) -> None:
        """Delayed mode's refresh (a tick, or a decision no tick covers: no decision routes on
        feedback older than `feedback_delay_s`): deliver the buffered feedback, take a new view."""
        observe = self.policy.observe
        for fb in self.fb_buffer:
            observe(fb)
        self.fb_buffer.clear()
        self.refreshed_s = now_s
        if not self.view_frozen:
            self._refresh_view(now_s)

    def _on_tick(self, now_s: float, ev: RouteTick) -> None:
        self._refresh_delayed(now_s)
        end = now_s + self.delay
        reqs, n, reps, loop = self.reqs, len(self.reqs), self.reps, self.loop  # `loop.push`: a native call
        while self.cursor < n and reqs[self.cursor].arrival_s < end:
            i = self.cursor
            self.cursor += 1
            t = reqs[i].arrival_s
            route = self._decide(i, t)
            if route is not None:
                w, p = route
                reps[p if p >= 0 else w].pending.append(t)
                loop.push(t, Priority.ARRIVAL, RoutedArrival(i, w, p))
        if self.cursor < n:
            self.next_tick_s = max(end, reqs[self.cursor].arrival_s) if not self.view_frozen else end
            self.loop.push(self.next_tick_s, Priority.ROUTE, RouteTick())
        else:
            self.next_tick_s = math.inf

    def _decide(self, i: int, now_s: float) -> tuple[int, int] | None:
        """Ask the policy; returns (worker, prefill worker or -1), or None after failing the request."""
        r = self.recovery.request(i)
        if r.prompt_tokens + r.output_tokens > self.fleet.max_model_len:  # vLLM's 400, before any routing
            self.fail(i, now_s, f"{MAX_MODEL_LEN_REASON}: {r.prompt_tokens + r.output_tokens:,} prompt + output "
                                f"tokens > max_model_len {self.fleet.max_model_len:,}", None)
            return None
        if self.fleet.max_prefill_len and leg_tokens(r.prompt_tokens, r.output_tokens, True) > self.fleet.max_prefill_len:
            self.fail(i, now_s, f"{MAX_MODEL_LEN_REASON}: {r.prompt_tokens:,} prompt tokens + 1 > the prefill "
                                f"pools' max_model_len {self.fleet.max_prefill_len:,}", None)
            return None
        if self.delay == 0:
            if not self.view_frozen:
                self._refresh_view(now_s)
        elif now_s - self.refreshed_s >= self.delay:  # no tick covers it (a recovery after the last arrival)
            self._refresh_delayed(now_s)
        rr = RouteRequest(r.request_id, r.prompt_tokens, r.max_tokens, r.block_hashes, r.tenant,
                          r.model_version, r.region, r.arrival_s, r.hash_block_tokens)
        d = self.policy.route(rr, FleetView(now_s, self.view, self.links))
        w = self.fleet.by_name.get(d.worker) if d.worker is not None else None
        p = self.fleet.by_name.get(d.prefill_worker, -1) if d.prefill_worker is not None else -1
        if w is None or (self.disaggregated and p < 0):
            if d.worker is not None:  # a decision this fleet cannot carry out: release its reservation
                self.feedback(Cancelled(now_s, rr.request_id, d.worker, "unknown worker"))
            self.rec.decision[i] = d.kind
            why = d.reason or "no worker"  # a policy's own rejection reason already starts "rejected"
            self.fail(i, now_s, why if why.startswith("rejected") else f"rejected: {why}", None)
            return None
        self.rec.dispatch_s[i] = now_s
        self.rec.worker[i], self.rec.prefill_worker[i] = w, p
        if self.cross_region_rtt_s:
            far = (r.region or self.client_region) != self.reps[w].region
            self.rec.network_s[i] = self.cross_region_rtt_s if far else 0.0
        self.rec.decision[i] = d.kind
        self.rec.decision_scores[i] = winning_scores(d, self.scorer_names)
        self.recovery.routed(i)
        self.feedback(Dispatched(now_s, rr.request_id, self.reps[w].name, r.prompt_tokens, r.block_hashes,
                                 self.reps[p].name if p >= 0 else None))
        return w, p

    def _refresh_view(self, now_s: float) -> None:
        """What the router sees now: every replica's view and, in a P/D fleet, every KV path."""
        self.view = self.fleet.workers(now_s)
        if self.link_pairs:
            self.links = self.net.link_views(self.link_pairs)

    def route_and_dispatch(self, i: int, now_s: float) -> None:
        route = self._decide(i, now_s)
        if route is not None:
            self.dispatch(i, now_s, *route)

    def _on_routed_arrival(self, now_s: float, ev: RoutedArrival) -> None:
        rep = self.reps[ev.prefill_engine if ev.prefill_engine >= 0 else ev.engine]
        if rep.pending:
            rep.pending.popleft()
        self.dispatch(ev.index, now_s, ev.engine, ev.prefill_engine)

    def dispatch(self, i: int, now_s: float, w: int, p: int) -> None:
        """Hand request i to its (prefill) replica; fail or retry it when that replica is gone."""
        first = self.reps[p if p >= 0 else w]
        dec = self.reps[w]
        if first.state == DOWN or dec.state == DOWN:
            self.recovery.lost(i, now_s, "replica_unavailable", kv_ready=False)
            return
        if self.recovery.refusing and self.recovery.refuses(first):  # a fail_requests fault
            self.recovery.lost(i, now_s, "replica_refused", kv_ready=False)
            return
        first.inflight.add(i)
        dec.inflight.add(i)
        first.stats.requests += 1
        if p >= 0:
            dec.stats.requests += 1
        first.engine.add_request(self.recovery.request(i))
        if first.busy:
            self.fleet.cut(first, now_s)
        self.fleet.kick(first, now_s)

    # ---- engine outputs --------------------------------------------------------------------------
    def _on_output(self, rep: Replica, now_s: float, start_s: float, out: StepOutput) -> None:
        rec, index = self.rec, self.index
        if out.preempted:
            rep.stats.preemptions += len(out.preempted)
        if out.scheduled:
            self._on_scheduled(rep, start_s, out.scheduled)
        for rid, off in out.first_tokens:
            i = index[rid]
            if rec.worker[i] != rep.idx or not math.isnan(rec.first_token_s[i]):
                continue  # another replica's token, or the prefill replica already streamed it
            t = start_s + off
            rec.first_token_s[i] = t
            if rep.role == "mixed":
                rec.prefill_end_s[i] = t
            self.feedback(FirstToken(t, rid, rep.name, t - self.reqs[i].arrival_s))
        for rid in out.finished:
            self._finish(index[rid], rep, now_s)
        for rid in out.handoffs:
            self._handoff(index[rid], rep, now_s)
        if out.itl_samples:
            for gap, cnt in out.itl_samples:
                self.itl_gaps.append(gap)
                self.itl_counts.append(cnt)
        if out.kv_events:
            self._kv_feedback(rep, now_s, out.kv_events)
        if out.finished or out.handoffs:
            self.faults.on_replica_progress(rep, now_s)

    def _on_output_recorded(self, rep: Replica, now_s: float, start_s: float, out: StepOutput) -> None:
        assert self.opts.recorder is not None
        self.opts.recorder.on_step(rep, start_s, now_s, out, self.rec)
        self._on_output(rep, now_s, start_s, out)

    def _kv_feedback(self, rep: Replica, now_s: float, events: list[tuple[bool, int]]) -> None:
        """Forward a step's KV events to the policy: each run of stores or evictions as one
        `KvStored`/`KvEvicted`, in order."""
        start = 0
        for k in range(1, len(events) + 1):
            if k == len(events) or events[k][0] != events[start][0]:
                hashes = tuple(h for _, h in events[start:k])
                self.feedback(KvStored(now_s, rep.name, hashes) if events[start][0]
                              else KvEvicted(now_s, rep.name, hashes))
                start = k

    def _on_scheduled(self, rep: Replica, start_s: float, scheduled: list[tuple[str, float]]) -> None:
        """Prompts first scheduled on `rep` (their first replica: prefill, or mixed) start now."""
        rec, index = self.rec, self.index
        for rid, off in scheduled:
            i = index[rid]
            p = rec.prefill_worker[i]
            if (p if p >= 0 else rec.worker[i]) == rep.idx:
                rec.prefill_start_s[i] = start_s + off

    def _finish(self, i: int, rep: Replica, now_s: float) -> None:
        rec = self.rec
        if rec.worker[i] != rep.idx or i in rec.failure:
            return
        rep.inflight.discard(i)
        r = self.reqs[i]
        rec.finish_s[i] = now_s
        rec.tokens[i] = r.output_tokens
        n = r.output_tokens
        tpot = (now_s - rec.first_token_s[i]) / (n - 1) if n > 1 else 0.0
        self.feedback(Completed(now_s, r.request_id, rep.name, n, tpot, now_s - r.arrival_s))

    def _handoff(self, i: int, rep: Replica, now_s: float) -> None:
        rec = self.rec
        if rec.prefill_worker[i] != rep.idx or i in rec.failure:
            rep.engine.release(self.reqs[i].request_id)
            rep.inflight.discard(i)
            self.fleet.kick(rep, now_s)
            return
        rec.prefill_end_s[i] = now_s
        dec = self.reps[rec.worker[i]]
        if self.plan.pd_first_token == "prefill" and self._first_token_at_prefill(i, rep, now_s):
            return
        if dec.state == DOWN or self.recovery.refuses(dec):
            # Decode admission failed: the KV is freed at once and the request goes to recovery.
            self.release_prefill(rep, i, now_s)
            self.recovery.lost(i, now_s, "decode_lost" if dec.state == DOWN else "decode_pool_full")
            return
        compat, direct = self.fleet.kv_compat(rep, dec)
        if not compat.ok:
            # The decode side cannot read this KV (another model version, no common format): it
            # refuses the hand-off, the KV is freed and recovery prefills the request again (or
            # fails it); on version skew, pinned to the refusing replica's version.
            self.release_prefill(rep, i, now_s)
            skew = dec.model_version != rep.model_version
            if skew:
                self.reqs[i] = dataclasses.replace(self.reqs[i], model_version=dec.model_version)
            self.recovery.lost(i, now_s, "kv_version_skew" if skew else "kv_format_mismatch")
            return
        rec.kv_start_s[i] = now_s
        nbytes = dec.kv_bytes(self.recovery.request(i).prompt_tokens)
        self.recovery.open_lease(i, rep, now_s, nbytes)
        extra = 0.0 if direct else handoff_extra_s(nbytes, compat, rep.deployment, dec.deployment)
        tid = self.net.start(now_s, self.recovery.tag(i), rep.port, dec.port, nbytes, extra)
        if i in self.recovery.leases:  # a transfer refused at start has ended the lease already
            self.recovery.leases[i].transfer = tid

    def release_prefill(self, rep: Replica, i: int, now_s: float) -> None:
        """The prefill replica frees request i's KV (transferred, or given up)."""
        if rep.state != DOWN:
            rep.engine.release(self.reqs[i].request_id)
            rep.inflight.discard(i)
            self.fleet.kick(rep, now_s)
            self.faults.on_replica_progress(rep, now_s)  # a draining prefill replica may now be empty

    def _first_token_at_prefill(self, i: int, rep: Replica, now_s: float) -> bool:
        """The prefill replica streams the first token now; True when that was the only token
        (the request is done and its KV need not move)."""
        r, rec = self.recovery.request(i), self.rec
        self.recovery.prefill_token[i] = 1
        if math.isnan(rec.first_token_s[i]):  # a migration's continuation has streamed before
            rec.first_token_s[i] = now_s
            self.feedback(FirstToken(now_s, r.request_id, rep.name, now_s - r.arrival_s))
        if r.output_tokens > 1:
            return False
        rep.engine.release(r.request_id)
        rep.inflight.discard(i)
        self.fleet.kick(rep, now_s)
        self._finish(i, self.reps[rec.worker[i]], now_s)
        return True

    def _on_transfer(self, now_s: float, tag: int, tr: TransferRecord) -> None:
        i, attempt = self.recovery.untag(tag)
        rec = self.rec
        current = attempt == rec.retries[i]
        src = self.reps[tr.src]  # ports are numbered like replicas
        self.release_prefill(src, i, now_s)
        if not current or i in rec.failure:
            return
        dec = self.reps[rec.worker[i]]
        if not tr.ok or dec.state == DOWN:
            reason = ("prefill_lost" if src.state == DOWN else "decode_lost" if dec.state == DOWN
                      else "kv_transfer_failed")
            self.recovery.lost(i, now_s, reason)
            return
        self.recovery.ack(i)
        rec.kv_end_s[i] = now_s
        r = self.recovery.request(i)
        if self.plan.pd_first_token == "prefill":  # the first token was streamed by the prefill
            r = dataclasses.replace(r, output_tokens=r.output_tokens - 1)
        dec.engine.add_transferred(r)
        self.fleet.kick(dec, now_s)

    # ---- failures ------------------------------------------------------------------------------
    def fail(self, i: int, now_s: float, reason: str, rep: Replica | None) -> None:
        if i in self.rec.failure:
            return
        self.rec.failure[i] = reason
        touched = [rep] if rep is not None else []
        touched += [self.reps[k] for k in (self.rec.worker[i], self.rec.prefill_worker[i]) if k >= 0]
        for r in touched:
            r.inflight.discard(i)
            self.faults.on_replica_progress(r, now_s)
        w = self.rec.worker[i]
        name = self.reps[w].name if w >= 0 else ""
        self.feedback(Failed(now_s, self.reqs[i].request_id, name, reason))

    # ---- scheduling horizon ------------------------------------------------------------------------
    def _horizon(self, rep: Replica, now_s: float) -> tuple[float, float]:
        """How long `rep` may fuse decode passes: (hard, soft) seconds from now.

        Delayed mode, mixed and prefill replicas: work reaches them only at their own routed
        arrivals (soft: the pass it falls in ends the step; an arrival routed later, or a retry,
        cuts the step short through `Fleet.cut`); faults are hard. Otherwise (exact mode, where
        every arrival is a routing decision, and decode replicas, whose KV landings are not
        known in advance) the old bound applies as a hard horizon: the next thing that could
        add work.
        """
        if self.delay > 0 and rep.role != "decode":
            soft = rep.pending[0] - now_s if rep.pending else math.inf
            return self.faults.next_time_s - now_s, soft
        if self.delay > 0:
            nxt = self.next_tick_s
        else:
            nxt = self.reqs[self.cursor].arrival_s if self.cursor < len(self.reqs) else math.inf
        nxt = min(nxt, self.faults.next_time_s)
        if rep.role == "decode":
            for p in self.prefill_reps:
                if p.busy:
                    nxt = min(nxt, p.step_start_s + p.step_dur_s)
            nxt = min(nxt, self.net.next_end_s())
        return nxt - now_s, math.inf

    # ---- sampling ----------------------------------------------------------------------------------
    def _on_sample(self, now_s: float, ev: Sample) -> None:
        for r in self.reps:
            e = r.engine
            kv = r.kv_usage_now(now_s)
            r.stats.queue_series.append((now_s, e.num_waiting, e.num_running, kv))
            r.stats.kv_usage_samples.append(kv)
            if len(r.stats.queue_series) > MAX_SERIES:
                del r.stats.queue_series[1::2]
        if len(self.reps) and len(self.reps[0].stats.queue_series) >= MAX_SERIES:
            self.sample_s *= 2
        # Keep sampling while work remains and something is still scheduled to happen: with no
        # other event pending nothing can change any more (see `_fail_unfinished`).
        if len(self.loop) and (self.cursor < len(self.reqs) or any(r.inflight for r in self.reps)):
            self.loop.push(now_s + self.sample_s, Priority.SAMPLE, Sample())


def plan_perf(plan: PlanSpec) -> PerfModel:
    """The perf model a plan names: its `perf_profile` loaded, or the uncalibrated roofline."""
    return PerfModel(Profile.load(plan.perf_profile) if plan.perf_profile else None)


def _extra_per_byte(p: Replica, d: Replica) -> float:
    """Seconds per KV byte a hand-off p -> d spends beyond the link (0 for a direct pair)."""
    compat = kv_compat(p.format_now(), d.format_now())
    return 0.0 if compat.direct or not compat.ok else handoff_extra_s(1.0, compat, p.deployment, d.deployment)


def simulate(plan: PlanSpec, requests: list[Request], faults: FaultScenario | None = None,
             options: SimOptions | None = None) -> SimResult:
    """Replay `requests` against `plan`'s fleet (with `faults`); deterministic for fixed inputs."""
    return simulate_kept(plan, requests, faults, options)[0]


def simulate_kept(plan: PlanSpec, requests: list[Request], faults: FaultScenario | None = None,
                  options: SimOptions | None = None) -> tuple[SimResult, Simulation]:
    """`simulate`, also returning the finished `Simulation` (the fleet's end state, for checks)."""
    opts, wall0 = options or SimOptions(), time.perf_counter()
    sim = Simulation(plan, requests, faults, opts)
    sim.start()
    thresholds = gc.get_threshold()
    gc.set_threshold(*RUN_GC_THRESHOLDS)
    freeze = gc.get_freeze_count() == 0  # a caller's own frozen objects are left as they are
    if freeze:
        gc.freeze()
    try:
        _run(sim, opts)
    finally:
        if freeze:
            gc.unfreeze()
        gc.set_threshold(*thresholds)
    _fail_unfinished(sim)
    if sim.delay > 0:  # the last interval's feedback: the router's report ends with nothing in flight
        sim._refresh_delayed(sim.loop.time_s)
    for r in sim.reps:
        r.stats.prefix_hit_rate = float(r.engine.prefix_hit_rate)
        r.stats.busy_s = r.busy_s
    itl = (np.asarray(sim.itl_gaps, dtype=np.float64), np.asarray(sim.itl_counts, dtype=np.int64))
    extra = {"plan": plan.name, "disaggregated": plan.disaggregated, "feedback_delay_s": opts.feedback_delay_s,
             "faults": sim.faults.report(), "events_processed": sim.loop.processed,
             "failure_domains": sim.recovery.report()}
    summary = summarize(sim.rec, [r.stats for r in sim.reps], sim.net.records, itl, opts.slo,
                        sim.policy.report(), opts.seed, extra, opts.replica_series)
    summary["sim_wall_s"] = round(time.perf_counter() - wall0, 3)
    if opts.recorder is not None:
        opts.recorder.transfers.extend(sim.net.records)
    return SimResult(summary, sim.rec, sim.fleet.names, sum(r.engine.stats.steps for r in sim.reps),
                     sum(r.engine.stats.passes for r in sim.reps)), sim


def _fail_unfinished(sim: Simulation) -> None:
    """No request is lost silently: one still held when the events run out (a replica that
    never came back, a stalled engine) is recorded as failed at the end time."""
    rec, end = sim.rec, sim.loop.time_s
    for i in range(len(sim.reqs)):
        if math.isnan(rec.finish_s[i]) and i not in rec.failure:
            sim.fail(i, end, "unfinished_at_end", None)


def _run(sim: Simulation, opts: SimOptions) -> None:
    last = max(sim.last_arrival_s, 1e-9)
    if opts.on_progress is not None:
        cb = opts.on_progress
        sim.loop.run(on_progress=lambda t: cb(t, last))
    elif opts.progress:
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("simulating", total=last)
            sim.loop.run(on_progress=lambda t: bar.update(task, completed=min(t, last)))
    else:
        sim.loop.run()
