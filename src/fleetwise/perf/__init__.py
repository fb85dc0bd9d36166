"""L2: the performance model: step costs, memory fit, KV transfer. Pure functions of specs.

`PerfModel` (roofline with a `Profile` of efficiency factors) is the one step-time model the
planner, simulator and emulator share; `calibrate` fits a `Profile` to measured ground truth;
`kv` prices KV hand-offs between prefill and decode pools.
"""

from fleetwise.perf.kv import kv_transfer_bytes, kv_transfer_s
from fleetwise.perf.profile import Profile
from fleetwise.perf.roofline import BoundPerf, PerfModel
from fleetwise.perf.types import BatchShape, Deployment, SeqWork, StepCost

__all__ = [
    "BatchShape",
    "BoundPerf",
    "Deployment",
    "PerfModel",
    "Profile",
    "SeqWork",
    "StepCost",
    "kv_transfer_bytes",
    "kv_transfer_s",
]
