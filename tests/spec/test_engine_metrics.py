"""The one registry of engine metric names: one module per engine found by a scan of the package,
each entry checked against the field vocabularies, and a new engine added by one new file."""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fleetwise
from fleetwise.spec import engine_metrics
from fleetwise.spec.engine_metrics import METRIC_NAMES, EngineMetrics


def entry(**kw: object) -> EngineMetrics:
    """A small valid entry, with `kw` replacing its fields."""
    fields: dict[str, object] = {"key": "acme", "engine": "Acme", "prefix": "acme:", "precedence": 3,
                                 "live": {"running": ("acme:running",)}, "counters": {}, "histograms": {},
                                 "replica_label": None, "hint": "an Acme server's /metrics"}
    return EngineMetrics(**{**fields, **kw})  # type: ignore[arg-type]


def test_the_registry_is_the_packages_modules_each_registering_its_own_key():
    modules = sorted(m.name for m in pkgutil.iter_modules(engine_metrics.__path__))
    assert modules == ["llamacpp", "sglang", "vllm"]
    assert list(METRIC_NAMES) == modules
    assert [n.precedence for n in METRIC_NAMES.values()] == [2, 1, 0]


def test_every_name_carries_its_engines_prefix_and_newest_is_the_first_generation():
    for n in METRIC_NAMES.values():
        assert all(name.startswith(n.prefix) for name in n.names())
    vllm = METRIC_NAMES["vllm"]
    assert vllm.newest("kv_usage") == "vllm:kv_cache_usage_perc"
    assert vllm.live["kv_usage"] == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert vllm.names().count("vllm:time_to_first_token_seconds") == 1  # live and calibration share it


@pytest.mark.parametrize("kw,message", [
    ({"live": {"runing": ("acme:running",)}}, "acme metric names: live field 'runing' is not one of running, "),
    ({"counters": {"finished": "acme:finished"}}, "acme metric names: counter field 'finished' is not one of "),
    ({"histograms": {"latency": "acme:latency"}}, "acme metric names: histogram field 'latency' is not one of "),
    ({"live": {"running": ("running",)}}, "acme metric names: 'running' lacks the engine's prefix 'acme:'"),
])
def test_an_entry_with_an_unknown_field_or_a_foreign_name_is_refused(kw, message):
    with pytest.raises(ValueError) as err:
        entry(**kw)
    assert str(err.value).startswith(message)


def test_a_key_registered_twice_is_refused():
    with pytest.raises(ValueError, match="engine metric names 'vllm' registered twice"):
        engine_metrics.register(entry(key="vllm"))


ACME = '''"""Acme's metric names (a test engine)."""

from fleetwise.spec.engine_metrics import EngineMetrics, register

ACME = register(EngineMetrics(
    key="acme", engine="Acme", prefix="acme:", precedence=3, live={"running": ("acme:running",)},
    counters={}, histograms={}, replica_label=None, hint="an Acme server's /metrics"))
'''
PROBE = """
from fleetwise.gateway.scrape import ALIASES, parse_metrics
from fleetwise.spec.engine_metrics import METRIC_NAMES
print(list(METRIC_NAMES), ALIASES["running"][-1], parse_metrics("acme:running 4\\n").running)
"""


def test_adding_an_engine_is_one_new_file_the_gateway_then_reads(tmp_path: Path):
    """A copy of the package with one more module: the registry lists it and the scrape reads its names."""
    root = Path(fleetwise.__file__).parent
    shutil.copytree(root, tmp_path / "fleetwise", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (tmp_path / "fleetwise" / "spec" / "engine_metrics" / "acme.py").write_text(ACME, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FLEETWISE_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "['acme', 'llamacpp', 'sglang', 'vllm'] acme:running 4"
