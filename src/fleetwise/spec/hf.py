"""Import a `ModelSpec` from a Hugging Face `config.json` (a dict or a file on disk).

Owns the mapping from HF field names to `ModelSpec` for the families fleetwise knows: Llama,
Qwen2/Qwen2.5, Qwen3 (dense), Qwen2-MoE/Qwen3-MoE, Mixtral, Llama 4 (a shared expert in every MoE layer,
dense layers interleaved), DeepSeek-V2/V3 and Kimi-K2 (MLA).
The family is read from the fields present, not from `model_type`, so close relatives import too.
Unknown fields are ignored; missing required fields raise `SpecError` naming all of them.
A repo id (`meta-llama/Llama-3.1-8B-Instruct`) is read from the local Hugging Face cache
(`hf_hub_cache()`: the layout `huggingface_hub` writes, models--ORG--NAME/snapshots/REV/config.json);
does not download anything, and says how to put the config there when it is missing.

Defaults as in `transformers`: `head_dim` = hidden_size / num_attention_heads,
`num_key_value_heads` = num_attention_heads, `tie_word_embeddings` = false.
Sliding windows (`sliding_window` with `layer_types`, `sliding_window_pattern`, or Qwen2's
`use_sliding_window` + `max_window_layers`) become `ModelSpec.sliding_window` and `window_layers`.
Qwen-MoE layer placement (`decoder_sparse_step`, `mlp_only_layers`) is reduced to a count of
dense layers, stored as `moe.first_dense_layers`: parameter and memory totals stay exact, only
the position of the dense layers is approximated (they sit first).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from fleetwise.errors import SpecError, quote
from fleetwise.spec import inputs
from fleetwise.spec.base import validate
from fleetwise.spec.model import ModelSpec

_BASE_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
_MLA_REQUIRED = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
COUNT_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "vocab_size", "intermediate_size", "max_position_embeddings", "num_local_experts", "num_experts",
                "num_experts_per_tok", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
                "first_k_dense_replace", "decoder_sparse_step", "shared_expert_intermediate_size",
                "intermediate_size_mlp", "interleave_moe_layer_step", *_MLA_REQUIRED, "q_lora_rank",
                "max_window_layers", "sliding_window_pattern")
"""The config.json fields read as counts or sizes: whole numbers, as transformers writes them."""
TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})
"""`model_type`s whose transformers config class defaults `tie_word_embeddings` to true (GemmaConfig,
Gemma2Config, Gemma3TextConfig); their config.json files usually leave the key out."""


CLASS_DEFAULTS = {"gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window_pattern": 6},
                  "gemma2": {"sliding_window_pattern": 2}}
"""Defaults of a transformers config class that its published config.json files leave out, by `model_type`:
Gemma3TextConfig's 262,208-token vocabulary, 131,072-token context and 5 local layers per global one
(`sliding_window_pattern` 6); Gemma2Config's alternating local/global layers (layer i local when i is even)."""

QWEN2_MAX_WINDOW_LAYERS = 28
"""Qwen2Config's default `max_window_layers`: layers from this index on use the window when `use_sliding_window`."""


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model under `text_config`; keys its class defaults are filled."""
    inner = cfg.get("text_config")
    if isinstance(inner, dict) and "num_hidden_layers" in inner and "num_hidden_layers" not in cfg:
        cfg = inner
    return CLASS_DEFAULTS.get(str(cfg.get("model_type")), {}) | cfg


def _require(cfg: dict[str, Any], keys: tuple[str, ...], name: str) -> None:
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise SpecError(
            f"{name}: config.json lacks required field(s) {', '.join(missing)}; "
            "add them or pass a full ModelSpec YAML instead"
        )


def _check_types(cfg: dict[str, Any], name: str) -> None:
    """SpecError naming the first field read here whose value is not of its type (null: absent)."""
    for key in COUNT_FIELDS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise SpecError(f"{name}: config.json field {key} must be a whole number, got {quote(v)}; fix config.json")
    tie = cfg.get("tie_word_embeddings")
    if tie is not None and not isinstance(tie, bool):
        raise SpecError(f"{name}: config.json field tie_word_embeddings must be true or false, got {quote(tie)}; "
                        "fix config.json")


def _window(cfg: dict[str, Any], layers: int, name: str) -> dict[str, Any]:
    """`sliding_window` and `window_layers` as transformers places the window: an explicit `layer_types`
    list ("sliding_attention" entries); Qwen2's `use_sliding_window` (layers from `max_window_layers` on);
    a `sliding_window_pattern` p (layer i global when (i+1) % p == 0: Gemma 2, Gemma 3, Cohere 2); else
    every layer (Mistral). No window when `sliding_window` is null, false or 0, or `use_sliding_window` is false."""
    window = cfg.get("sliding_window")
    if window is None or window is False or window == 0:
        return {}
    if window is True or not isinstance(window, int) or window < 0:
        raise SpecError(f"{name}: config.json field sliding_window must be a whole number of tokens or null, "
                        f"got {quote(window)}; fix config.json")
    if "use_sliding_window" in cfg and cfg["use_sliding_window"] is not True:
        return {}
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise SpecError(f"{name}: config.json field layer_types must list one type per layer ({layers}), "
                            f"got {quote(types)}; fix config.json")
        picked = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    elif "use_sliding_window" in cfg:
        first = cfg.get("max_window_layers")
        picked = tuple(range(QWEN2_MAX_WINDOW_LAYERS if first is None else first, layers))
    elif cfg.get("sliding_window_pattern"):
        p = int(cfg["sliding_window_pattern"])
        picked = tuple(i for i in range(layers) if (i + 1) % p)
    else:
        return {"sliding_window": window}
    return {"sliding_window": window, "window_layers": picked} if picked else {}


def _moe_kind(cfg: dict[str, Any]) -> str | None:
    if cfg.get("n_routed_experts"):
        return "deepseek"
    if cfg.get("num_local_experts"):
        return "llama4" if cfg.get("intermediate_size_mlp") else "mixtral"
    if cfg.get("num_experts") and cfg.get("moe_intermediate_size"):
        return "qwen"
    return None


def _qwen_dense_layers(cfg: dict[str, Any], layers: int) -> int:
    """Layers that keep a dense MLP under Qwen-MoE's `decoder_sparse_step` and `mlp_only_layers`."""
    step = int(cfg.get("decoder_sparse_step") or 1)
    only = set(cfg.get("mlp_only_layers") or [])
    return sum(1 for i in range(layers) if i in only or (i + 1) % step != 0)


