"""The emulator's max_model_len is its pool's, as vLLM's: unset, the model's context lowered to what
the KV cache holds (and /v1/models says so); set beyond the cache, refused at start naming the fix."""

from __future__ import annotations

import pytest
from emu_helpers import cfg, run, serve

from fleetwise.emulator.app import create_app
from fleetwise.errors import SpecError

SMALL_CACHE = 0.3
"""gpu_memory_utilization leaving llama-3.1-8b on one H100 a KV cache far below its 131,072-token context."""


def test_unset_max_model_len_is_lowered_to_the_kv_cache() -> None:
    async def go() -> None:
        async with serve(cfg(gpu_memory_utilization=SMALL_CACHE)) as (app, c):
            r = app.state.replica
            assert r.max_model_len < 131072
            assert r.max_model_len <= r.kv_capacity_tokens
            m = (await c.get("/v1/models")).json()["data"][0]
            assert m["max_model_len"] == r.max_model_len
            too_long = {"prompt": "x " * r.max_model_len, "max_tokens": 1}
            assert (await c.post("/v1/completions", json=too_long)).status_code == 400
    run(go())


def test_max_model_len_beyond_the_kv_cache_is_refused_at_start() -> None:
    with pytest.raises(SpecError, match="max_model_len"):
        create_app(cfg(gpu_memory_utilization=SMALL_CACHE, max_model_len=131072))
