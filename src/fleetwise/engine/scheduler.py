"""`Engine`: one replica's scheduler as a clockless state machine (continuous batching, vLLM v1).

Owns a replica's request lifecycle: FCFS waiting queue, running set, chunked prefill, preemption by
recompute, prefill/decode/mixed roles, fused decode steps (blocks: `blocks.BlockPool`; per-request KV:
`sequence.SeqState`; decode aggregates: `decoders.DecodeSet`; fused passes' cost: `bundle.fuse`;
the state itself and the read-only views of it: `state.EngineState`, which `Engine` extends).
No clock: the driver advances time by `Step.duration_s` between `schedule()` and `complete()`.

One step, in named phases (`schedule`):
1. reserve_running: every decoder takes 1 token of the budget (max_num_batched_tokens >=
   max_num_seqs, so all always fit: decodes first, Sarathi-style), then partially prefilled
   requests take their next chunk in admission order. Blocks are reserved for all of them; while
   they do not fit, the most recently admitted running request is preempted (blocks freed,
   progress reset, requeued at the front of waiting).
2. admit_waiting: unless something was preempted, admit waiting requests FCFS while budget, max_num_seqs
   and KV blocks allow (prefix-cache hits first; a long prompt gets a chunk).
3. fuse: if the step is decode-only and admitted nothing, extend it to k identical passes
   (bounded by max_bundle_steps, the first finish, the horizons and the free blocks). The hard
   `horizon_s` must not be crossed; at the soft horizon (`soft_horizon_s`, when new work will
   arrive) the step may run the pass that straddles it, as single passes would. The blocks of
   passes 2..k are checked at `schedule()` and taken at `complete()`, so a step shortened by
   `cut()` (work that arrived unannounced) holds exactly what single passes would have.
"""

from __future__ import annotations

import math

from fleetwise.core.request import Request
from fleetwise.engine.blocks import CacheEntry, SpanKey
from fleetwise.engine.bundle import Fused, plan_fused
from fleetwise.engine.decoders import step_sums
from fleetwise.engine.records import NO_ENTRIES, Step, StepOutput
from fleetwise.engine.sequence import DECODE, HANDOFF, PREFILL, WAITING, SeqState, lookup
from fleetwise.engine.state import EngineState
from fleetwise.engine.step_state import ScheduledStep
from fleetwise.engine.window import lookup_windowed
from fleetwise.errors import InfeasibleError, SpecError

NO_IDS: frozenset[str] = frozenset()  # what `_admit_waiting` gets unless a preemption emptied the engine


def chunk_tokens(chunks: list[tuple[SeqState, int]]) -> int:
    """Prompt tokens of a step's chunks (a loop: compiled, the builtin `sum` is a generic call)."""
    n = 0
    for _, c in chunks:
        n += c
    return n


