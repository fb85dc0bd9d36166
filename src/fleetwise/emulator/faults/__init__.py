"""The live effect of each fault kind: what it does to a running emulated replica.

The kinds and their parameters are declared once, in `fleetwise.spec.faults` (the vocabulary the
simulator reads too). Owns the replica's fault state (`FaultState`) and the kinds an operator can
inject through `POST /admin/faults` (`REGISTRY`). Each kind is one small module in this package
that subclasses `FaultKind`, names its spec model (`spec`: the admin body's parameters are that
model's `EFFECT_FIELDS`, validated by the same fields) and registers itself with `@register`,
which also registers its timed replay of a fault file (`replay.LIVE`); the server reads
`FaultState` where it matters (step time, stepping, intake, streaming, process exit). Adding a
kind is a new file plus one import line in `_KIND_MODULES`, never an edit to an if-chain.

Body: `{"kind": NAME, ...params, "duration_s": S?}`; `duration_s` (modelled seconds) clears the
fault by itself after that long. `{"kind": "clear"}` clears every fault.

Faults of one kind that overlap compose as the simulator's do (`fleetwise.sim.fault_kinds`): each
injection is an instance of its own, cleared by itself, and the kind's effect is `compose` over the
instances in force (slowdowns and KV link factors multiply, hangs and refusals nest).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from fleetwise.emulator.faults.replay import LIVE, LiveAction, interval_actions
from fleetwise.errors import SpecError
from fleetwise.spec.base import Spec
from fleetwise.spec.plan import PlanSpec


@dataclass
class FaultState:
    """What the active faults ask of the server (the all-clear defaults mean: no fault)."""

    slowdown: float = 1.0
    """Factor on every step time."""
    hung: bool = False
    """The engine stops stepping: requests are accepted and never progress (health stays 200)."""
    fail_status: int | None = None
    """New generation requests get this HTTP status with an error body."""
    drop_after_tokens: int | None = None
    """Streams are cut (connection closed, no [DONE]) once they have sent this many tokens."""
    kv_link_factor: float = 1.0
    """Fraction of its bandwidth this replica's KV port keeps (a degraded link)."""
    active: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Active kinds and their parameters (GET /admin/faults): the latest injection's, with the
    effect the instances in force compose to, and `instances` when more than one is."""
    instances: dict[str, dict[int, tuple[Any, dict[str, Any]]]] = field(default_factory=dict)
    """Kind -> instance id -> (its value, its parameters), in injection order."""
    next_id: int = 0


class FaultParams(BaseModel):
    """Parameters every kind accepts."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    duration_s: float | None = None
    """Clear this fault by itself after this many modelled seconds (None: until cleared)."""


class FaultKind:
    """One kind: the live effect of `spec`. `params` (built by `register` from the spec model's
    `EFFECT_FIELDS`) validates the body; `apply` sets the `FaultState` field `state_field` to
    `value(params)`, `clear` puts its all-clear default back; `actions` replays a fault of a file
    on a live fleet."""

    spec: ClassVar[type[Spec]]
    name: ClassVar[str]
    """The spec model's `kind` (set by `register`)."""
    params: ClassVar[type[FaultParams]] = FaultParams
    state_field: ClassVar[str] = ""
    """The `FaultState` field this kind sets ("" for a kind that only acts, as `crash`)."""

    def refused(self, p: Any) -> str:
        """Why these parameters cannot be applied live ("" when they can)."""
        return ""

    def value(self, p: Any) -> Any:
        """What one instance asks `state_field` to be: by default the value of the kind's one effect field."""
        return getattr(p, self.spec.EFFECT_FIELDS[0])  # type: ignore[attr-defined]

    def compose(self, values: list[Any]) -> Any:
        """The state field's value with these instances in force (oldest first): by default the
        latest's (a refusal or hang nests: it lasts while any instance does)."""
        return values[-1]

    def apply(self, state: FaultState, p: Any, actions: FaultActions) -> int:
        """Add one instance of this kind; returns its id (for `clear_one`)."""
        state.next_id += 1
        state.instances.setdefault(self.name, {})[state.next_id] = (
            self.value(p) if self.state_field else None, p.model_dump())
        self._refresh(state)
        return state.next_id

    def clear(self, state: FaultState, instance: int | None = None) -> None:
        """Undo one instance (None: every one) of this kind; the others in force still compose."""
        held = state.instances.get(self.name, {})
        if instance is None:
            held.clear()
        else:
            held.pop(instance, None)
        self._refresh(state)

    def _refresh(self, state: FaultState) -> None:
        """Set the state field and the `active` entry from the instances in force."""
        held = list(state.instances.get(self.name, {}).values())
        if not held:
            state.instances.pop(self.name, None)
            state.active.pop(self.name, None)
            if self.state_field:
                setattr(state, self.state_field, FaultState.__dataclass_fields__[self.state_field].default)
            return
        shown = dict(held[-1][1])
        if self.state_field:
            value = self.compose([v for v, _ in held])
            setattr(state, self.state_field, value)
            if self.spec.EFFECT_FIELDS:  # type: ignore[attr-defined]
                shown[self.spec.EFFECT_FIELDS[0]] = value  # type: ignore[attr-defined]
        if len(held) > 1:
            shown["instances"] = len(held)
        state.active[self.name] = shown

    def actions(self, fault: Any, plan: PlanSpec) -> list[LiveAction]:
        """Fault `fault` of a file on a live fleet: this kind's body, with the fault's effect
        fields, sent to its replica (or every replica) at its start, for its interval."""
        effect = {f: getattr(fault, f) for f in self.spec.EFFECT_FIELDS}  # type: ignore[attr-defined]
        why = self.refused(self.params.model_validate({"kind": self.name, **effect}))
        if why:
            raise SpecError(f"a live fleet cannot replay it: {why}")
        what = " ".join([self.name, *(f"{k}={v}" for k, v in effect.items())])
        return interval_actions(fault, plan, {"kind": self.name, **effect}, what)


