"""Declarative fault scenarios: what goes wrong in a fleet, and when: the one fault vocabulary.

Owns the shape of each fault (a tagged union on `kind`, times in modelled seconds from the start
of the run), its effect parameters (`EFFECT_FIELDS`: what a live replica's `POST /admin/faults`
body carries besides `kind`), loading a scenario file and checking it against a plan. The same
file drives the simulator (`fleetwise.sim.fault_kinds`: each kind's simulated effect) and a live
emulated fleet (`fleetwise.emulator.faults`: each kind's live effect); a side that cannot model
a kind refuses it by name with the reason. Replicas are named `<pool>-<index>` (index from 0), as
in the plan's per-replica results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal, get_args

from pydantic import Field, model_validator

from fleetwise.errors import SpecError, quote
from fleetwise.spec.base import Spec, load_document
from fleetwise.spec.limits import MAX_DURATION_S, MAX_FACTOR, MAX_TOKENS, MIN_FACTOR

if TYPE_CHECKING:
    from fleetwise.spec.plan import PlanSpec


class IntervalFault(Spec):
    """A fault active during [start_s, end_s) (the subclass declares both fields, so each kind's
    fields keep their documented order); checks the interval is not empty."""

    EFFECT_FIELDS: ClassVar[tuple[str, ...]] = ()
    """Fields that say what the fault does (not where or when): a live replica's admin body."""

    @model_validator(mode="after")
    def _check_interval(self) -> IntervalFault:
        start_s, end_s = getattr(self, "start_s"), getattr(self, "end_s")  # noqa: B009 (declared by the kind)
        if end_s <= start_s:
            raise ValueError(f"end_s={end_s} must be after start_s={start_s}")
        return self


class ReplicaCrash(Spec):
    """A replica dies at `at_s`; its in-flight requests fail (or are retried once, per the plan)."""

    kind: Literal["crash"] = "crash"
    replica: str
    """Replica name, `<pool>-<index>`."""
    at_s: float = Field(ge=0, le=MAX_DURATION_S)
    """Virtual time of the crash."""
    restart_after_s: float | None = Field(default=60.0, ge=0, le=MAX_DURATION_S)
    """Cold-start delay until the replica serves again; null = never comes back."""
    EFFECT_FIELDS: ClassVar[tuple[str, ...]] = ()


class Slowdown(IntervalFault):
    """A replica runs every step `factor` times slower during [start_s, end_s) (thermal throttling, noisy neighbour)."""

    kind: Literal["slowdown"] = "slowdown"
    replica: str
    """Replica name, `<pool>-<index>`."""
    start_s: float = Field(ge=0, le=MAX_DURATION_S)
    end_s: float = Field(gt=0, le=MAX_DURATION_S)
    factor: float = Field(ge=MIN_FACTOR, le=MAX_FACTOR)
    """Step-time multiplier (2.0 = half speed)."""
    EFFECT_FIELDS = ("factor",)


class KvLinkFault(IntervalFault):
    """KV links degrade (`bandwidth_factor` in (0, 1)) or fail (`bandwidth_factor` = 0) during [start_s, end_s).

    While a link is down its transfers fail; the plan's `failure_domains` say whether the
    request fails or is prefilled again.
    """

    kind: Literal["kv_link"] = "kv_link"
    replica: str | None = None
    """Replica whose port is affected (`<pool>-<index>`); null = every KV port."""
    start_s: float = Field(ge=0, le=MAX_DURATION_S)
    end_s: float = Field(gt=0, le=MAX_DURATION_S)
    bandwidth_factor: float = Field(ge=0, le=1)
    """Fraction of bandwidth left (0 = link down)."""
    EFFECT_FIELDS = ("bandwidth_factor",)


class DecodeFull(IntervalFault):
    """Decode replicas refuse new KV during [start_s, end_s) (their pool is full): a hand-off to
    one fails decode admission, the prefill frees the KV and the request is prefilled again."""

    kind: Literal["decode_full"] = "decode_full"
    replica: str | None = None
    """Decode replica that refuses (`<pool>-<index>`); null = every decode replica."""
    start_s: float = Field(ge=0, le=MAX_DURATION_S)
    end_s: float = Field(gt=0, le=MAX_DURATION_S)


