"""`fleetwise catalog` and `fleetwise fit` end to end through `main()`, including bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fleetwise.cli.main import main
from fleetwise.spec.catalog import get_gpu, get_model, list_gpus, list_models


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_catalog_models_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "catalog", "models", "--json")
    rows = json.loads(out)
    assert rc == 0 and err == ""
    assert [r["name"] for r in rows] == [m.name for m in list_models()]
    ds = next(r for r in rows if r["name"] == "deepseek-v3")
    assert (ds["params_total"], ds["params_active"]) == (get_model("deepseek-v3").params_total,
                                                         get_model("deepseek-v3").params_active)
    assert ds["kv_bytes_per_token_bf16"] == 70272
    assert next(r for r in rows if r["name"] == "moe-2.8t-a104b")["verified"] is False
    # Gemma 3 27B: 52 of 62 layers keep a 1,024-token window, 10 keep all 131,072 (8 KiB per layer-token)
    g = next(r for r in rows if r["name"] == "gemma-3-27b")
    assert (g["sliding_window"], g["window_layers"], g["kv_bytes_per_token_bf16"]) == (1024, 52, 62 * 8192)
    assert g["kv_bytes_at_max_context_bf16"] == (10 * 131072 + 52 * 1024) * 8192
    assert (ds["sliding_window"], ds["window_layers"]) == (None, 0)
    assert ds["kv_bytes_at_max_context_bf16"] == 70272 * get_model("deepseek-v3").max_context_tokens


def test_catalog_gpus_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "catalog", "gpus", "--json")
    rows = json.loads(out)
    assert rc == 0 and [r["name"] for r in rows] == [g.name for g in list_gpus()]
    h200 = next(r for r in rows if r["name"] == "h200-sxm")
    assert (h200["vendor"], h200["hbm_bytes"], h200["hbm_bytes_per_s"], h200["bf16_flops"]) == (
        "nvidia", 143771 * 2**20, 4.8e12, 989e12)


@pytest.mark.parametrize("kind", ["models", "gpus"])
def test_catalog_tables(capsys: pytest.CaptureFixture[str], kind: str) -> None:
    rc, out, _ = run(capsys, "catalog", kind)
    assert rc == 0
    names = [m.name for m in list_models()] if kind == "models" else [g.name for g in list_gpus()]
    assert all(n in out for n in names)
    if kind == "models":  # a windowed model's KV/token holds only below its window: the note says what it keeps
        assert "window 4,096 on 32/32 layers: 0.50 GiB KV at full context" in out


def test_fit_llama_70b_h100_bf16(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "fit", "--model", "llama-3.1-70b", "--gpu", "h100-sxm")
    assert rc == 0
    assert "141.11 GB of bf16 weights" in out
    assert "one h100-sxm (85.52 GB): does not fit" in out
    assert "smallest TP in a node: TP=4 PP=1 on 4 GPUs" in out


def test_fit_llama_70b_h100_fp8_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "fit", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--weight-dtype", "fp8", "--json")
    r = json.loads(out)
    assert rc == 0 and r["fits_one_card"] is False
    assert (r["min_tp"]["tp"], r["min_tp"]["fits"]) == (2, True)
    assert r["min_tp"]["kv_capacity_tokens"] > 131072
    assert r["single"]["terms"]["weights.dense_ffn"] == 80 * 3 * 8192 * 28672 * 1.0


def test_fit_moe_reports_active_and_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "fit", "--model", "moe-2.8t-a104b", "--gpu", "h200-sxm", "--weight-dtype", "fp8")
    assert rc == 0
    assert "compute follows active (104.1B" in out and "1/26.7" in out
    assert "smallest TP x EP" in out


def test_fit_from_hf_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    rc, out, _ = run(capsys, "fit", "--model", str(p), "--gpu", "l40s", "--json")
    assert rc == 0 and json.loads(out)["params_total"] == get_model("llama-3.1-8b").params_total


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"fleetwise {argv[0]}: error: ")
    return err


def test_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, "fit", "--model", "llama-3.1-7b", "--gpu", "h100-sxm")
    assert "unknown model 'llama-3.1-7b'; closest known: llama-3.1-70b, llama-3.1-8b" in err


def test_unknown_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, "fit", "--model", "llama-3.1-8b", "--gpu", "h300")
    assert "unknown gpu 'h300'; closest known: " in err and "h200-sxm" in err


def test_malformed_config_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text('{"hidden_size": 4096')
    err = one_line_error(capsys, "fit", "--model", str(p), "--gpu", "h100-sxm")
    assert f"{p}: not valid JSON" in err


def test_yaml_with_typo(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = get_model("llama-3.1-8b").model_dump()
    doc["hiden_size"] = doc.pop("hidden_size")
    p = tmp_path / "model.yaml"
    p.write_text(yaml.safe_dump(doc))
    err = one_line_error(capsys, "fit", "--model", str(p), "--gpu", "h100-sxm")
    assert "hiden_size: unknown field; remove it or check its spelling" in err


def test_gpu_yaml_with_typo(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = get_gpu("h100-sxm").model_dump()
    doc["hbm_byte"] = doc.pop("hbm_bytes")
    p = tmp_path / "gpu.yaml"
    p.write_text(yaml.safe_dump(doc))
    err = one_line_error(capsys, "fit", "--model", "llama-3.1-8b", "--gpu", str(p))
    assert "hbm_byte: unknown field" in err and "hbm_bytes: Field required" in err


@pytest.mark.parametrize(("flag", "value", "bound"), [
    ("--context-tokens", "0", "must be at least 1, got '0'"),
    ("--context-tokens", "-5", "must be at least 1, got '-5'"),
    ("--context-tokens", "100000000001", "must be at most 100,000,000 (see docs/errors.md), got '100000000001'"),
    ("--max-gpus", "0", "must be at least 1, got '0'"),
    ("--max-gpus", "1000000000", "must be at most 80,000 (see docs/errors.md), got '1000000000'"),
])
def test_fit_count_flags_are_bounded_and_named(capsys: pytest.CaptureFixture[str], flag: str, value: str,
                                               bound: str) -> None:
    assert main(["fit", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", flag, value]) == 2
    assert capsys.readouterr().err == f"fleetwise fit: error: argument {flag}: {bound}; see `fleetwise fit --help`\n"