def _llama4_block(cfg: dict[str, Any], name: str) -> tuple[dict[str, Any], int]:
    """Llama 4: each MoE layer has one shared expert beside the routed ones (both `intermediate_size`);
    the layers in `moe_layers` (default: every `interleave_moe_layer_step`-th) are MoE, the others dense
    with `intermediate_size_mlp`, as transformers' Llama4TextConfig places them."""
    _require(cfg, ("num_experts_per_tok", "intermediate_size"), name)
    layers = int(cfg["num_hidden_layers"])
    listed = cfg.get("moe_layers")
    step = int(cfg.get("interleave_moe_layer_step") or 1)
    dense = layers - (len(set(listed)) if isinstance(listed, list) else len(range(step - 1, layers, step)))
    moe = {"num_experts": cfg["num_local_experts"], "experts_per_token": cfg["num_experts_per_tok"],
           "expert_ffn_size": cfg["intermediate_size"], "num_shared_experts": 1, "first_dense_layers": dense}
    return moe, int(cfg["intermediate_size_mlp"]) if dense else 0


def _moe_block(cfg: dict[str, Any], kind: str, name: str) -> tuple[dict[str, Any], int]:
    """(moe block, dense FFN size) for one of the MoE families."""
    layers = int(cfg["num_hidden_layers"])
    if kind == "llama4":
        return _llama4_block(cfg, name)
    if kind == "mixtral":
        _require(cfg, ("num_experts_per_tok", "intermediate_size"), name)
        moe = {"num_experts": cfg["num_local_experts"], "experts_per_token": cfg["num_experts_per_tok"],
               "expert_ffn_size": cfg["intermediate_size"]}
        return moe, 0
    _require(cfg, ("num_experts_per_tok", "moe_intermediate_size"), name)
    if kind == "deepseek":
        dense = int(cfg.get("first_k_dense_replace") or 0)
        moe = {"num_experts": cfg["n_routed_experts"], "experts_per_token": cfg["num_experts_per_tok"],
               "expert_ffn_size": cfg["moe_intermediate_size"],
               "num_shared_experts": int(cfg.get("n_shared_experts") or 0), "first_dense_layers": dense}
    else:
        dense = _qwen_dense_layers(cfg, layers)
        moe = {"num_experts": cfg["num_experts"], "experts_per_token": cfg["num_experts_per_tok"],
               "expert_ffn_size": cfg["moe_intermediate_size"], "first_dense_layers": dense}
        if cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE: one wide shared expert
            moe["num_shared_experts"] = 1
            moe["shared_expert_ffn_size"] = cfg["shared_expert_intermediate_size"]
    if dense:
        _require(cfg, ("intermediate_size",), name)
    return moe, int(cfg["intermediate_size"]) if dense else 0


