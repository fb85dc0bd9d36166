"""The emulated replica's /metrics page and the readers of such pages share one registry of names:
it exports exactly the registry's vLLM names, and the gateway's scrape and calibration find every
field they read for vLLM on it, so the emulator and the readers cannot drift apart."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from fleetwise.emulator.metrics import ReplicaMetrics
from fleetwise.gateway.scrape import ALIASES, parse_metrics
from fleetwise.planner.metrics_page import parse_page
from fleetwise.spec.engine_metrics import METRIC_NAMES

VLLM = METRIC_NAMES["vllm"]


def page() -> str:
    """A fresh replica's page (every labelled series exists from the start, at 0)."""
    return ReplicaMetrics("llama-3.1-8b", 131072).render().decode()


def test_the_emulator_exports_exactly_the_registrys_vllm_names():
    families = {f.name for f in text_string_to_metric_families(page()) if f.name.startswith("vllm:")}
    newest = {VLLM.newest(f) for f in VLLM.live}
    assert families == newest | set(VLLM.counters.values()) | set(VLLM.histograms.values()) | set(VLLM.unread.values())
    assert len(families) == 24  # 3 gauges, 7 counters, 14 histograms


def test_the_scrape_finds_every_field_it_reads_for_vllm_by_its_preferred_name():
    text = page()
    samples = {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and line[0] != "#"}
    vllm_fields = {f: [n for n in names if n.startswith(VLLM.prefix)] for f, names in ALIASES.items()}
    vllm_fields = {f: names for f, names in vllm_fields.items() if names}
    assert len(vllm_fields) == 12  # every field but SGLang's prefix hit rate
    assert all(names[0] in samples and not samples & set(names[1:]) for names in vllm_fields.values())
    assert parse_metrics(text).names_seen == 12


def test_calibration_finds_every_counter_and_histogram_it_reads_for_vllm():
    (m,) = parse_page(page(), "emu")
    assert m.names is VLLM
    assert (set(m.counters), set(m.histograms)) == (set(VLLM.counters), set(VLLM.histograms))
    assert (len(m.counters), len(m.histograms)) == (5, 9)
