"""Import of Hugging Face config.json files: each family, defaults, and errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetwise.errors import SpecError
from fleetwise.spec.catalog import get_model, resolve_model
from fleetwise.spec.hf import model_from_hf_config, model_from_hf_path

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}, "torch_dtype": "bfloat16",
}
QWEN3_32B = {
    "model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600, "num_attention_heads": 64,
    "num_hidden_layers": 64, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": False,
}
QWEN3_MOE = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 32,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": True, "tie_word_embeddings": False,
}
MIXTRAL = {
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
    "num_experts_per_tok": 2, "max_position_embeddings": 32768,
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61, "vocab_size": 129280,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "max_position_embeddings": 163840, "num_nextn_predict_layers": 1,
}

SAME_AS_CATALOG = [
    ("llama-3.1-8b", LLAMA_8B),
    ("qwen3-32b", QWEN3_32B),
    ("qwen3-30b-a3b", QWEN3_MOE),
    ("mixtral-8x7b", MIXTRAL),
    ("deepseek-v3", DEEPSEEK_V3),
]


@pytest.mark.parametrize(("name", "cfg"), SAME_AS_CATALOG, ids=[s[0] for s in SAME_AS_CATALOG])
def test_hf_config_matches_catalog_counts(name: str, cfg: dict) -> None:
    m, ref = model_from_hf_config(cfg, name), get_model(name)
    assert (m.params_total, m.params_active) == (ref.params_total, ref.params_active)
    assert m.kv_bytes_per_token() == ref.kv_bytes_per_token()
    assert m.attention == ref.attention and m.moe == ref.moe and m.mla == ref.mla


def test_defaults_head_dim_and_kv_heads() -> None:
    cfg = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    m = model_from_hf_config(cfg, "mha")
    assert (m.num_kv_heads, m.head_dim) == (32, 128)
    assert m.max_context_tokens == 131072 and not m.tie_embeddings


def test_qwen_moe_dense_layers_are_counted() -> None:
    cfg = QWEN3_MOE | {"mlp_only_layers": [0, 1], "decoder_sparse_step": 1}
    m = model_from_hf_config(cfg, "q")
    assert m.moe is not None and m.moe.first_dense_layers == 2 and m.ffn_size == 6144
    assert m.num_moe_layers == 46
    step2 = model_from_hf_config(QWEN3_MOE | {"decoder_sparse_step": 2}, "q2")  # odd-numbered layers sparse
    assert step2.num_moe_layers == 24 and step2.num_dense_layers == 24


def test_qwen2_moe_shared_expert() -> None:
    cfg = QWEN3_MOE | {"model_type": "qwen2_moe", "shared_expert_intermediate_size": 5632}
    m = model_from_hf_config(cfg, "q2moe")
    assert m.moe is not None and (m.moe.num_shared_experts, m.moe.shared_expert_ffn_size) == (1, 5632)


def test_missing_required_fields_are_all_named() -> None:
    cfg = {k: v for k, v in LLAMA_8B.items() if k not in ("hidden_size", "vocab_size")}
    with pytest.raises(SpecError) as err:
        model_from_hf_config(cfg, "broken")
    assert str(err.value) == ("broken: config.json lacks required field(s) hidden_size, vocab_size; "
                              "add them or pass a full ModelSpec YAML instead")


def test_missing_mla_field() -> None:
    cfg = {k: v for k, v in DEEPSEEK_V3.items() if k != "qk_nope_head_dim"}
    with pytest.raises(SpecError, match="lacks required field.*qk_nope_head_dim"):
        model_from_hf_config(cfg, "ds")


def test_invalid_value_is_one_line() -> None:
    with pytest.raises(SpecError) as err:
        model_from_hf_config(LLAMA_8B | {"num_hidden_layers": 0}, "zero")
    assert "num_layers: Input should be greater than 0 (got 0)" in str(err.value)


def test_from_path_and_directory(tmp_path: Path) -> None:
    d = tmp_path / "Llama-3.1-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA_8B))
    assert model_from_hf_path(d / "config.json").name == "Llama-3.1-8B"
    assert resolve_model(str(d)).params_total == get_model("llama-3.1-8b").params_total
    assert resolve_model(str(d / "config.json")).num_kv_heads == 8


def test_malformed_json(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text('{"hidden_size": 4096,,}')
    with pytest.raises(SpecError) as err:
        resolve_model(str(p))
    assert str(err.value) == f"{p}: not valid JSON: Expecting property name enclosed in double quotes at line 1 column 22"


def test_json_not_an_object(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text("[1, 2]")
    with pytest.raises(SpecError, match="expected a JSON object"):
        model_from_hf_path(p)


GEMMA2_9B = {  # google/gemma-2-9b config.json: no tie_word_embeddings key; Gemma2Config defaults it to true
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 256, "hidden_size": 3584,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "sliding_window": 4096, "vocab_size": 256000,
}


def test_gemma_ties_embeddings_by_default() -> None:
    m = model_from_hf_config(GEMMA2_9B, "gemma-2-9b")
    assert m.tie_embeddings
    assert round(m.params_total / 1e9, 2) == 9.24  # Gemma-2-9B's published 9,241,705,984 (two more norms a layer)
    untied = model_from_hf_config(GEMMA2_9B | {"tie_word_embeddings": False}, "g")
    assert not untied.tie_embeddings and untied.params_total == m.params_total + 256000 * 3584



LLAMA4_TEXT = {  # meta-llama/Llama-4-Scout-17B-16E text_config; every MoE layer also has a shared expert
    "model_type": "llama4_text", "head_dim": 128, "hidden_size": 5120, "interleave_moe_layer_step": 1,
    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "max_position_embeddings": 10485760,
    "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
    "num_local_experts": 16, "vocab_size": 202048, "tie_word_embeddings": False,
}


def test_llama4_shared_expert_and_interleaved_dense_layers() -> None:
    scout = model_from_hf_config({"model_type": "llama4", "text_config": LLAMA4_TEXT}, "scout")
    assert scout.moe is not None and (scout.moe.num_shared_experts, scout.moe.shared_ffn) == (1, 8192)
    assert scout.num_moe_layers == 48
    assert (round(scout.params_total / 1e9, 1), round(scout.params_active / 1e9, 1)) == (107.8, 17.2)
    maverick = model_from_hf_config(LLAMA4_TEXT | {"num_local_experts": 128, "interleave_moe_layer_step": 2}, "mav")
    assert maverick.moe is not None and maverick.ffn_size == 16384  # dense layers: intermediate_size_mlp
    assert (maverick.num_moe_layers, maverick.num_dense_layers) == (24, 24)
    assert (round(maverick.params_total / 1e9), round(maverick.params_active / 1e9, 1)) == (401, 17.2)


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("hidden_size", "4096", "'4096'"),
    ("max_position_embeddings", 1e12, "1000000000000.0"),
    ("num_key_value_heads", 8.5, "8.5"),
    ("num_hidden_layers", True, "True"),
    ("tie_word_embeddings", "yes", "'yes'"),
])
def test_a_field_of_the_wrong_type_is_refused_by_its_name(field: str, value: object, shown: str) -> None:
    """config.json values are read as written: a size given as text or a fraction, or a switch given
    as text, is an error naming the config field (a hidden_size of "4096" once became a head_dim of
    4096 and a 41B-parameter Phi-3-mini)."""
    kind = "true or false" if field == "tie_word_embeddings" else "a whole number"
    with pytest.raises(SpecError) as err:
        model_from_hf_config(LLAMA_8B | {field: value}, "typed")
    assert str(err.value) == f"typed: config.json field {field} must be {kind}, got {shown}; fix config.json"


GEMMA3_27B = {  # google/gemma-3-27b-it config.json: the language model under text_config, without the keys
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",  # its class defaults
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27, "model_type": "siglip_vision_model"},
}


def test_gemma3_takes_its_config_class_defaults_for_absent_keys() -> None:
    """Gemma3TextConfig's defaults fill what the file leaves out: a 262,208-token vocabulary, a
    131,072-token context and a tied LM head (not an error, and not the 8,192-token fallback)."""
    m = model_from_hf_config(GEMMA3_27B, "gemma-3-27b")
    assert (m.vocab_size, m.max_context_tokens, m.tie_embeddings) == (262208, 131072, True)
    assert round(m.params_total / 1e9, 1) == 27.0  # the language model of Gemma 3 27B (the vision tower aside)
