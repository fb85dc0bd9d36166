"""L0: declared specs (pydantic + stdlib only). Validated once, at the edge."""

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
