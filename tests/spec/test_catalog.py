"""Catalog lookups, suggestions for unknown names, and resolution of names and files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetwise.errors import SpecError, UnknownNameError
from fleetwise.spec.catalog import get_gpu, get_model, list_gpus, list_models, resolve_gpu, resolve_model

MODEL_NAMES = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-32b", "qwen3-32b", "mistral-7b-v0.1",
               "gemma-3-27b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x7b", "deepseek-v3",
               "kimi-k2", "moe-2.8t-a104b"]
GPU_NAMES = ["a100-80g", "h100-sxm", "h200-sxm", "b200", "b300", "l40s", "mi300x", "mi325x", "mi355x",
             "ascend-910b", "ascend-910c", "gaudi3"]


def test_catalog_names() -> None:
    assert [m.name for m in list_models()] == MODEL_NAMES
    assert [g.name for g in list_gpus()] == GPU_NAMES


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_has_source_and_context(name: str) -> None:
    m = get_model(name)
    assert m.source and m.max_context_tokens >= 32768


@pytest.mark.parametrize("name", GPU_NAMES)
def test_every_gpu_figure_has_a_source(name: str) -> None:
    g = get_gpu(name)
    for key in ("hbm_bytes", "hbm_bytes_per_s", "flops_per_s", "intra_node_link", "network", "price_per_hour_usd"):
        assert g.sources[key], key
    assert g.price_per_hour_usd > 0 and g.gpus_per_node == 8


def test_h200_datasheet_figures() -> None:
    g = get_gpu("h200-sxm")
    assert (g.hbm_bytes, g.hbm_bytes_per_s) == (143771 * 2**20, 4.8e12)  # nvidia-smi's MiB, not 141e9
    assert "143771MiB" in g.sources["hbm_bytes"]
    assert (g.flops_per_s["bf16"], g.flops_per_s["fp8"]) == (989e12, 1979e12)
    assert g.intra_node_link.bandwidth_bytes_per_s == 450e9
    assert g.network.bandwidth_bytes_per_s == 50e9


def test_fp4_only_on_cards_that_have_it() -> None:
    assert {g.name for g in list_gpus() if "fp4" in g.flops_per_s} == {"b200", "b300", "mi355x"}
    assert "fp8" not in get_gpu("a100-80g").flops_per_s


def test_lookup_is_case_insensitive() -> None:
    assert get_model("Llama-3.1-8B").name == "llama-3.1-8b"
    assert get_gpu("H100-SXM").name == "h100-sxm"


def test_unknown_gpu_suggests_close_names() -> None:
    with pytest.raises(UnknownNameError) as err:
        get_gpu("h300")
    assert err.value.kind == "gpu" and "h200-sxm" in err.value.closest
    assert str(err.value).startswith("unknown gpu 'h300'; closest known:")


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(UnknownNameError) as err:
        resolve_model("llama-3.1-7b")
    assert err.value.closest[:2] == ["llama-3.1-70b", "llama-3.1-8b"]


def test_resolve_model_from_yaml_spec(tmp_path: Path) -> None:
    doc = get_model("llama-3.1-8b").model_dump() | {"name": "my-llama"}
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(doc))
    m = resolve_model(str(p))
    assert m.name == "my-llama" and m.params_total == get_model("llama-3.1-8b").params_total


def test_resolve_model_yaml_typo_names_the_field(tmp_path: Path) -> None:
    doc = get_model("llama-3.1-8b").model_dump()
    doc["num_layer"] = doc.pop("num_layers")
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as err:
        resolve_model(str(p))
    msg = str(err.value)
    assert "num_layer: unknown field" in msg and "num_layers: Field required" in msg and "\n" not in msg


def test_resolve_model_json_spec_vs_hf(tmp_path: Path) -> None:
    p = tmp_path / "spec.json"
    p.write_text(get_model("mixtral-8x7b").model_dump_json())
    assert resolve_model(str(p)) == get_model("mixtral-8x7b")


def test_resolve_gpu_from_yaml(tmp_path: Path) -> None:
    doc = get_gpu("h100-sxm").model_dump() | {"name": "h100-cheap", "price_per_hour_usd": 1.5}
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(doc))
    g = resolve_gpu(str(p))
    assert (g.name, g.price_per_hour_usd, g.hbm_bytes) == ("h100-cheap", 1.5, 81559 * 2**20)


def test_resolve_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="file not found"):
        resolve_model(str(tmp_path / "nope.yaml"))
    with pytest.raises(UnknownNameError):
        resolve_gpu("h300")
