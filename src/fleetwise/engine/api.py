"""Public surface of the engine layer: import `Engine`, `EngineConfig`, `Step`, `StepOutput` here.

The engine is a clockless state machine (vLLM v1's `schedule()` then `update_from_output()`):
a driver calls `schedule(horizon_s)`, advances its own clock by `Step.duration_s`, then calls
`complete()`. The records live in `records.py`, the state machine in `scheduler.py` (its state
and views in `state.py`), the KV block pool in `blocks.py`; this module only re-exports them so
callers have one import path.
"""

from __future__ import annotations

from fleetwise.engine.records import EngineConfig, Step, StepOutput
from fleetwise.engine.scheduler import Engine
from fleetwise.engine.state import StepTimeFn

__all__ = ["Engine", "EngineConfig", "Step", "StepOutput", "StepTimeFn"]
