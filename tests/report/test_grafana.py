"""The shipped Grafana dashboard asks only for metrics the gateway or the emulator export."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

from fleetwise.emulator.metrics import ReplicaMetrics
from fleetwise.gateway import Gateway, GatewayConfig

PROMQL_WORDS = {"sum", "rate", "by", "on", "histogram_quantile", "label_values", "without", "ignoring", "avg",
                "max", "min", "irate", "increase", "group_left", "group_right"}
"""PromQL functions and keywords the dashboard uses (everything else outside braces is a metric)."""
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "unknown": ("",)}


def dashboard() -> dict[str, Any]:
    text = resources.files("fleetwise.report").joinpath("grafana/fleetwise-dashboard.json").read_text("utf-8")
    return json.loads(text)


def queries(doc: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    out += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers left after dropping label matchers,
    grouping label lists, ranges, strings, numbers and PromQL's own words."""
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    text = re.sub(r"label_values\(([^,]+),[^)]*\)", r"\1", text)
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text)) - PROMQL_WORDS
    return {n for n in names if not re.fullmatch(r"\d+", n)}


def exported() -> dict[str, str]:
    """Every series name (with its type's suffixes) the gateway and one emulated replica export."""
    gw = Gateway(GatewayConfig(backends=[{"url": "http://127.0.0.1:9", "name": "b0"}]))
    out = {}
    for registry in (gw.telemetry.registry, ReplicaMetrics("m", 4096).registry):
        for fam in registry.collect():
            for suffix in SUFFIXES.get(fam.type, ("",)):
                out[fam.name + suffix] = fam.type
    return out


def test_every_query_names_a_metric_the_gateway_or_the_emulator_exports():
    doc = dashboard()
    known = exported()
    used = set()
    for expr in queries(doc):
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        for n in names:
            assert n in known, f"{n!r} (in {expr!r}) is exported by neither the gateway nor the emulator"
        used |= names
    # the dashboard covers the gateway, the engines' vLLM names and the live page's series
    assert {"fleetwise_gateway_requests_total", "fleetwise_gateway_backend_in_flight",
            "vllm:time_to_first_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
            "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} <= used


def test_a_misspelt_metric_would_be_caught():
    known = exported()
    assert metric_names('rate(vllm:time_to_first_token_second_bucket{instance=~"$engine"}[5m])') == \
        {"vllm:time_to_first_token_second_bucket"}
    assert "vllm:time_to_first_token_second_bucket" not in known


def test_dashboard_is_importable_shape():
    doc = dashboard()
    assert doc["uid"] == "fleetwise-fleet" and doc["schemaVersion"] >= 36
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["fieldConfig"]["defaults"]["unit"] and p["targets"]
        assert [t["refId"] for t in p["targets"]] == [chr(ord("A") + i) for i in range(len(p["targets"]))]
