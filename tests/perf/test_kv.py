"""KV hand-off: bytes follow the model's KV layout; time = latency + bytes / (parallel lanes x link)."""

from __future__ import annotations

import pytest

from fleetwise.errors import SpecError
from fleetwise.perf.kv import kv_shards, kv_transfer_bytes, kv_transfer_s, kv_transfer_sizer
from fleetwise.perf.types import Deployment
from fleetwise.spec.catalog import get_gpu, get_model
from fleetwise.spec.hardware import LinkSpec
from fleetwise.spec.parallel import ParallelismSpec

NIC = LinkSpec(name="ib", bandwidth_bytes_per_s=50e9, latency_s=10e-6)


def dep(model: str = "llama-3.1-8b", tp: int = 1, pp: int = 1, kv_dtype: str = "bf16") -> Deployment:
    return Deployment(get_model(model), get_gpu("h200-sxm"), ParallelismSpec(tp=tp, pp=pp), kv_dtype=kv_dtype)


def test_bytes_are_tokens_times_kv_per_token():
    # llama-3.1-8b: 2 * 32 layers * 8 kv heads * 128 dims * 2 bytes = 131072 bytes per token
    assert kv_transfer_bytes(1000, dep()) == 1000 * 131072
    assert kv_transfer_bytes(1000, dep(kv_dtype="fp8")) == 1000 * 65536


def test_mla_moves_the_latent():
    # deepseek-v3: 61 layers * (512 + 64) * 2 bytes
    assert kv_transfer_bytes(10, dep("deepseek-v3", tp=8)) == 10 * 61 * 576 * 2


def test_time_is_latency_plus_bytes_over_link():
    assert kv_transfer_s(4096, dep(), dep(), NIC) == pytest.approx(10e-6 + 4096 * 131072 / 50e9, rel=1e-12)
    assert kv_transfer_s(0, dep(), dep(), NIC) == 0.0


@pytest.mark.parametrize("src_tp,dst_tp,lanes", [(1, 1, 1), (4, 4, 4), (4, 2, 2), (8, 8, 8)],
                         ids=["1-1", "4-4", "4-2", "8-8"])
def test_tp_shards_move_in_parallel(src_tp, dst_tp, lanes):
    t = kv_transfer_s(8192, dep(tp=src_tp), dep(tp=dst_tp), NIC)
    assert t == pytest.approx(10e-6 + 8192 * 131072 / (lanes * 50e9), rel=1e-12)


def test_grows_with_context_and_layers():
    small = kv_transfer_s(1024, dep(), dep(), NIC)
    assert kv_transfer_s(2048, dep(), dep(), NIC) > small
    assert kv_transfer_s(1024, dep("llama-3.1-70b", tp=8), dep("llama-3.1-70b", tp=8), NIC) > small / 8


def test_shards_cap_at_kv_heads():
    assert kv_shards(dep("qwen3-30b-a3b", tp=8)) == 4  # 4 KV heads: replicated heads are sent once


def test_mismatched_models_are_an_error():
    with pytest.raises(SpecError, match="KV layouts differ"):
        kv_transfer_s(10, dep("llama-3.1-8b"), dep("qwen3-30b-a3b"), NIC)


def test_negative_tokens_are_an_error():
    with pytest.raises(SpecError, match="tokens=-1"):
        kv_transfer_bytes(-1, dep())


def test_a_pools_sizer_gives_each_transfers_bytes():
    """The per-pool sizer the simulator keeps: tokens x bytes per token, a windowed model's
    windowed layers capped at the window (gemma-3-27b: 10 full and 52 windowed layers of 1,024)."""
    plain, fp8, gemma = kv_transfer_sizer(dep()), kv_transfer_sizer(dep(kv_dtype="fp8")), kv_transfer_sizer(dep("gemma-3-27b"))
    assert (plain(1000), plain(0), fp8(1000)) == (1000 * 131072, 0, 1000 * 65536)
    assert (gemma(512), gemma(16384)) == (512 * 507904, (10 * 16384 + 52 * 1024) * 8192)
    assert [kv_transfer_bytes(n, dep("gemma-3-27b")) for n in (1, 1024, 1025)] == [gemma(n) for n in (1, 1024, 1025)]
