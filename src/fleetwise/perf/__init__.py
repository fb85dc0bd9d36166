"""L2: the performance model: step costs, memory fit, KV transfer. Pure functions of specs, and
one clockless model of shared KV-link bandwidth (`kv_share.SharedPorts`) that the simulator's
network and the emulator's KV ports both drive on their own clocks.

`PerfModel` (roofline with a `Profile` of efficiency factors) is the one step-time model the
planner, simulator and emulator share; `calibrate` fits a `Profile` to measured ground truth;
`kv` prices KV hand-offs between prefill and decode pools; `uncertainty` gives each predicted step
time a band from the calibration's held-out errors (`PerfModel.step_time_band`); `flips` re-makes a
caller's decision with every step time at the fast and the slow end of its band.
"""

from fleetwise.core.compiled import install as _install_compiled

_install_compiled()  # before any perf module loads: compiled or source (fleetwise.core.compiled)

from fleetwise.perf.kv import kv_transfer_bytes, kv_transfer_s  # noqa: E402
from fleetwise.perf.profile import Profile  # noqa: E402
from fleetwise.perf.roofline import BoundPerf, PerfModel  # noqa: E402
from fleetwise.perf.types import BatchShape, Deployment, SeqWork, StepCost  # noqa: E402
from fleetwise.perf.uncertainty import Band  # noqa: E402

__all__ = [
    "Band",
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