def model_from_hf_config(cfg: dict[str, Any], name: str, source: str = "") -> ModelSpec:
    """Build a `ModelSpec` from a parsed HF `config.json`; raises SpecError naming missing fields."""
    if not isinstance(cfg, dict):
        raise SpecError(f"{name}: config.json must be a JSON object, got {type(cfg).__name__}")
    cfg = _text_config(cfg)
    _require(cfg, _BASE_REQUIRED, name)
    _check_types(cfg, name)
    heads = cfg["num_attention_heads"]
    doc: dict[str, Any] = {
        "name": name,
        "num_layers": cfg["num_hidden_layers"],
        "hidden_size": cfg["hidden_size"],
        "num_attention_heads": heads,
        "num_kv_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or _int_div(cfg["hidden_size"], heads),
        "vocab_size": cfg["vocab_size"],
        "tie_embeddings": (cfg["tie_word_embeddings"] if cfg.get("tie_word_embeddings") is not None
                           else cfg.get("model_type") in TIED_BY_DEFAULT),
        "source": source or f"Hugging Face config.json ({cfg.get('model_type', 'unknown model_type')})",
    }
    if cfg.get("max_position_embeddings"):
        doc["max_context_tokens"] = cfg["max_position_embeddings"]
    doc |= _window(cfg, int(cfg["num_hidden_layers"]), name)
    kind = _moe_kind(cfg)
    if kind is None:
        _require(cfg, ("intermediate_size",), name)
        doc["ffn_size"] = cfg["intermediate_size"]
    else:
        doc["moe"], doc["ffn_size"] = _moe_block(cfg, kind, name)
    if cfg.get("kv_lora_rank"):
        _require(cfg, _MLA_REQUIRED, name)
        doc["attention"] = "mla"
        doc["num_kv_heads"] = heads
        doc["mla"] = {k: cfg[k] for k in _MLA_REQUIRED} | {"q_lora_rank": cfg.get("q_lora_rank")}
    return validate(ModelSpec, doc, f"{name} (from config.json)")


def _int_div(a: Any, b: Any) -> Any:
    return a // b if isinstance(a, int) and isinstance(b, int) and b else a


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """Parse a config.json (or a directory holding one), with one-line errors for bad files."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise SpecError(f"{p}: file not found; pass a catalog model name or a path to config.json")
    data = inputs.read_document(p)
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


def default_name(path: str | Path) -> str:
    """A model name for a config file: its directory's name for `config.json`, else the file stem."""
    p = Path(path)
    if p.is_dir():
        return p.resolve().name
    return p.resolve().parent.name if p.name == "config.json" else p.stem


REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
"""A Hugging Face repo id, `ORG/NAME` (huggingface_hub's rule: letters, digits, `.`, `_`, `-`; at most 96 each)."""


def looks_like_repo_id(value: str) -> bool:
    """Whether `value` is spelled as a Hugging Face repo id (`ORG/NAME`)."""
    return REPO_ID.fullmatch(value) is not None


def hf_hub_cache() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub finds it: $HF_HUB_CACHE, else
    $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base).expanduser() / "huggingface" / "hub"


def cached_config(repo_id: str) -> Path:
    """`config.json` of `repo_id` in the local HF cache: the snapshot `refs/main` names, else the newest
    snapshot holding one. SpecError saying how to fetch it when the cache has none (no download here)."""
    root = hf_hub_cache() / ("models--" + repo_id.replace("/", "--"))
    snaps, ref = root / "snapshots", root / "refs" / "main"
    found: list[Path] = []
    if ref.is_file():
        found.append(snaps / ref.read_text(encoding="utf-8").strip())
    if snaps.is_dir():
        found += sorted((d for d in snaps.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    for d in found:
        if (d / "config.json").is_file():
            return d / "config.json"
    # the fix first: a line is cut at cli.main.MAX_ERROR_LINE_CHARS, and the cache path is long
    raise SpecError(f"model {quote(repo_id)}: config.json not in the local cache of Hugging Face and fleetwise "
                    f"downloads nothing; run `huggingface-cli download {repo_id} config.json` (gated: "
                    f"`huggingface-cli login` first) or give a config.json path (cache: {root}; HF_HOME or "
                    "HF_HUB_CACHE moves it)")


def model_from_hf_cache(repo_id: str) -> ModelSpec:
    """The `ModelSpec` of a Hugging Face repo id from its config.json in the local cache (named by the repo's name)."""
    path = cached_config(repo_id)
    return model_from_hf_config(read_hf_config(path), repo_id.split("/")[-1], source=f"{repo_id} ({path})")


def looks_like_hf_config(data: dict[str, Any]) -> bool:
    """True for HF-style configs (as opposed to a fleetwise ModelSpec document)."""
    return "num_hidden_layers" in data or "model_type" in data or "architectures" in data


def model_from_hf_path(path: str | Path, name: str | None = None) -> ModelSpec:
    """Read a config.json on disk (or a model directory) into a `ModelSpec`."""
    return model_from_hf_config(read_hf_config(path), name or default_name(path), source=f"config.json at {path}")
