"""L3: the engine as a clockless state machine (KV block pool, continuous batching, roles), and the
binary heap (`heap`) its decode set shares with the simulator's event queue."""

from fleetwise.core.compiled import install as _install_compiled

_install_compiled()  # before any engine module loads: compiled or source (fleetwise.core.compiled)
