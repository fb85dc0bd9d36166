"""Measured expert load: histogram formats, the EP imbalance they imply, and its effect on the step cost."""

from __future__ import annotations

import json

import pytest

from fleetwise.errors import SpecError
from fleetwise.perf.expert_load import load_expert_load, parse_expert_load, planned_imbalance
from fleetwise.perf.roofline import PerfModel
from fleetwise.perf.types import BatchShape, Deployment
from fleetwise.spec.catalog import get_gpu, get_model
from fleetwise.spec.parallel import ParallelismSpec

LAYERS = [[4, 0, 2, 2], [1, 1, 1, 5]]


@pytest.mark.parametrize("doc", [
    LAYERS,
    {"expert_load_pass": LAYERS},
    {"layers": {"0": LAYERS[0], "1": LAYERS[1]}},
    {"expert_load_window": [[[2, 0, 1, 1], [1, 1, 1, 2]], [[2, 0, 1, 1], [0, 0, 0, 3]]]},
], ids=["layers", "vllm-pass", "object-of-layers", "vllm-window"])
def test_formats_read_the_same_counts(doc):
    load = parse_expert_load(doc, "load.json")
    assert load.layers == ((4, 0, 2, 2), (1, 1, 1, 5)) and load.experts == 4


def test_rank_imbalance_is_busiest_over_mean_summed_over_layers():
    load = parse_expert_load(LAYERS, "load.json")
    # ep=2: layer 0 ranks (4, 4), layer 1 ranks (2, 6): busiest 4 + 6 over mean 4 + 4
    assert load.rank_imbalance(2) == pytest.approx(10 / 8)
    # ep=4: busiest 4 + 5 over mean 2 + 2
    assert load.rank_imbalance(4) == pytest.approx(9 / 4) == load.expert_imbalance()
    assert load.rank_imbalance(1) == 1.0
    assert parse_expert_load([3, 3, 3, 3], "one-layer.json").rank_imbalance(4) == 1.0
    with pytest.raises(SpecError, match=r"4 experts per layer do not split over ep=3 ranks"):
        load.rank_imbalance(3)


@pytest.mark.parametrize("doc,match", [
    ([[1, -2]], r"layer 0, expert 1: expected a token count .* got -2"),
    ([[1, True]], r"layer 0, expert 1: .* got True"),
    ([[1, 2], [1]], r"layer 1 has 1 expert counts, expected 2"),
    ([[0, 0], [0, 0]], r"every layer's counts are zero"),
    ({"other": 1}, r"no expert counts found"),
    ("text", r"expected a non-empty list of expert counts, got str"),
], ids=["negative", "bool", "ragged", "all-zero", "no-key", "not-a-list"])
def test_bad_histograms_name_the_place(doc, match):
    with pytest.raises(SpecError, match=match):
        parse_expert_load(doc, "load.json")


def test_planned_imbalance_measured_or_assumed(tmp_path):
    path = tmp_path / "load.json"
    path.write_text(json.dumps({"expert_load_pass": LAYERS}))
    assert planned_imbalance(1.3, None, 8) == 1.3
    assert planned_imbalance(1.3, str(path), 2) == pytest.approx(1.25)
    assert load_expert_load(str(path)).source == str(path)
    with pytest.raises(SpecError, match=r"counts 4 experts per layer, the model has 128; record the histogram"):
        planned_imbalance(1.3, str(path), 2, experts=128)


def test_imbalance_scales_the_busiest_ranks_experts_and_all_to_all():
    """At ep=8 the busiest rank routes `imbalance` times the mean rows and receives as many in the
    all-to-all; at ep=1 skew changes nothing (one GPU does all the work)."""
    m, gpu = get_model("qwen3-30b-a3b"), get_gpu("h200-sxm")
    par = ParallelismSpec(tp=1, ep=8)
    even = PerfModel().bind(Deployment(m, gpu, parallelism=par))
    skew = PerfModel().bind(Deployment(m, gpu, parallelism=par, expert_load_imbalance=1.5))
    shape = BatchShape.prefill(1, 8192)
    assert skew.step_cost(shape).ep_comm_s - skew.ep_fix == pytest.approx(1.5 * (even.step_cost(shape).ep_comm_s - even.ep_fix))
    assert skew.routed_experts_s(8192) > 1.3 * even.routed_experts_s(8192)
    one = PerfModel().bind(Deployment(m, gpu, expert_load_imbalance=1.5))
    assert one.step_time_s(shape) == PerfModel().bind(Deployment(m, gpu)).step_time_s(shape)
