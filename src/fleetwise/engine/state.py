"""`EngineState`: one replica's scheduler state and the read-only views of it.

The state an `Engine` (`scheduler.py`) steps: FCFS waiting queue, running set, prefilling
requests, prefill KV awaiting release, the decode aggregates (`decoders.DecodeSet`), the block
pool (`blocks.BlockPool`) and the in-flight step; and what a driver or router reads of it between
steps: load, KV usage (as single passes would show it inside a fused step), outputs so far,
cached prefix, the `WorkerView` snapshot. Nothing here changes the state except `__init__` and
`enable_kv_events`; the phases that do are the scheduler's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from fleetwise.core.request import Request
from fleetwise.core.views import Role, WorkerView
from fleetwise.engine.blocks import BlockPool
from fleetwise.engine.bundle import BatchTimeFn, DecodeTimeFn, batch_time_of, decode_time_of
from fleetwise.engine.decoders import DecodeSet
from fleetwise.engine.records import EngineConfig
from fleetwise.engine.sequence import DECODE, SeqState, cdiv, hit_blocks, prompt_spans
from fleetwise.engine.step_state import EngineCounters, ScheduledStep
from fleetwise.engine.window import KvWindow, WindowedDecodeSet, lookup_windowed
from fleetwise.errors import SpecError
from fleetwise.perf.types import BatchShape
from fleetwise.spec.kv_format import KvFormat

StepTimeFn = Callable[[BatchShape], float]
"""Seconds of one forward pass of a batch (the perf model's, bound to one deployment)."""


class EngineState:
    """One replica's state and its read-only views; `scheduler.Engine` adds the steps."""

    def __init__(self, name: str, role: Role, config: EngineConfig, num_blocks: int,
                 step_time: StepTimeFn, decode_time: DecodeTimeFn | None = None,
                 batch_time: BatchTimeFn | None = None, window: KvWindow | None = None) -> None:
        """`step_time` prices any batch; `decode_time(n, kv, longest)`, when given, must equal
        `step_time(decode_shape(n, kv, longest))` (a faster path for decode-only passes, which
        fused planning evaluates several times per step), and `batch_time(*fields)` must equal
        `step_time(BatchShape(*fields))` (steps with prompt chunks, priced without the shape).
        `window`: the model's sliding-window layers, whose blocks a sequence frees as they leave
        the window (`window.KvWindow`, with its prefix-cache chains); None: every layer keeps all."""
        if role not in ("mixed", "prefill", "decode"):
            raise SpecError(f"engine {name!r}: role={role!r} must be mixed, prefill or decode")
        self.name, self.role, self.config = name, role, config
        self._window = window
        self.step_time = step_time
        self.decode_time = decode_time if decode_time is not None else decode_time_of(step_time)
        self.batch_time = batch_time if batch_time is not None else batch_time_of(step_time)
        self.pool = BlockPool(num_blocks)
        self._bs = config.block_size
        self._decoders = DecodeSet(config.block_size) if window is None else WindowedDecodeSet(config.block_size, window)
        self._waiting: deque[SeqState] = deque()
        self._waiting_prefill_tokens = 0
        self._running: dict[str, SeqState] = {}
        self._prefilling: list[SeqState] = []
        self._awaiting_release: dict[str, SeqState] = {}
        self._passes = 0  # the decode pass counter G
        self._seq = 0
        self._inflight: ScheduledStep | None = None
        self._blocked_rid: str | None = None
        """Queue head that last failed admission (None: try again); `_blocked_*`: what it waited on."""
        self._blocked_target = self._blocked_free = self._blocked_version = self._blocked_running = self._blocked_budget = 0
        self.stats = EngineCounters()
        self.per_request_outputs = False
        """Fill `StepOutput.tokens` (which requests got how many tokens): a server streams them."""

    def _blocks(self, tokens: int) -> int:
        """KV blocks one sequence of `tokens` positions holds here."""
        w = self._window
        return cdiv(tokens, self._bs) if w is None else w.blocks(tokens)

    def _held(self, st: SeqState, tokens: int) -> int:
        """KV blocks `st` holds at `tokens` positions, its own and its prefix hit's (`SeqState.wo`, `base`)."""
        w = self._window
        return cdiv(tokens, self._bs) if w is None else w.blocks(tokens - st.wo) + st.base

    def enable_kv_events(self) -> None:
        """Record the block pool's KV events and report them in each `StepOutput.kv_events`."""
        if self.pool.events is None:
            self.pool.events = []

    @property
    def busy(self) -> bool:
        """A step is in flight (scheduled, not yet completed)."""
        return self._inflight is not None

    @property
    def has_work(self) -> bool:
        """Requests are running or waiting."""
        return bool(self._running) or bool(self._waiting)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission."""
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        """Requests admitted (prefilling or decoding)."""
        return len(self._running)

    @property
    def kv_usage(self) -> float:
        """Fraction of blocks in use, counting every pass of the in-flight step."""
        fl = self._inflight
        if fl is None or not fl.deferred_blocks:
            return self.pool.usage
        return (self.pool.num_used + fl.deferred_blocks) / self.pool.capacity

    def kv_usage_at(self, elapsed_s: float) -> float:
        """`kv_usage` as single passes would show it `elapsed_s` into the in-flight step."""
        fl = self._inflight
        if fl is None or fl.fused is None:
            return self.kv_usage
        j = fl.fused.passes_by(elapsed_s)
        extra = self._decoders.new_blocks(self._passes + 1, j) if j < fl.passes else fl.deferred_blocks
        return (self.pool.num_used + extra) / self.pool.capacity

    @property
    def prefix_hit_rate(self) -> float:
        """Fraction of admitted prompt tokens served from the prefix cache (0 before any)."""
        return self.stats.prefix_hit_tokens / max(1, self.stats.prompt_tokens_admitted)

    def passes_done(self, elapsed_s: float) -> int:
        """Passes of the in-flight step ended `elapsed_s` after its start (0: none in flight or its only pass running)."""
        fl = self._inflight
        if fl is None:
            return 0
        if fl.fused is None:
            return 1 if elapsed_s >= fl.duration_s else 0
        return fl.fused.passes_by(elapsed_s)


    def outputs_of(self, request_id: str, elapsed_s: float | None = None) -> int:
        """Output tokens `request_id` has produced here (0 when not held). With `elapsed_s` (time
        since the in-flight step started), the passes of a fused step ended by then count too:
        what a client streaming each pass has received when the replica dies at that moment."""
        st = self._running.get(request_id)
        if st is None:
            return 0
        if st.phase != DECODE:
            return st.outputs
        g = self._passes
        fl = self._inflight
        if elapsed_s is not None and fl is not None and fl.fused is not None:
            g += min(fl.fused.passes_by(elapsed_s), fl.passes)
        return max(0, min(st.req.output_tokens, st.req.output_tokens - (st.f - g)))

    def cached_prefix_tokens(self, req: Request) -> int:
        """Prompt tokens of `req` this engine's prefix cache would serve now."""
        if not self.config.enable_prefix_caching or not req.block_hashes:
            return 0
        w, bs = self._window, self._bs
        if w is None:
            return hit_blocks(self.pool, req, bs, (req.prompt_tokens - 1) // bs) * bs
        keys, ends = prompt_spans(req, bs)
        return lookup_windowed(self.pool, keys, ends, w.chain_costs(ends), (req.prompt_tokens - 1) // bs, w)[2] * bs

    def load(self, elapsed_s: float | None = None, passes_done: int | None = None) -> tuple[int, int, int, int, float]:
        """(queued requests, running requests, queued prefill tokens, decode tokens left, KV usage):
        the numbers of `snapshot`, without building a view. `passes_done`, when the caller has
        it, is `self.passes_done(elapsed_s)`."""
        dec = self._decoders
        g = self._passes
        fl = self._inflight
        if fl is None or fl.fused is None:
            usage = self.pool.usage
        else:
            extra = fl.deferred_blocks
            if elapsed_s is not None:
                j = passes_done if passes_done is not None else fl.fused.passes_by(elapsed_s)
                if j < fl.passes:
                    g += j
                    extra = dec.new_blocks(self._passes + 1, j) if extra else 0
            usage = (self.pool.num_used + extra) / self.pool.capacity if extra else self.pool.usage
        decode_left = dec.sum_f - dec.n * g
        queued = self._waiting_prefill_tokens
        for st in self._prefilling:
            queued += st.target - st.computed
            if self.role != "prefill":
                decode_left += st.req.output_tokens - st.outputs
        return len(self._waiting), len(self._running), queued, decode_left, usage

    def snapshot(self, now_s: float, elapsed_s: float | None = None, passes_done: int | None = None, *,
                 pool: str = "default", accelerator: str = "", model_version: str = "v1",
                 region: str = "default", healthy: bool = True,
                 kv_capacity_tokens: int | None = None, token_loads: bool = False,
                 kv_format: KvFormat | None = None) -> WorkerView:
        """The engine as a router sees it at `now_s`: the one place a `WorkerView` is built.

        What a vLLM `/metrics` endpoint reports: waiting and running requests, KV usage and the
        cache size. `token_loads=True` also fills queued prefill tokens and decode tokens left,
        which no real engine reports (the decode tokens left need the true output lengths); the
        simulator never asks for them, so its policies see what a gateway's would.
        With `elapsed_s` (time since the in-flight step started), a fused step shows the state
        single passes would have then: the passes ended so far and the blocks of the pass
        running now. The keyword arguments are the identity a driver knows (capacity in tokens;
        default: blocks times block size)."""
        waiting, running, queued, decode_left, usage = self.load(elapsed_s, passes_done)
        cap = self.pool.capacity * self._bs if kv_capacity_tokens is None else kv_capacity_tokens
        q, d = (queued, decode_left) if token_loads else (None, None)
        return WorkerView(self.name, self.role, pool, accelerator, model_version, region, healthy, waiting,
                          running, q, d, usage, cap, self._bs, now_s, 1.0, kv_format)
