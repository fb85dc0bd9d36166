"""The one KV compatibility rule (`kv_compat`), as a table, and the formats the catalog declares."""

from __future__ import annotations

import pytest

from fleetwise.core.views import WorkerView, kv_format_of
from fleetwise.spec.catalog import get_gpu
from fleetwise.spec.kv_format import KvFormat, declared_format, kv_compat, kv_conversion_s

NV_BF16 = KvFormat("v1", "bf16", 16, 4, "nvidia", ("bf16", "fp8_e4m3fn"))
NV_FP8 = KvFormat("v1", "fp8_e4m3fn", 16, 4, "nvidia", ("bf16", "fp8_e4m3fn"))
AMD_BF16 = KvFormat("v1", "bf16", 16, 4, "amd", ("bf16", "fp8_e4m3fnuz"))
AMD_FP8 = KvFormat("v1", "fp8_e4m3fnuz", 16, 4, "amd", ("bf16", "fp8_e4m3fnuz"))


def fmt(base: KvFormat, **kw: object) -> KvFormat:
    d = {f: getattr(base, f) for f in ("model_version", "kv_dtype", "block_size", "tp", "vendor", "readable")}
    return KvFormat(**{**d, **kw})  # type: ignore[arg-type]


# (prefill, decode, ok, conversions, cross_vendor, words in the refusal)
TABLE = [
    (NV_BF16, NV_BF16, True, (), False, ""),
    (NV_BF16, fmt(NV_BF16, model_version="v2"), False, (), False, "model_version 'v1' -> 'v2'"),
    (fmt(NV_BF16, tp=2), NV_BF16, True, (), False, ""),  # heterogeneous TP whose degrees divide
    (fmt(NV_BF16, tp=8), NV_BF16, True, (), False, ""),
    (fmt(NV_BF16, tp=3), NV_BF16, False, (), False, "tp 3 -> 4"),
    (fmt(NV_BF16, block_size=32), NV_BF16, True, ("block size 32->16",), False, ""),
    (NV_FP8, NV_BF16, True, ("fp8_e4m3fn->bf16",), False, ""),  # the receiver reads its own fp8
    (NV_BF16, AMD_BF16, True, (), True, ""),  # same encoding, another vendor: transport only
    (NV_FP8, AMD_BF16, False, (), False, "no common KV format"),  # OCP fp8 is not CDNA3's fnuz
    (AMD_FP8, NV_FP8, False, (), False, "'fp8_e4m3fnuz' -> 'fp8_e4m3fn'"),
    (AMD_FP8, AMD_BF16, True, ("fp8_e4m3fnuz->bf16",), False, ""),
    (fmt(AMD_BF16, block_size=64), NV_BF16, True, ("block size 64->16",), True, ""),
    (KvFormat("v1"), NV_FP8, True, (), False, ""),  # nothing declared but the version: matches by version
    (KvFormat("v2"), NV_FP8, False, (), False, "model_version"),
]


@pytest.mark.parametrize(("src", "dst", "ok", "conv", "cross", "words"), TABLE)
def test_compatibility_table(src, dst, ok, conv, cross, words):
    c = kv_compat(src, dst)
    assert (c.ok, c.conversions, c.cross_vendor) == (ok, conv, cross)
    assert words in c.reason
    assert c.direct == (ok and not conv and not cross)
    if not ok:
        assert c.reason.count("\n") == 0 and ";" in c.reason  # one line, with the fix after ';'


def test_catalog_cards_declare_their_vendor_encodings():
    h200, mi300, mi355 = (get_gpu(n) for n in ("h200-sxm", "mi300x", "mi355x"))
    assert h200.kv_encoding("fp8") == "fp8_e4m3fn" and mi300.kv_encoding("fp8") == "fp8_e4m3fnuz"
    assert mi355.kv_encoding("fp8") == "fp8_e4m3fn"
    assert get_gpu("ascend-910b").kv_encoding("fp8") == "fp8"  # no fp8 format: declared as asked
    p = declared_format("v1", "fp8", 16, 4, h200)
    assert p == KvFormat("v1", "fp8_e4m3fn", 16, 4, "nvidia", ("bf16", "fp8_e4m3fn"))
    assert not kv_compat(p, declared_format("v1", "fp8", 16, 4, mi300)).ok
    assert kv_compat(declared_format("v1", "bf16", 16, 8, mi300), declared_format("v1", "bf16", 16, 4, h200)).cross_vendor


def test_a_view_reports_its_format_at_the_version_it_serves():
    w = WorkerView("d0", role="decode", model_version="v2", kv_format=NV_BF16)
    assert kv_format_of(w) == fmt(NV_BF16, model_version="v2")
    assert kv_format_of(WorkerView("d1", model_version="v3")) == KvFormat("v3")


def test_conversion_is_a_memory_bound_pass_on_the_receiver():
    c = kv_compat(NV_FP8, NV_BF16)
    assert kv_conversion_s(4.8e9, c, 4.8e12) == pytest.approx(2e-3)  # read + write 4.8 GB at 4.8 TB/s
    assert kv_conversion_s(4.8e9, kv_compat(NV_BF16, NV_BF16), 4.8e12) == 0.0
