"""Numeric formats and their storage sizes."""

from __future__ import annotations

from typing import Literal, get_args

WeightDtype = Literal["bf16", "fp8", "int4"]
KvDtype = Literal["bf16", "fp8"]
ComputeDtype = Literal["bf16", "fp8", "int8", "fp4"]

WEIGHT_DTYPES: tuple[str, ...] = get_args(WeightDtype)
"""Weight storage formats a model may be served in (what `--weight-dtype` and `weight_dtypes` accept)."""
KV_DTYPES: tuple[str, ...] = get_args(KvDtype)
"""KV-cache storage formats (what `--kv-dtype` and `kv_dtype` accept)."""

BYTES_PER_ELEMENT: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}
"""Bytes per stored element of each numeric format."""

COMPUTE_DTYPE_FOR_WEIGHTS: dict[str, str] = {"bf16": "bf16", "fp8": "fp8", "int4": "bf16"}
"""Tensor-core format a weight format computes in: weight-only int4 (AWQ/GPTQ style) keeps
activations in bf16, so its GEMMs run at the bf16 rate."""


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a storage format."""
    return BYTES_PER_ELEMENT[dtype]
