"""Fault kinds an operator can inject into a running emulator through `POST /admin/faults`.

Owns the registry of kinds and the state they set (`FaultState`). Each kind is one small module
in this package that subclasses `FaultKind`, declares its parameters as a pydantic model and
registers itself with `@register`; the server reads `FaultState` where it matters (step time,
stepping, intake, streaming, process exit). Adding a kind is a new file plus one import line
in `_KIND_MODULES`, never an edit to an if-chain.

Body: `{"kind": NAME, ...params, "duration_s": S?}`; `duration_s` (modelled seconds) clears the
fault by itself after that long. `{"kind": "clear"}` clears every fault.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError


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
    active: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Active kinds and the parameters they were injected with (GET /admin/faults)."""


class FaultParams(BaseModel):
    """Parameters every kind accepts."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    duration_s: float | None = None
    """Clear this fault by itself after this many modelled seconds (None: until cleared)."""


class FaultKind:
    """One kind: `params` validates the body, `apply` sets the state, `clear` undoes it."""

    name: ClassVar[str]
    params: ClassVar[type[FaultParams]] = FaultParams

    def apply(self, state: FaultState, p: Any, actions: FaultActions) -> None:
        raise NotImplementedError

    def clear(self, state: FaultState) -> None:
        """Undo this kind (default: nothing to undo)."""


@dataclass
class FaultActions:
    """What a fault may do to the server beyond setting state."""

    crash: Callable[[], None]
    changed: Callable[[], None]
    """Call after the state changed (re-binds step times, wakes the step loop)."""


REGISTRY: dict[str, FaultKind] = {}


def register(cls: type[FaultKind]) -> type[FaultKind]:
    """Class decorator: add a kind to the registry under `cls.name`."""
    if cls.name in REGISTRY:
        raise ValueError(f"fault kind {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls()
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
    return kind, params


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or "body"
    return f"{loc}: {e['msg']} (got {e.get('input')!r:.60})"


def clear_all(state: FaultState) -> None:
    """Undo every active fault."""
    for name in list(state.active):
        clear_one(state, name)


def clear_one(state: FaultState, name: str) -> None:
    """Undo one active kind."""
    if state.active.pop(name, None) is not None:
        REGISTRY[name].clear(state)


_KIND_MODULES = ("slowdown", "hang", "fail_requests", "drop_streams", "crash")
for _m in _KIND_MODULES:
    importlib.import_module(f"{__name__}.{_m}")
