"""Sliding-window attention: KV per token, KV capped at the window, decode reads, hand-off bytes, capacity.

Each family's config is written by hand from its published config.json (the fields that matter).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fleetwise.cli.main import main
from fleetwise.errors import SpecError
from fleetwise.perf import BatchShape, Deployment, PerfModel
from fleetwise.perf.kv import kv_transfer_bytes
from fleetwise.perf.memory import kv_request_tokens, layout_fit
from fleetwise.planner.fit import fit_line
from fleetwise.planner.latency import estimate
from fleetwise.planner.layout import Layout
from fleetwise.planner.workload import LengthStats
from fleetwise.spec.base import validate
from fleetwise.spec.catalog import get_gpu, get_model
from fleetwise.spec.hf import model_from_hf_config
from fleetwise.spec.model import ModelSpec
from fleetwise.spec.parallel import ParallelismSpec
from fleetwise.spec.slo import PlanSLOSpec

MISTRAL_7B = {  # mistralai/Mistral-7B-v0.1: a 4,096-token window on every layer
    "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096, "vocab_size": 32000,
    "max_position_embeddings": 32768,
}
GEMMA2_9B = {  # google/gemma-2-9b: local 4,096 / global layers alternate (Gemma2Config, no layer_types key)
    "model_type": "gemma2", "head_dim": 256, "hidden_size": 3584, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "num_attention_heads": 16, "num_hidden_layers": 42,
    "num_key_value_heads": 8, "sliding_window": 4096, "vocab_size": 256000,
}
GEMMA3_27B = {  # google/gemma-3-27b-it text_config: 5 local layers of 1,024 per global one (class default 6)
    "model_type": "gemma3", "text_config": {
        "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
        "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "sliding_window": 1024}}
GPT_OSS_120B = {  # openai/gpt-oss-120b: 128-token window / full layers alternate, listed in layer_types
    "model_type": "gpt_oss", "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880,
    "num_attention_heads": 64, "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128,
    "num_experts_per_tok": 4, "sliding_window": 128, "vocab_size": 201088, "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)],
}
QWEN2_WINDOWED = {  # a Qwen2 config with the window switched on: layers from max_window_layers on are windowed
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "sliding_window": 4096, "use_sliding_window": True,
    "max_window_layers": 21, "vocab_size": 152064, "max_position_embeddings": 32768,
}

# family: (config, windowed layers, window, published KV bytes per token in bf16, per-layer KV bytes)
FAMILIES: dict[str, tuple[dict[str, Any], int, int, int, int]] = {
    "mistral-7b": (MISTRAL_7B, 32, 4096, 131072, 2 * 8 * 128 * 2),      # 128 KiB per token
    "gemma-2-9b": (GEMMA2_9B, 21, 4096, 344064, 2 * 8 * 256 * 2),       # 336 KiB
    "gemma-3-27b": (GEMMA3_27B, 52, 1024, 507904, 2 * 16 * 128 * 2),    # 496 KiB
    "gpt-oss-120b": (GPT_OSS_120B, 18, 128, 73728, 2 * 8 * 64 * 2),     # 72 KiB
    "qwen2-7b-windowed": (QWEN2_WINDOWED, 7, 4096, 57344, 2 * 4 * 128 * 2),  # 56 KiB
}
H200 = get_gpu("h200-sxm")


def model(name: str) -> ModelSpec:
    return model_from_hf_config(FAMILIES[name][0], name)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_kv_per_token_is_published_at_short_context_and_capped_at_long(name: str) -> None:
    _, windowed, window, per_token, per_layer = FAMILIES[name]
    m = model(name)
    assert (m.sliding_window, m.num_window_layers) == (window, windowed)
    assert m.kv_bytes_per_token("bf16") == per_token
    assert m.kv_bytes(window, "bf16") == window * per_token  # inside the window: every layer holds every token
    long = 8 * window
    full = m.num_layers - windowed
    assert m.kv_bytes(long, "bf16") == (full * long + windowed * window) * per_layer
    assert m.kv_bytes(long, "fp8") == m.kv_bytes(long, "bf16") / 2


def test_layer_patterns_follow_transformers() -> None:
    assert model("gemma-2-9b").window_layers == tuple(range(0, 42, 2))           # layer i local when i is even
    assert model("gemma-3-27b").window_layers == tuple(i for i in range(62) if (i + 1) % 6)  # 5 local, 1 global
    assert model("gpt-oss-120b").window_layers == tuple(range(0, 36, 2))
    assert model("qwen2-7b-windowed").window_layers == tuple(range(21, 28))
    assert model("mistral-7b").window_layers is None                            # every layer
    off = model_from_hf_config(QWEN2_WINDOWED | {"use_sliding_window": False}, "q")
    assert (off.sliding_window, off.num_window_layers) == (None, 0)             # Qwen2 as released: no window
    assert model_from_hf_config(MISTRAL_7B | {"sliding_window": None}, "v02").num_window_layers == 0


def test_bad_layer_types_and_window_layers_are_one_line() -> None:
    with pytest.raises(SpecError) as err:
        model_from_hf_config(GPT_OSS_120B | {"layer_types": ["full_attention"]}, "g")
    assert str(err.value) == ("g: config.json field layer_types must list one type per layer (36), got "
                              "list of 1 ['full_attention']; fix config.json")
    doc = model("mistral-7b").model_dump()
    with pytest.raises(SpecError, match=r"window_layers=\[40\] must list distinct layer indices in 0\.\.31"):
        validate(ModelSpec, doc | {"window_layers": [40]}, "m")
    with pytest.raises(SpecError, match="window_layers is set without sliding_window"):
        validate(ModelSpec, doc | {"window_layers": [1], "sliding_window": None}, "m")


def test_a_model_without_a_window_is_unchanged() -> None:
    m = model_from_hf_config(MISTRAL_7B | {"sliding_window": None}, "plain")
    assert m.kv_bytes(32768, "bf16") == 32768 * m.kv_bytes_per_token("bf16")
    assert kv_request_tokens(m, range(32), 32768) == 32768.0


def _no_window(m: ModelSpec) -> ModelSpec:
    return m.model_copy(update={"sliding_window": None, "window_layers": None})


@pytest.mark.parametrize("name", list(FAMILIES))
def test_decode_grows_with_context_only_through_full_layers(name: str) -> None:
    """Within the window a windowed model costs what the same model without one costs; past it, the
    decode KV read grows with the full layers only (Mistral: not at all)."""
    m = model(name)
    plain = _no_window(m)
    pm, w = PerfModel(), m.sliding_window
    assert w is not None
    dep, dep0 = Deployment(m, H200), Deployment(plain, H200)
    for ctx in (w // 2, w):
        assert pm.step_time_s(BatchShape.decode(64, ctx), dep) == pytest.approx(
            pm.step_time_s(BatchShape.decode(64, ctx), dep0), rel=1e-12)
    full_share = (m.num_layers - m.num_window_layers) / m.num_layers
    kv = [pm.step_cost(BatchShape.decode(64, c), dep).kv_memory_s for c in (2 * w, 4 * w)]
    kv0 = [pm.step_cost(BatchShape.decode(64, c), dep0).kv_memory_s for c in (2 * w, 4 * w)]
    assert kv[1] - kv[0] == pytest.approx(full_share * (kv0[1] - kv0[0]), rel=1e-9)
    t = [pm.step_time_s(BatchShape.decode(64, c), dep) for c in (2 * w, 4 * w)]
    if m.num_window_layers == m.num_layers:
        assert t[0] == t[1]
    else:
        assert t[0] < t[1] < pm.step_time_s(BatchShape.decode(64, 4 * w), dep0)


def test_prompt_attention_of_windowed_layers_is_capped() -> None:
    m = model("mistral-7b")
    pm, dep, dep0 = PerfModel(), Deployment(m, H200), Deployment(_no_window(m), H200)
    short, long = BatchShape.prefill(1, 4096), BatchShape.prefill(1, 32768)
    assert pm.step_cost(short, dep).attention_s == pytest.approx(pm.step_cost(short, dep0).attention_s, rel=1e-12)
    # 32,768 prompt tokens over a 4,096 window: at most 32,768 x 4,096 pairs instead of 32,768^2/2
    ratio = pm.step_cost(long, dep).attention_s / pm.step_cost(long, dep0).attention_s
    assert ratio == pytest.approx(32768 * 4096 / (32768 * 32769 / 2), rel=1e-9)


def test_handoff_moves_only_the_window() -> None:
    m = model("gemma-3-27b")
    dep = Deployment(m, H200)
    assert kv_transfer_bytes(512, dep) == 512 * 507904
    assert kv_transfer_bytes(16384, dep) == (10 * 16384 + 52 * 1024) * 8192


def test_capacity_counts_requests_at_full_context() -> None:
    m = model("mistral-7b")
    opts_fit = layout_fit(m, H200, ParallelismSpec())
    plain = layout_fit(_no_window(m), H200, ParallelismSpec())
    assert opts_fit.kv_capacity_tokens == plain.kv_capacity_tokens  # tokens at the full per-token cost
    assert (opts_fit.request_tokens, plain.request_tokens) == (4096.0, 32768.0)  # one request at 32,768 tokens
    assert any(line.startswith("sliding window: 32 of 32 layers keep at most 4,096 tokens, so a request at "
                               "32,768 tokens needs 4,096 tokens of KV") for line in opts_fit.lines)
    g = model("gemma-3-27b")
    stage0 = kv_request_tokens(g, range(0, 31), 131072)   # PP=2: each stage counts its own windowed layers
    assert stage0 == pytest.approx((5 * 131072 + 26 * 1024) / 31)
    assert kv_request_tokens(g, range(31, 62), 131072) == pytest.approx((5 * 131072 + 26 * 1024) / 31)


def test_fit_cli_fits_a_windowed_model_where_the_full_count_would_not(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma 3 27B on one H100: 38,376 tokens of KV room; counted at every layer, a 131,072-token request
    would not fit; with 52 of 62 layers capped at 1,024 tokens it needs 21,999."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(GEMMA3_27B))
    rc = main(["fit", "--model", str(cfg), "--gpu", "h100-sxm", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["fits_one_card"] is True
    assert (doc["single"]["kv_capacity_tokens"], round(doc["single"]["request_tokens"])) == (38376, 21999)
    plain = layout_fit(_no_window(model("gemma-3-27b")), get_gpu("h100-sxm"), ParallelismSpec())
    assert (plain.kv_capacity_tokens, plain.fits) == (38376, False)
    assert dataclasses.replace(plain, request_tokens=0.0).fits is False


@pytest.mark.parametrize(("catalog", "family"), [("mistral-7b-v0.1", "mistral-7b"), ("gemma-3-27b", "gemma-3-27b"),
                                                 ("gpt-oss-120b", "gpt-oss-120b")])
def test_catalog_windowed_models_match_their_config(catalog: str, family: str) -> None:
    c, imported = get_model(catalog), model(family)
    assert (c.sliding_window, c.window_layers is None, c.num_window_layers) == (
        imported.sliding_window, imported.window_layers is None, imported.num_window_layers)
    assert c.window_layers == imported.window_layers
    assert (c.kv_bytes(131072), c.params_total, c.params_active) == (
        imported.kv_bytes(131072), imported.params_total, imported.params_active)


def test_planner_decode_batch_counts_a_windowed_sequence_at_its_capped_kv() -> None:
    """The planner's decode batch per replica is KV capacity over one sequence's KV: 24,000-token prompts
    with 1,000-token outputs on Mistral-7B-v0.1 hold 4,096 tokens each, not 25,000."""
    stats = LengthStats(24000.0, 24000.0, 24000.0, 24000.0, 24000, 1000.0, 1000.0, 1000.0, 1000, 1.0)
    slo = PlanSLOSpec(ttft_s=60.0, tpot_s=5.0)
    lay = Layout("h200-sxm", "bf16", tp=1)
    m = model("mistral-7b")
    pm = PerfModel()
    windowed = estimate(pm.bind(Deployment(m, H200)), lay, 100_000, stats, slo, 0.0)
    plain = estimate(pm.bind(Deployment(_no_window(m), H200)), lay, 100_000, stats, slo, 0.0)
    assert (windowed.decode_batch, plain.decode_batch) == (100_000 // 4096, 100_000 // 25_000)


def test_a_window_switched_off_or_malformed() -> None:
    for off in (None, False, 0):
        assert model_from_hf_config(MISTRAL_7B | {"sliding_window": off}, "m").sliding_window is None
    with pytest.raises(SpecError) as err:
        model_from_hf_config(MISTRAL_7B | {"sliding_window": "4096"}, "m")
    assert str(err.value) == ("m: config.json field sliding_window must be a whole number of tokens or null, "
                              "got '4096'; fix config.json")


def test_plan_fit_line_names_the_window() -> None:
    class Hw:  # the fields of `Hardware` the fit line reads
        model = get_model("gemma-3-27b")
        gpus = {"h100-sxm": get_gpu("h100-sxm")}

    f = layout_fit(Hw.model, get_gpu("h100-sxm"), ParallelismSpec())
    line = fit_line(Hw(), Layout("h100-sxm", "bf16", tp=1), f, "bf16")
    assert line.endswith("; sliding window: 52 of 62 layers keep at most 1,024 tokens, so a 131,072-token "
                         "request needs 21,999 of them")