class Engine(EngineState):
    """One replica. See the module docstring for the step phases and `api.py` for the contract."""

    # -- intake ---------------------------------------------------------------------------------
    def fits(self, req: Request) -> bool:
        """Whether `req` could ever run here: its largest KV footprint fits the whole pool."""
        role = self.role
        extra = req.output_tokens - 1 if role == "mixed" else (0 if role == "prefill" else req.output_tokens)
        return req.output_tokens >= 1 and self._blocks(req.prompt_tokens + extra) <= self.pool.capacity

    def add_request(self, req: Request) -> None:
        """Enqueue a request (mixed and prefill roles) at the back of the FCFS waiting queue."""
        if self.role == "decode":
            raise SpecError(f"engine {self.name!r} has role decode: use add_transferred")
        self._enqueue(SeqState(req, req.prompt_tokens))

    def add_transferred(self, req: Request) -> None:
        """Decode role: `req`'s prompt KV arrived; it waits for blocks, then decodes all its tokens."""
        if self.role != "decode":
            raise SpecError(f"engine {self.name!r} has role {self.role}: use add_request")
        self._enqueue(SeqState(req, req.prompt_tokens, transferred=True))

    def _enqueue(self, st: SeqState) -> None:
        if not self.fits(st.req):
            raise InfeasibleError(f"request {st.req.request_id}: {st.req.prompt_tokens} prompt + {st.req.output_tokens} "
                                  f"output tokens never fit engine {self.name!r} (its whole KV cache: {self.pool.capacity} "
                                  f"blocks of {self._bs} tokens); give its pool more KV room (tp, pp, fp8, gpu_memory_utilization)")
        self._waiting.append(st)
        self._waiting_prefill_tokens += 0 if st.transferred else st.target

    # -- schedule: the named phases -------------------------------------------------------------
    def schedule(self, horizon_s: float = math.inf, soft_horizon_s: float = math.inf) -> Step | None:
        """Form the next step (None if nothing can run); it stays in flight until `complete()`.

        A fused decode step ends by `horizon_s` (hard; one pass always runs) and at the latest
        with the pass that is running `soft_horizon_s` from now (new work joins after it).
        """
        if self._inflight is not None:
            raise RuntimeError(f"engine {self.name!r}: schedule() while a step is in flight")
        if not self._running and not self._waiting:
            return None
        # Lists that stay empty (most steps: decodes only) are the shared NO_ENTRIES; a phase
        # that adds to one gets its own first.
        preempted: list[str] = NO_ENTRIES
        budget = self.config.max_num_batched_tokens - self._decoders.n
        chunks: list[tuple[SeqState, int]] = NO_ENTRIES
        if self._prefilling or not self._reserve_decodes():
            preempted = []
            chunks = self._reserve_running(budget, preempted)
        budget = self.config.max_num_batched_tokens - self._decoders.n - chunk_tokens(chunks)
        new_decoders: list[SeqState] = NO_ENTRIES
        scheduled: list[tuple[str, float]] = NO_ENTRIES
        hits = 0
        # After a preemption vLLM admits nothing new that step (no thrashing), unless it emptied
        # the engine: admitting is then the only way forward (nothing else schedules the requeued).
        emptied = bool(preempted) and not self._decoders.n and not chunks
        if self._waiting and (not preempted or emptied) and (emptied or self._admission_may_change(budget)):
            chunks = chunks if chunks is not NO_ENTRIES else []
            new_decoders, scheduled = [], []
            hits = self._admit_waiting(budget, chunks, new_decoders, scheduled,
                                       frozenset(preempted) if emptied else NO_IDS)
        n_dec = self._decoders.n
        if not n_dec and not chunks:
            self.stats.carried_preempted.extend(preempted)
            return None
        if chunks:
            return self._single_step(chunks, n_dec, new_decoders, preempted, hits, scheduled)
        # Decode rows only (n_dec > 0): the shape is `decode_shape(n_dec, kv, longest)`.
        dec, g = self._decoders, self._passes
        kv, longest = dec.kv_read_tokens(g), dec.max_kv_read(g)
        d0 = self.decode_time(n_dec, kv, longest)
        if not new_decoders and not preempted:
            planned = self._fuse(kv, longest, d0, horizon_s, soft_horizon_s)
            if planned is not None:
                fused, deferred = planned
                passes = fused.passes
                self._inflight = ScheduledStep(passes, fused.duration_s, n_dec, chunks, new_decoders, preempted,
                                           hits, scheduled, fused, deferred)
                return Step(fused.duration_s, passes, None, n_dec, 0, n_dec * passes, kv, longest)
        self._inflight = ScheduledStep(1, d0, n_dec, chunks, new_decoders, preempted, hits, scheduled)
        return Step(d0, 1, None, n_dec, 0, n_dec, kv, longest)

    def _single_step(self, chunks: list[tuple[SeqState, int]], n_dec: int, new_decoders: list[SeqState],
                     preempted: list[str], hits: int, scheduled: list[tuple[str, float]]) -> Step:
        """A step with prompt chunks: one pass, priced on its full shape."""
        sums = step_sums(self._decoders, self._passes, chunks)
        d0 = self.batch_time(*sums)
        self._inflight = ScheduledStep(1, d0, n_dec, chunks, new_decoders, preempted, hits, scheduled)
        return Step(d0, 1, None, sums[0], chunk_tokens(chunks), n_dec, sums=sums)

    def _reserve_decodes(self) -> bool:
        """Phase 1 fast path (nothing prefilling): reserve this pass's decode blocks; False: preempt."""
        if self._window is not None:
            return self.pool.allocate(self._decoders.new_blocks(self._passes, 1))
        return self.pool.allocate(self._decoders.res[(-self._passes) % self._bs])

    def _admission_may_change(self, budget: int) -> bool:
        """Skip re-trying a blocked queue head when nothing it waits on has changed."""
        head, pool = self._waiting[0], self.pool
        return not (head.req.request_id == self._blocked_rid and head.target == self._blocked_target
                    and pool.num_free == self._blocked_free and pool.version == self._blocked_version
                    and len(self._running) == self._blocked_running and budget == self._blocked_budget)

    def _reserve_running(self, budget: int, preempted: list[str]) -> list[tuple[SeqState, int]]:
        """Phase 1: decodes and next chunks of running requests; preempt newest until blocks fit."""
        g = self._passes
        plan: dict[SeqState, tuple[int, int]] = {}
        for st in self._prefilling:
            if budget <= 0:
                break
            chunk = min(st.target - st.computed, budget)
            plan[st] = (chunk, self._held(st, st.computed + chunk) - st.shared - st.private)
            budget -= chunk
        needed = self._decoders.new_blocks(g, 1) + sum(need for _, need in plan.values())
        while needed > self.pool.num_free and self._running:
            victim = self._running[next(reversed(self._running))]
            if victim.phase == DECODE:
                needed -= self._decoders.needs_block(victim, g)
            elif victim in plan:
                needed -= plan.pop(victim)[1]
            self._preempt(victim)
            preempted.append(victim.req.request_id)
        ok = self.pool.allocate(needed)
        assert ok, "reservation must fit after preemption"
        for st, (_, need) in plan.items():
            st.private += need
        return [(st, chunk) for st, (chunk, _) in plan.items()]

    def _admit_waiting(self, budget: int, chunks: list[tuple[SeqState, int]],
                       new_decoders: list[SeqState], scheduled: list[tuple[str, float]],
                       self_emptied: frozenset[str] = NO_IDS) -> int:
        """Phase 2: admit FCFS while budget, seats and blocks allow; returns prefix-hit tokens.

        `self_emptied`: requests whose own preemption emptied the engine this step (their cache hits pinned
        the blocks they lacked); they come back without hits, or the same preemption would repeat forever."""
        hits = 0
        max_seqs = self.config.max_num_seqs
        while self._waiting and budget > 0 and len(self._running) < max_seqs:
            st = self._waiting[0]
            admitted = self._admit_one(st, budget, use_cache=st.req.request_id not in self_emptied)
            if admitted is None and not self._running and self.config.enable_prefix_caching:
                # Cache hits pin their whole entries; in an otherwise idle engine that can
                # leave too few blocks for the rest of the prompt. Without the hits every
                # cached block is evictable, and a request that fits() always gets in.
                admitted = self._admit_one(st, budget, use_cache=False)
            if admitted is None:  # remember what the head waits on (`_admission_may_change`)
                pool = self.pool
                self._blocked_rid, self._blocked_target = st.req.request_id, st.target
                self._blocked_free, self._blocked_version = pool.num_free, pool.version
                self._blocked_running, self._blocked_budget = len(self._running), budget
                break
            took, hit_tokens = admitted
            self._waiting.popleft()
            hits += hit_tokens
            budget -= max(took, 1)
            first = not st.scheduled
            st.scheduled = True
            if st.phase == DECODE:
                new_decoders.append(st)
            else:
                chunks.append((st, took))
                if first:
                    scheduled.append((st.req.request_id, 0.0))
        return hits

    def _admit_one(self, st: SeqState, budget: int, use_cache: bool = True) -> tuple[int, int] | None:
        """Admit `st` if blocks allow: (its chunk, 0 for a transferred decode; prefix-hit
        tokens), or None. `use_cache=False` ignores prefix-cache hits."""
        bs = self._bs
        keys, ends = st.spans(bs)
        full_hit = st.transferred  # transferred KV: every full block may come from the cache
        max_hit = st.target // bs if full_hit else (st.target - 1) // bs
        entries, uses, hit = (self._lookup(st, keys, ends, max_hit)
                              if keys and use_cache and self.config.enable_prefix_caching else ([], [], 0))
        # What the sequence holds past the hit: windowless, its blocks less the hit's; windowed, its own.
        wo, base = (hit * bs, sum(uses)) if self._window is not None else (0, 0)
        held = self._blocks if self._window is None else self._window.blocks
        computed = hit * bs if not full_hit else st.target
        if full_hit:
            chunk, need = 0, held(st.target + 1 - wo) - (hit if self._window is None else 0)
        else:
            remaining = st.target - computed
            if remaining > budget and not self.config.enable_chunked_prefill \
                    and remaining <= self.config.max_num_batched_tokens:
                return None
            chunk = min(remaining, budget)
            need = held(computed + chunk - wo) - (hit if self._window is None else 0)
        pinned = sum(e.num_blocks for e in set(entries) if e.ref_count == 0) if entries else 0
        if need + pinned > self.pool.num_free:
            return None
        if entries or st.entries:
            st.attach(self.pool, entries, uses, hit)
        else:  # no hit: what `attach` leaves (empty spans, nothing shared, next span 0)
            st.shared = st.next_span = 0
        st.wo, st.base = wo, base
        if self._window is not None:
            st.costs = self._window.chain_costs(ends, hit)
        self.pool.allocate(need)
        st.private, st.computed = need, computed
        self._start_running(st)
        return chunk, hit * bs

    def _lookup(self, st: SeqState, keys: list[SpanKey], ends: list[int], max_hit: int
                ) -> tuple[list[CacheEntry], list[int], int]:
        """The longest cached prefix of `st`'s prompt (`sequence.lookup`, `window.lookup_windowed`)."""
        w = self._window
        if w is None:
            return lookup(self.pool, keys, ends, max_hit)
        return lookup_windowed(self.pool, keys, ends, w.chain_costs(ends), max_hit, w)

    def _start_running(self, st: SeqState) -> None:
        self._seq += 1
        st.seq = self._seq
        self._running[st.req.request_id] = st
        self.stats.prompt_tokens_admitted += st.target
        self.stats.prefix_hit_tokens += st.shared * self._bs if self._window is None else st.wo
        if st.transferred:
            if self.config.enable_prefix_caching:
                st.cache_computed(self.pool, self._bs)
            self._decoders.join(st, st.target, st.req.output_tokens, self._passes)
        else:
            self._waiting_prefill_tokens -= st.target
            st.phase = PREFILL
            self._prefilling.append(st)

    def _fuse(self, kv: int, longest: int, d0: float, horizon_s: float,
              soft_s: float) -> tuple[Fused, int] | None:
        """Phase 3: extend a decode-only step (first pass: KV read `kv`, longest row `longest`,
        `d0` seconds) to k passes (None: one pass); returns it with the blocks of passes 2..k,
        which must fit now and are taken at `complete()`."""
        dec, g = self._decoders, self._passes
        first_finish = dec.next_finish()
        cap = self.config.max_bundle_steps
        if first_finish is not None and first_finish - g < cap:
            cap = first_finish - g
        if cap <= 1 or d0 > soft_s or d0 > horizon_s:
            return None
        free = self.pool.num_free
        blocks = dec.new_blocks(g + 1, cap - 1)  # all `cap` passes fit: `max_passes` keeps the cap
        if blocks > free:
            cap = 1 + dec.max_passes(g + 1, cap - 1, free)
            if cap <= 1:
                return None
        fused = plan_fused(self.decode_time, dec.n, kv, d0, cap, horizon_s, soft_s, longest)
        k = fused.passes
        if k <= 1:
            return None
        return fused, blocks if k == cap and blocks <= free else dec.new_blocks(g + 1, k - 1)

    def cut(self, soft_horizon_s: float) -> float | None:
        """New work arrived `soft_horizon_s` after the in-flight step started: end a fused step
        with the pass running then, as single passes would. Returns the step's new duration, or
        None when it is unchanged (a single pass, or it already ends there)."""
        fl = self._inflight
        if fl is None or fl.fused is None:
            return None
        fused = fl.fused
        k = fused.count_le(soft_horizon_s, fl.passes) + 1
        if k >= fl.passes:
            return None
        fused.set_passes(k)
        fl.passes, fl.duration_s = k, fused.duration_s
        fl.deferred_blocks = self._decoders.new_blocks(self._passes + 1, k - 1)
        return fl.duration_s

    # -- complete ---------------------------------------------------------------------------------
    def complete(self) -> StepOutput:
        """Apply the in-flight step: advance decoders, finish chunks, emit tokens."""
        fl = self._inflight
        if fl is None:
            raise RuntimeError(f"engine {self.name!r}: complete() without a step in flight")
        self._inflight = None
        if fl.deferred_blocks:
            ok = self.pool.allocate(fl.deferred_blocks)
            assert ok, "fused passes were checked to fit"
        passes, n_dec = fl.passes, fl.num_decoders
        self._passes += passes
        stats = self.stats
        stats.steps += 1
        stats.passes += passes
        preempted = fl.preempted
        if stats.carried_preempted:
            preempted = stats.carried_preempted + preempted
            stats.carried_preempted = []
        itl = [(fl.duration_s / passes, n_dec * passes)] if n_dec else NO_ENTRIES
        # Positional: StepOutput(first_tokens, finished, handoffs, preempted, tokens_generated,
        # itl_samples, prefix_hit_tokens, scheduled); own lists only where entries can be added.
        chunks = fl.chunks
        first: list[tuple[str, float]] = [] if chunks or fl.new_decoders else NO_ENTRIES
        finished = self._decoders.pop_finished(self._passes)
        out = StepOutput(first, [] if finished or chunks else NO_ENTRIES, [] if chunks else NO_ENTRIES,
                         preempted, n_dec * passes, itl, fl.prefix_hit_tokens, fl.scheduled)
        if self.per_request_outputs:
            # Every decoder in the set ran every pass (a fused step ends by the first finish).
            out.tokens = [(rid, passes) for rid, st in self._running.items() if st.phase == DECODE]
        for st in fl.new_decoders:
            if not st.first_done:
                st.first_done = True
                first.append((st.req.request_id, fl.duration_s))
        for st in finished:
            self._finish_decoder(st)
            out.finished.append(st.req.request_id)
        for st, chunk in chunks:
            self._advance_prefill(st, chunk, fl.duration_s, out)
        events = self.pool.events
        if events:
            out.kv_events = events.copy()
            events.clear()
        return out

    def _advance_prefill(self, st: SeqState, chunk: int, duration_s: float, out: StepOutput) -> None:
        st.computed += chunk
        if self.config.enable_prefix_caching:
            st.cache_computed(self.pool, self._bs)
        if st.computed < st.target:
            return
        self._prefilling.remove(st)
        if self.role == "prefill":
            st.phase = HANDOFF
            del self._running[st.req.request_id]
            self._awaiting_release[st.req.request_id] = st
            out.handoffs.append(st.req.request_id)
            return
        st.outputs += 1
        out.tokens_generated += 1
        if out.tokens is not None:
            out.tokens.append((st.req.request_id, 1))
        if not st.first_done:
            st.first_done = True
            out.first_tokens.append((st.req.request_id, duration_s))
        remaining = st.req.output_tokens - st.outputs
        if remaining > 0:
            self._decoders.join(st, st.target, remaining, self._passes)
            return
        del self._running[st.req.request_id]
        st.free_blocks(self.pool, st.private)
        out.finished.append(st.req.request_id)

    def _finish_decoder(self, st: SeqState) -> None:
        context = st.a + self._passes
        self._decoders.leave(st)
        del self._running[st.req.request_id]
        st.free_blocks(self.pool, self._held(st, context) - st.shared)

    def _preempt(self, st: SeqState) -> None:
        """Recompute preemption: free blocks, keep outputs, requeue at the front of waiting."""
        if st.phase == DECODE:
            st.outputs = st.req.output_tokens - (st.f - self._passes)
        self._drop_running(st)
        st.computed, st.transferred, st.phase = 0, False, WAITING
        st.target = st.req.prompt_tokens + st.outputs
        self._waiting.appendleft(st)
        self._waiting_prefill_tokens += st.target
        self.stats.preemptions += 1

    def _drop_running(self, st: SeqState) -> None:
        """Take a running request out of the batch and free its private blocks (computed prompt
        blocks stay in the prefix cache)."""
        if st.phase == DECODE:
            context = st.a + self._passes
            self._decoders.leave(st)
            private = self._held(st, context) - st.shared
        else:
            self._prefilling.remove(st)
            private = st.private
        del self._running[st.req.request_id]
        st.free_blocks(self.pool, private)

    def abort(self, request_id: str) -> bool:
        """Drop one request between steps (its client went away), wherever it is: waiting,
        running, or a prefill's KV awaiting release; its blocks are freed as a finish frees them.
        False when this engine does not hold it. vLLM applies aborts between steps too."""
        if self._inflight is not None:
            raise RuntimeError(f"engine {self.name!r}: abort() while a step is in flight; abort between steps")
        st = self._running.get(request_id)
        if st is not None:
            self._drop_running(st)
        elif request_id in self._awaiting_release:
            self.release(request_id)
        else:
            found = next((w for w in self._waiting if w.req.request_id == request_id), None)
            if found is None:
                return False
            st = found
            self._waiting.remove(st)
            self._waiting_prefill_tokens -= 0 if st.transferred else st.target
        self._blocked_rid = None
        return True

    # -- prefill role, crashes, views ---------------------------------------------------------------
    def release(self, request_id: str) -> None:
        """Prefill role: the request's KV was transferred; free (or keep as cache) its blocks."""
        st = self._awaiting_release.pop(request_id)
        st.free_blocks(self.pool, st.private)

    def abort_all(self) -> list[Request]:
        """Crash: drop every request and cached block; returns the dropped requests."""
        dropped = [st.req for st in self._running.values()]
        dropped += [st.req for st in self._waiting]
        dropped += [st.req for st in self._awaiting_release.values()]
        self._running.clear()
        self._waiting.clear()
        self._prefilling.clear()
        self._awaiting_release.clear()
        self._waiting_prefill_tokens = 0
        self._decoders.reset()
        self.pool.reset()
        self._inflight = None
        self.stats.carried_preempted = []
        return dropped
