"""The KV format an emulated replica declares in its hand-offs, and the check a pull passes first.

Owns the `kv_transfer_params` fields that carry a prefill replica's KV format (next to vLLM's
NIXL fields: `model_version`, `kv_cache_dtype` (the stored encoding), `block_size`, `vendor`,
and vLLM's own `tp_size`) and reading them back. The rule itself is
`fleetwise.spec.kv_format.kv_compat`, the one the simulator and the routers use; a field the
sender leaves out is not declared and matches anything.
"""

from __future__ import annotations

from typing import Any

from fleetwise.emulator.protocol import ApiError
from fleetwise.spec.kv_format import KvFormat, kv_compat

__all__ = ["check_pull", "format_params", "params_format"]

INCOMPATIBLE_KV_STATUS = 409
"""HTTP status of a KV pull refused for an incompatible format (Conflict: the request is fine,
the pair is not; the router should have paired the request with a compatible decode replica)."""


def format_params(f: KvFormat) -> dict[str, Any]:
    """The `kv_transfer_params` fields declaring format `f` (vLLM's `tp_size` is sent already)."""
    return {"model_version": f.model_version, "kv_cache_dtype": f.kv_dtype, "block_size": f.block_size,
            "vendor": f.vendor}


def params_format(ktp: dict[str, Any], default_version: str) -> KvFormat:
    """The sender's format as `kv_transfer_params` declare it (undeclared parts: None)."""
    def get(key: str, kind: type) -> Any:
        v = ktp.get(key)
        return v if isinstance(v, kind) and not isinstance(v, bool) else None

    return KvFormat(get("model_version", str) or default_version, get("kv_cache_dtype", str),
                    get("block_size", int), get("tp_size", int), get("vendor", str))


def check_pull(src: KvFormat, dst: KvFormat, where: str) -> None:
    """ApiError (409) naming the field when `dst` cannot take `src`'s KV; `where` says which side refuses."""
    c = kv_compat(src, dst)
    if not c.ok:
        raise ApiError(INCOMPATIBLE_KV_STATUS, f"{where} refuses the KV pull: {c.reason}", "kv_transfer_params")