@dataclass
class FaultActions:
    """What a fault may do to the server beyond setting state."""

    crash: Callable[[], None]
    changed: Callable[[], None]
    """Call after the state changed (re-binds step times, wakes the step loop)."""


REGISTRY: dict[str, FaultKind] = {}


def register(cls: type[FaultKind]) -> type[FaultKind]:
    """Class decorator: add a kind to the registry under its spec model's `kind`, its body's
    parameters the model's `EFFECT_FIELDS`, and its replay to `replay.LIVE`."""
    spec = cls.spec
    cls.name = spec.model_fields["kind"].default
    if cls.name in REGISTRY:
        raise ValueError(f"fault kind {cls.name!r} registered twice")
    if cls.state_field and cls.state_field not in FaultState.__dataclass_fields__:
        raise ValueError(f"fault kind {cls.name!r}: state_field={cls.state_field!r} is not a FaultState field")
    fields: dict[str, Any] = {f: (spec.model_fields[f].annotation, spec.model_fields[f])
                              for f in spec.EFFECT_FIELDS}  # type: ignore[attr-defined]
    cls.params = create_model(f"{cls.__name__}Params", __base__=FaultParams, **fields)
    kind = REGISTRY[cls.name] = cls()
    LIVE.add(spec, kind.actions)
    return cls


class FaultError(ValueError):
    """A fault body that does not validate (the server answers 400 with this message)."""


def parse(body: dict[str, Any]) -> tuple[FaultKind | None, FaultParams]:
    """The kind (None for `clear`) and its validated parameters, or FaultError."""
    name = body.get("kind")
    if name == "clear":
        try:
            return None, FaultParams.model_validate(body)
        except ValidationError as err:
            raise FaultError(_first_error(err)) from None
    kind = REGISTRY.get(name) if isinstance(name, str) else None
    if kind is None:
        raise FaultError(f"kind={name!r} is not a fault kind; known: {', '.join(sorted(REGISTRY))}, clear")
    try:
        params = kind.params.model_validate(body)
    except ValidationError as err:
        raise FaultError(f"{name}: {_first_error(err)}") from None
    if params.duration_s is not None and not params.duration_s > 0:
        raise FaultError(f"{name}: duration_s={params.duration_s} must be > 0 (omit it to keep the fault)")
    why = kind.refused(params)
    if why:
        raise FaultError(f"{name}: {why}")
    return kind, params


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or "body"
    return f"{loc}: {e['msg']} (got {e.get('input')!r:.60})"


def clear_all(state: FaultState) -> None:
    """Undo every active fault."""
    for name in list(state.instances):
        clear_one(state, name)


def clear_one(state: FaultState, name: str, instance: int | None = None) -> None:
    """Undo one instance of kind `name` (None: every instance of it)."""
    if name in state.instances:
        REGISTRY[name].clear(state, instance)


_KIND_MODULES = ("slowdown", "hang", "fail_requests", "drop_streams", "crash", "kv_link")
for _m in _KIND_MODULES:
    importlib.import_module(f"{__name__}.{_m}")
