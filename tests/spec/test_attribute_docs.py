"""Spec field descriptions come from attribute docstrings read once per module
(`fleetwise.spec.attribute_docs`): the same strings pydantic's `use_attribute_docstrings` finds."""

from __future__ import annotations

import importlib
import pkgutil
from typing import ClassVar

import pytest
from pydantic import Field
from pydantic._internal._docs_extraction import extract_docstrings_from_cls

import fleetwise
from fleetwise.spec.attribute_docs import attribute_docstrings
from fleetwise.spec.base import Spec

SPEC_HOMES = ("fleetwise.gateway.config", "fleetwise.emulator.config", "fleetwise.emulator.kv_events",
              "fleetwise.sim.scenario_spec", "fleetwise.perf.profile")
"""Modules outside `fleetwise.spec` that define spec classes."""


def _all_specs() -> list[type[Spec]]:
    for info in pkgutil.iter_modules(importlib.import_module("fleetwise.spec").__path__, "fleetwise.spec."):
        importlib.import_module(info.name)
    for name in SPEC_HOMES:
        importlib.import_module(name)
    seen, todo = [], list(Spec.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls not in seen and cls.__module__.startswith(fleetwise.__name__):
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return sorted(seen, key=lambda c: (c.__module__, c.__qualname__))


def test_every_spec_class_reads_the_docstrings_pydantic_reads() -> None:
    specs = _all_specs()
    assert len(specs) > 60
    documented = 0
    for cls in specs:
        ours = attribute_docstrings(cls)
        assert ours == extract_docstrings_from_cls(cls, use_inspect=True), cls.__qualname__
        documented += len(ours)
        for name, doc in ours.items():  # an explicit description wins over the docstring (ClassVars: no field)
            info = cls.model_fields.get(name)
            assert info is None or info.description == doc or "description" in info._attributes_set, (cls.__qualname__, name)
    assert documented > 200


def test_nested_and_local_classes_and_explicit_descriptions() -> None:
    class Outer(Spec):
        a: int = 0
        """The a.

        Two lines."""
        b: int = Field(0, description="explicit")
        """Not the description."""
        c: int = 0
        d: ClassVar[int] = 1
        """Not a field's."""
        _e = 1
        """Follows no annotated name: not a field's."""

        class Inner(Spec):
            x: int = 0
            """The x."""

        def method(self) -> None:
            y: int = 0
            """Inside a function: not a field's."""
            del y

    assert attribute_docstrings(Outer) == {"a": "The a.\n\nTwo lines.", "b": "Not the description.",
                                           "d": "Not a field's."}
    assert attribute_docstrings(Outer) == extract_docstrings_from_cls(Outer, use_inspect=True)
    assert attribute_docstrings(Outer.Inner) == {"x": "The x."}
    assert [Outer.model_fields[n].description for n in "abc"] == ["The a.\n\nTwo lines.", "explicit", None]
    schema = Outer.model_json_schema()
    assert schema["properties"]["a"]["description"] == "The a.\n\nTwo lines."
    assert Outer.Inner.model_json_schema()["properties"]["x"]["description"] == "The x."


def test_a_deferred_spec_validates_and_reports_as_before() -> None:
    from fleetwise.errors import SpecError
    from fleetwise.spec.base import validate
    from fleetwise.spec.slo import SLOSpec

    assert validate(SLOSpec, {}, "slo") == SLOSpec()
    with pytest.raises(SpecError, match=r"^slo: ttft_max_s: .*\(got 'soon'\)"):
        validate(SLOSpec, {"ttft_max_s": "soon"}, "slo")