class StaleView(IntervalFault):
    """The router's view of the fleet stops refreshing during [start_s, end_s) (control plane stall)."""

    kind: Literal["stale_view"] = "stale_view"
    start_s: float = Field(ge=0, le=MAX_DURATION_S)
    end_s: float = Field(gt=0, le=MAX_DURATION_S)


class RollingUpgrade(Spec):
    """Replicas of `pool` leave `batch` at a time from `start_s`: drain (no new requests, finish
    in-flight), stay down `restart_after_s`, come back serving `new_model_version`; the next batch
    leaves once the whole batch is back. With `matched_with`, the replicas of both pools take
    turns in matched slices."""

    kind: Literal["rolling_upgrade"] = "rolling_upgrade"
    pool: str
    """Pool name in the plan."""
    matched_with: str | None = None
    """A second pool upgraded in the same sequence (a P/D fleet's other side): one replica at a
    time, the next from whichever pool has the smaller upgraded fraction, so both versions keep
    prefill and decode replicas that can pair until the last turn."""
    start_s: float = Field(ge=0, le=MAX_DURATION_S)
    new_model_version: str
    """Model version the replicas report after the upgrade."""
    restart_after_s: float = Field(default=30.0, ge=0, le=MAX_DURATION_S)
    """Cold-start delay of each replica once drained."""
    batch: int = Field(default=1, ge=1)
    """Replicas out at once: the next `batch` of the upgrade order drain together (a planning
    spec's `headroom.upgrade_batch_replicas`)."""
    EFFECT_FIELDS: ClassVar[tuple[str, ...]] = ()


class Hang(IntervalFault):
    """A replica stops stepping during [start_s, end_s) (a stuck collective or kernel): it still
    accepts requests and its health stays up, but nothing it holds progresses until the end."""

    kind: Literal["hang"] = "hang"
    replica: str
    """Replica name, `<pool>-<index>`."""
    start_s: float = Field(ge=0, le=MAX_DURATION_S)
    end_s: float = Field(gt=0, le=MAX_DURATION_S)


class FailRequests(IntervalFault):
    """A replica (or every replica) refuses new requests with HTTP `status` during [start_s,
    end_s); requests it already runs continue. A decode replica refusing refuses the hand-off."""

    kind: Literal["fail_requests"] = "fail_requests"
    replica: str | None = None
    """Replica that refuses (`<pool>-<index>`); null = every replica."""
    start_s: float = Field(ge=0, le=MAX_DURATION_S)
    end_s: float = Field(gt=0, le=MAX_DURATION_S)
    status: Literal[429, 500, 502, 503] = 503
    """HTTP status the refused requests get."""
    EFFECT_FIELDS = ("status",)


class DropStreams(IntervalFault):
    """A replica's (or every replica's) streamed responses are cut once they have sent
    `after_tokens` tokens during [start_s, end_s): the connection closes without a finish reason."""

    kind: Literal["drop_streams"] = "drop_streams"
    replica: str | None = None
    """Replica whose streams are cut (`<pool>-<index>`); null = every replica."""
    start_s: float = Field(ge=0, le=MAX_DURATION_S)
    end_s: float = Field(gt=0, le=MAX_DURATION_S)
    after_tokens: int = Field(default=1, ge=0, le=MAX_TOKENS)
    """Tokens a stream sends before it is cut (0: cut before the first token)."""
    EFFECT_FIELDS = ("after_tokens",)


FaultSpec = Annotated[
    ReplicaCrash | Slowdown | KvLinkFault | DecodeFull | StaleView | RollingUpgrade | Hang | FailRequests
    | DropStreams, Field(discriminator="kind")
]
FAULT_MODELS: tuple[type[Spec], ...] = get_args(get_args(FaultSpec)[0])
"""Every fault kind's model, in the union's order (each side registers an effect or a refusal for each)."""


@dataclass(frozen=True)
class CannotModel:
    """What a side (the simulator, or a live fleet) registers for a fault kind it cannot model:
    the reason, which the refusal names."""

    why: str


class FaultScenario(Spec):
    """A named list of faults applied to one simulation run."""

    name: str = "faults"
    faults: list[FaultSpec] = Field(default_factory=list)
    """Faults, each with its own times; they may overlap."""

    @staticmethod
    def load(path: str | Path) -> FaultScenario:
        """Read and validate a faults file (SpecError naming the field on a bad one)."""
        return load_document(FaultScenario, path)


