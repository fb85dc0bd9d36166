"""L3: the engine as a clockless state machine (KV block pool, continuous batching, roles), and the
binary heap of the simulator's event queue (`heap`: engine-neutral, below `sim`)."""

from fleetwise.core.compiled import install as _install_compiled

_install_compiled()  # before any engine module loads: compiled or source (fleetwise.core.compiled)
