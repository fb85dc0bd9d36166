"""L0: declared specs (pydantic + stdlib, `errors` and `registry` only). Validated once, at the edge.

Also owns the serving engines' Prometheus metric names (`engine_metrics`: one registered entry per
engine), which the gateway's scrape and calibration read and the emulator writes.
"""

from fleetwise.spec.base import Spec, load_document, read_document, validate
from fleetwise.spec.hardware import AcceleratorSpec, LinkSpec
from fleetwise.spec.model import MLASpec, ModelSpec, MoESpec

__all__ = [
    "AcceleratorSpec",
    "LinkSpec",
    "MLASpec",
    "ModelSpec",
    "MoESpec",
    "Spec",
    "load_document",
    "read_document",
    "validate",
]
