"""`RoutingSpec`: which routing policy a plan uses, its parameters and its safe mode.

Owns the declared side of routing only: the parameter models of every routing plugin, the named
presets (pure data: a few lines of composition each) and the document a plan file embeds under
`routing:`. The policies themselves live in `fleetwise.routing` (L3); this module is L0 and
imports nothing above `spec`.

```yaml
routing:
  policy: fleetwise-default          # a preset name (see `fleetwise.routing.policy_names()`)
  params:                            # optional overrides, deep-merged onto the preset
    load_bound: {c: 1.5}
  safe_mode: {stale_after_s: 2.0, action: reject}
```
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fleetwise.errors import SpecError
from fleetwise.spec.base import Spec, validate
from fleetwise.spec.routing_plugins import ROUTING_PLUGINS

SafeModeAction = Literal["round_robin", "last_known", "reject"]

DEFAULT_POLICY = "fleetwise-default"
"""The preset a plan, a gateway or a simulation routes with when it names none."""


class CostParams(Spec):
    """Predicted cost of sending a request to a worker, in prefill-token equivalents.

    `cost = (queued_prefill + decode_token_weight * running_decode + pending_since_view
    + uncached_prompt(req) + decode_token_weight * expected_output(req)) * slowness`, where
    `pending_since_view` is the router's own estimate for requests it dispatched after the
    worker's view was taken, `expected_output` the output predictor's estimate (never the true
    length) and `slowness` the feedback factor (1 without feedback). A view without token loads
    (a real engine's metrics) replaces the first three terms by the router's in-flight ledger:
    every request it dispatched there and has not seen complete, prompt tokens until the first
    token plus `decode_token_weight` times its expected output.
    """

    decode_token_weight: float = Field(default=0.5, ge=0.0)
    """Weight of one expected decode token relative to one prefill token."""
    per_request_tokens: float = Field(default=32.0, ge=0.0)
    """Fixed cost of each queued/running/pending request, in tokens (scheduling overhead)."""


class LoadBoundParams(Spec):
    """Bounded loads (consistent hashing with bounded loads, Mirrokni et al.), two checks.

    A worker is eligible only if (1) its predicted cost after taking the request is at most
    `c * mean` over the candidates (plus the request's own cost, so an idle worker always
    qualifies) and (2) the work it took among the last `share_window` decisions (each weighted by
    its own predicted cost in tokens) is at most `c` times its share of that work plus the
    request's (`c * (W + own) / n`, by speed on uneven workers), so sequential traffic cannot pile
    onto one worker either. The share is of work, not of decisions: a worker that just took a long
    prompt is not kept eligible, while those that took many short ones are not pushed out for them.
    """

    enabled: bool = True
    """Apply the bound at all."""
    c: float = Field(default=1.25, gt=1.0)
    """Load factor: how far above the fleet mean a worker may go."""
    share_window: int = Field(default=64, ge=0)
    """Recent decisions whose work (own predicted cost, tokens) the share bound counts; 0 disables the share check."""


class FeedbackParams(Spec):
    """Per-worker EWMAs of observed TTFT, TPOT and failures, turned into a slowness factor.

    TTFT is taken per token of the cost the router predicted at dispatch (work ahead and the
    request's own) and divided by the fleet's TTFT per token for requests of that size, so a
    worker that serves small or large requests at normal speed reads 1; TPOT is taken as is; each EWMA decays towards the fleet median with `half_life_s`
    since the worker's last observation and is divided by that median. The factor is
    `sqrt(ttft_ratio * tpot_ratio) * (1 + failure_penalty * failure_rate)`, clamped.
    """

    enabled: bool = True
    """Correct predicted costs by observed latency."""
    alpha: float = Field(default=0.3, gt=0.0, le=1.0)
    """EWMA weight of a new observation."""
    half_life_s: float = Field(default=5.0, gt=0.0)
    """Without new observations a worker's EWMAs halve their distance to the fleet median every this many seconds."""
    min_factor: float = Field(default=0.25, gt=0.0)
    """Lower clamp of the slowness factor."""
    max_factor: float = Field(default=8.0, gt=1.0)
    """Upper clamp of the slowness factor."""
    failure_penalty: float = Field(default=4.0, ge=0.0)
    """Extra slowness per unit of EWMA failure rate."""
    deadband: float = Field(default=0.05, ge=0.0, lt=1.0)
    """Factors within this of 1 count as exactly 1 (equal workers tie; a recovered one is retried)."""
    min_samples: int = Field(default=2, ge=1)
    """Observations a worker needs before its factor departs from 1."""


class PrefixIndexParams(Spec):
    """Per-worker index of cached prefix blocks (chained block hashes), LRU-bounded."""

    max_blocks_per_worker: int = Field(default=65536, gt=0)
    """Blocks remembered per worker; the least recently used are forgotten first."""
    record_dispatch: bool = True
    """Assume a dispatched prompt's blocks are cached on its worker (before KvStored confirms)."""


class OutputPredictorParams(Spec):
    """Expected output tokens of a request, learned from completions (what a router can know).

    A router never sees a request's true output length: only its tenant, its prompt length and
    the client's `max_tokens` cap (often absent). The estimate is a shrunk mean over three
    levels, each pulled towards the level above by `prior_weight` pseudo-observations:
    fleet-wide (towards `prior_tokens`), per tenant, per tenant and prompt-length bucket
    (`bucket_ratio`-wide geometric buckets). Sums decay by half every `half_life_requests`
    completions of their own key, so a drifting workload is followed. The estimate is capped by
    the request's `max_tokens` when the client sent one.
    """

    prior_tokens: float = Field(default=256.0, gt=0.0)
    """Expected output tokens before any completion was observed."""
    prior_weight: float = Field(default=8.0, gt=0.0)
    """Pseudo-observations of the level above blended into each level's mean."""
    bucket_ratio: float = Field(default=2.0, gt=1.0)
    """Prompt-length bucket width: bucket b holds prompts in [ratio^b, ratio^(b+1)) tokens."""
    half_life_requests: float = Field(default=2000.0, gt=0.0)
    """Completions after which an observation weighs half (per key)."""


class PdProfile(Spec):
    """One side of a prefill/decode pair: the filters, weighted scorers and picker for that side's workers."""

    filters: tuple[str, ...] | None = None
    """Filters applied in order to this side's workers (`role` is implied: the side is one role).
    None: the policy's `filters`. A side no worker passes is rejected with the filter's reason."""
    picker: str | None = None
    """This side's picker. None: the policy's `picker`. When both sides pick `max`, the pair with the
    highest pair score wins; otherwise the prefill side is picked first, then a decode worker linked
    to it (a `max` side by its profile score, `power_of_two` by outstanding requests)."""

    weight: float = Field(default=1.0, ge=0.0)
    """Weight of this side's normalised score (weighted mean of its scorers, in [0, 1]) in the pair score."""
    scorers: dict[str, float] | None = None
    """Scorer -> weight over this side's candidates. None: the policy's `scorers`; the decode side
    drops `prefix` (a decode worker reuses no prompt cache) and adds `kv_room` at
    `decode_kv_weight` times their summed weight."""

    @field_validator("scorers")
    @classmethod
    def _known_scorers(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for name, wt in (v or {}).items():
            ROUTING_PLUGINS.check("scorer", name)
            if wt < 0:
                raise ValueError(f"scorer {name!r}: weight {wt} is negative; weights are >= 0")
        return v

    @field_validator("filters")
    @classmethod
    def _known_filters(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else tuple(ROUTING_PLUGINS.check("filter", f) for f in v)

    @field_validator("picker")
    @classmethod
    def _known_picker(cls, v: str | None) -> str | None:
        return None if v is None else ROUTING_PLUGINS.check("picker", v)


PD_FORMER_FIELDS = {"prefill_weight": ("prefill", "weight"), "decode_weight": ("decode", "weight"),
                    "link_weight": ("pair_scorers", "handoff")}
"""The former flat pair weights, read as the profile weights and the `handoff` pair scorer's weight."""


class PdParams(Spec):
    """Prefill/decode pair selection: a prefill profile, a decode profile and pair scorers.

    Each side's candidates are scored by its profile (the same scorers as a colocated fleet,
    weighted mean in [0, 1]); a pair's score is `prefill.weight * prefill score + decode.weight *
    decode score + sum of weighted pair scorers` (the KV hand-off), and the policy's picker
    chooses. Pickers that read no scores pick the prefill side, then a decode worker linked to it.
    """

    prefill: PdProfile = PdProfile()
    """The prefill side (default: the policy's scorers, prefix overlap included)."""
    decode: PdProfile = PdProfile()
    """The decode side (default: the policy's scorers without `prefix`, plus `kv_room`)."""
    pair_scorers: dict[str, float] = Field(default_factory=lambda: {"handoff": 0.25})
    """Pair scorer -> weight, scoring a prefill->decode pair as a whole; pairs over an unhealthy
    link are excluded before scoring (kept, all of them, when no link is healthy)."""
    decode_kv_weight: float = Field(default=0.5, ge=0.0)
    """Weight of `kv_room` in the default decode profile, relative to the profile's other scorers together."""
    kv_reserve: float = Field(default=0.05, ge=0.0, lt=1.0)
    """Decode workers whose KV headroom after the request would drop below this are skipped."""
    degraded_link_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """Scored pair selection skips pairs whose link bandwidth is below this fraction of the best
    healthy link's while another pair is left (a degraded link stays healthy; 0 disables)."""

    @model_validator(mode="before")
    @classmethod
    def _former_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not any(k in data for k in PD_FORMER_FIELDS):
            return data
        out = {k: v for k, v in data.items() if k not in PD_FORMER_FIELDS}
        for old, (section, key) in PD_FORMER_FIELDS.items():
            if old in data:
                given = out.get(section)
                if given is not None and not isinstance(given, dict):
                    return data  # let field validation name the bad section
                base = dict(given) if given is not None else ({"handoff": 0.25} if section == "pair_scorers" else {})
                out[section] = {**base, key: data[old]}
        return out

    @field_validator("pair_scorers")
    @classmethod
    def _known_pair_scorers(cls, v: dict[str, float]) -> dict[str, float]:
        for name, wt in v.items():
            ROUTING_PLUGINS.check("pair_scorer", name)
            if wt < 0:
                raise ValueError(f"pair scorer {name!r}: weight {wt} is negative; weights are >= 0")
        return v


class SafeModeSpec(Spec):
    """What to do when the fleet view is too old to trust."""

    enabled: bool = True
    """Watch view ages at all; off, a stale view is routed on as if it were fresh (no in-flight estimates since it was taken)."""
    stale_after_s: float = Field(default=5.0, gt=0.0)
    """A worker's state is stale when `now_s - reported_at_s` exceeds this."""
    stale_fraction: float = Field(default=0.5, gt=0.0, le=1.0)
    """Safe mode starts when at least this fraction of the eligible workers is stale."""
    action: SafeModeAction = "last_known"
    """`round_robin` over eligible workers, `last_known` (keep routing on the last views plus the
    router's own in-flight estimates) or `reject` (shed load with a clear reason)."""


class PolicyParams(Spec):
    """A composed policy: filters -> weighted scorers (each clamped to [0, 1]) -> picker."""

    filters: tuple[str, ...] = ("healthy", "model_version", "region", "role")
    """Filters applied in order; a request no worker passes is rejected with the filter's reason."""
    scorers: dict[str, float] = Field(default_factory=dict)
    """Scorer name -> weight. `load`: min cost / cost; `requests`: fewest queued+running+pending;
    `prefix`: cached fraction of the prompt; `kv`: 1 - KV usage; `feedback`: fastest / slowness."""
    picker: str = "max"
    """`max` (highest weighted score), `round_robin`, `random`, or `power_of_two` (two seeded
    samples, the higher score wins)."""
    tie_break: Literal["random", "lru"] = "random"
    """How `max` breaks exact ties: seeded random, or least recently chosen first (then seeded)."""
    cost: CostParams = CostParams()
    """Predicted-cost model shared by the `load` scorer and the load bound."""
    load_bound: LoadBoundParams = LoadBoundParams(enabled=False)
    """Bounded-load filter applied after the filters (off unless a preset turns it on)."""
    feedback: FeedbackParams = FeedbackParams(enabled=False)
    """Latency feedback correcting predicted costs (off unless a preset turns it on)."""
    prefix_index: PrefixIndexParams = PrefixIndexParams()
    """The per-worker prefix index."""
    pd: PdParams = PdParams()
    """Pair selection for prefill/decode-disaggregated fleets."""
    output_predictor: OutputPredictorParams = OutputPredictorParams()
    """Expected output tokens of a request (its decode work), learned from completions."""

    @field_validator("filters")
    @classmethod
    def _known_filters(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(ROUTING_PLUGINS.check("filter", f) for f in v)

    @field_validator("scorers")
    @classmethod
    def _known_scorers(cls, v: dict[str, float]) -> dict[str, float]:
        for name in v:
            ROUTING_PLUGINS.check("scorer", name)
        return v

    @field_validator("picker")
    @classmethod
    def _known_picker(cls, v: str) -> str:
        return ROUTING_PLUGINS.check("picker", v)

    def pd_profile(self, side: Literal["prefill", "decode"]) -> dict[str, float]:
        """Scorer -> weight (all > 0) of the P/D profile of `side`, defaults resolved (see `PdProfile`)."""
        prof = self.pd.prefill if side == "prefill" else self.pd.decode
        if prof.scorers is not None:
            return {s: wt for s, wt in prof.scorers.items() if wt > 0}
        weights = {s: wt for s, wt in self.scorers.items() if wt > 0 and not (side == "decode" and s == "prefix")}
        if side == "decode" and self.pd.decode_kv_weight > 0:
            weights["kv_room"] = self.pd.decode_kv_weight * (sum(weights.values()) or 1.0)
        return weights

    def pd_filters(self, side: Literal["prefill", "decode"]) -> tuple[str, ...] | None:
        """Filter names of the P/D profile of `side`, without `role`; None when it uses the policy's."""
        prof = self.pd.prefill if side == "prefill" else self.pd.decode
        return None if prof.filters is None else tuple(f for f in prof.filters if f != "role")

    def pd_picker(self, side: Literal["prefill", "decode"]) -> str:
        """Picker name of the P/D profile of `side` (the policy's `picker` when it names none)."""
        prof = self.pd.prefill if side == "prefill" else self.pd.decode
        return prof.picker or self.picker


PRESETS: dict[str, dict[str, Any]] = {
    "round-robin": {"picker": "round_robin"},
    "random": {"picker": "random"},
    "least-outstanding": {"scorers": {"requests": 1.0}, "tie_break": "lru"},
    "power-of-two": {"scorers": {"requests": 1.0}, "picker": "power_of_two"},
    "prefix-affinity": {
        "scorers": {"load": 1.0, "prefix": 0.5},
        "tie_break": "lru",
        "load_bound": {"enabled": True},
    },
    "feedback": {"scorers": {"load": 1.0}, "tie_break": "lru", "feedback": {"enabled": True}},
    DEFAULT_POLICY: {
        "scorers": {"load": 1.0, "prefix": 0.3, "kv": 0.05},
        "tie_break": "lru",
        "load_bound": {"enabled": True},
        "feedback": {"enabled": True},
    },
}
"""Named compositions; `RoutingSpec.params` is deep-merged onto one of these."""

PRESET_SUMMARIES: dict[str, str] = {
    "round-robin": "Cycle over eligible workers in name order; ignores load and speed (the baseline).",
    "random": "Seeded uniform choice among eligible workers.",
    "least-outstanding": "Fewest queued + running requests (plus the router's own in-flight ones).",
    "power-of-two": "Two seeded random candidates; the one with fewer outstanding requests wins.",
    "prefix-affinity": "Longest cached prefix, priced against queued tokens, within a load bound (c=1.25).",
    "feedback": "Least predicted token cost corrected by observed TTFT/TPOT/failure EWMAs.",
    DEFAULT_POLICY: "Outstanding-token cost + bounded prefix affinity + latency feedback + safe mode.",
}


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` onto `base`, recursing into nested mappings (lists and scalars replace)."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def preset_params(name: str, overrides: dict[str, Any] | None = None) -> PolicyParams:
    """The validated parameters of preset `name` with `overrides` deep-merged on top."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, sorted(PRESETS), n=3, cutoff=0.3)
        hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(sorted(PRESETS))}"
        raise SpecError(f"routing.policy: unknown preset {name!r}; {hint}")
    data = deep_merge(PRESETS[name], overrides or {})
    return validate(PolicyParams, data, f"routing.params (policy {name!r})")


class RoutingSpec(Spec):
    """The `routing:` section of a plan: a preset, overrides of its parameters, and safe mode."""

    policy: str = DEFAULT_POLICY
    """Preset name, e.g. `round-robin`, `prefix-affinity`, `fleetwise-default`."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Overrides deep-merged onto the preset's parameters (see `PolicyParams`)."""
    safe_mode: SafeModeSpec = SafeModeSpec()
    """Behaviour when the fleet view is stale."""

    @model_validator(mode="after")
    def _check(self) -> RoutingSpec:
        try:
            preset_params(self.policy, self.params)
        except SpecError as err:
            raise ValueError(str(err)) from None
        return self

    def resolved(self) -> PolicyParams:
        """The preset's parameters with this spec's overrides applied."""
        return preset_params(self.policy, self.params)