def _check_not_down(scenario: FaultScenario, k: int, f: ReplicaCrash, at: str) -> None:
    """SpecError when crash `k` hits its replica while another crash keeps it down (it would do nothing)."""
    for j, g in enumerate(scenario.faults):
        if j == k or not isinstance(g, ReplicaCrash) or g.replica != f.replica or (g.at_s, j) > (f.at_s, k):
            continue
        back = math.inf if g.restart_after_s is None else g.at_s + g.restart_after_s
        if f.at_s <= back:  # a crash at the restart instant comes first, so it too finds the replica down
            until = "never back" if back == math.inf else f"back at {back:g} s"
            raise SpecError(f"{at}: replica {f.replica} is already down at {f.at_s:g} s (faults.{j} crashed it at "
                            f"{g.at_s:g} s, {until}), so this crash would change nothing; "
                            + (f"move it after {back:g} s or remove it" if back < math.inf else "remove it"))


def check_faults_apply(scenario: FaultScenario, plan: PlanSpec, where: str = "faults") -> None:
    """SpecError for a fault that cannot act on `plan`: an unknown replica or pool, or a KV-path
    fault (`kv_link`, `decode_full`) on a colocated plan, which has no KV path, so it would do nothing."""
    replicas = {p.name: p for p in plan.pools}
    for k, f in enumerate(scenario.faults):
        at = f"{where}: faults.{k} ({f.kind})"
        if isinstance(f, KvLinkFault | DecodeFull) and not plan.disaggregated:
            raise SpecError(f"{at}: plan {quote(plan.name)} is colocated (no prefill-to-decode KV path), so this "
                            "fault would change nothing; remove it or use a prefill/decode plan")
        name = getattr(f, "replica", None)
        if name is not None:
            pool_name, _, index = name.rpartition("-")
            pool = replicas.get(pool_name)
            if pool is None or not index.isdigit() or int(index) >= pool.replicas:
                known = ", ".join(f"{p.name}-0..{p.replicas - 1}" for p in plan.pools[:4])
                raise SpecError(f"{at}: replica={quote(name)} is not in the plan; its replicas are {known}")
            if isinstance(f, DecodeFull) and pool.role != "decode":
                raise SpecError(f"{at}: replica={quote(name)} is a {pool.role} replica; decode_full applies to "
                                "decode replicas")
        if isinstance(f, ReplicaCrash):
            _check_not_down(scenario, k, f, at)
        for field, pool_name in (("pool", getattr(f, "pool", None)), ("matched_with", getattr(f, "matched_with", None))):
            if isinstance(f, RollingUpgrade) and pool_name is not None and pool_name not in replicas:
                raise SpecError(f"{at}: {field}={quote(pool_name)} is not a pool of the plan; pools are "
                                f"{', '.join(p.name for p in plan.pools[:8])}")


SIDES = {"prefill": "decode", "decode": "prefill"}
"""The other side of each half of a P/D plan."""


def version_skew_warnings(scenario: FaultScenario, plan: PlanSpec, where: str = "faults") -> list[str]:
    """One line per rolling upgrade of one side of a P/D plan that leaves a pool of the other side
    on another version: once it ends, no KV hand-off between them is accepted (version skew)."""
    out = []
    upgrades = [f for f in scenario.faults if isinstance(f, RollingUpgrade)]
    roles = {p.name: p.role for p in plan.pools}
    for k, f in enumerate(scenario.faults):
        if not isinstance(f, RollingUpgrade) or roles.get(f.pool) not in SIDES:
            continue
        side = roles[f.pool]
        other = SIDES[side]
        upgraded = {name for g in upgrades if g.new_model_version == f.new_model_version
                    for name in (g.pool, g.matched_with) if name is not None}
        behind = [p.name for p in plan.pools if p.role == other and p.name not in upgraded
                  and p.model_version != f.new_model_version]
        if behind:
            names = ", ".join(repr(n) for n in behind)
            out.append(f"{where}: faults.{k} ({f.kind}): pool {f.pool!r} is the {side} side of P/D plan "
                       f"{plan.name!r} and no fault upgrades its {other} pool{'s' if len(behind) > 1 else ''} {names} "
                       f"to {f.new_model_version}: once the upgrade ends no decode replica accepts a prefill replica's "
                       f"KV, and every request fails for version skew (kv_version_skew); add "
                       f"matched_with: {behind[0]} to upgrade both sides in matched slices")
    return out
