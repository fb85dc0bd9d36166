"""A Hugging Face repo id reads its config.json from the local HF cache, never the network."""

from __future__ import annotations

import json
import os

import pytest

from fleetwise.cli.main import main
from fleetwise.errors import SpecError
from fleetwise.spec.catalog import get_model, resolve_model
from fleetwise.spec.hf import cached_config, hf_hub_cache

from .test_hf_import import LLAMA_8B, QWEN3_MOE

REPO = "meta-llama/Llama-3.1-8B-Instruct"


def put(hub, repo: str, rev: str, cfg: dict, main_ref: bool = True, mtime: float | None = None):
    """Lay a config out as huggingface_hub does: blobs, a snapshot symlink, refs/main."""
    root = hub / ("models--" + repo.replace("/", "--"))
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    blob = root / "blobs" / f"blob-{rev}"
    blob.write_text(json.dumps(cfg), encoding="utf-8")
    snap = root / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to(os.path.relpath(blob, snap))
    if mtime is not None:
        os.utime(snap, (mtime, mtime))
    if main_ref:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / "main").write_text(rev, encoding="utf-8")
    return snap / "config.json"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf" / "hub"


def test_repo_id_reads_the_config_refs_main_names(hub):
    put(hub, REPO, "aaa111", QWEN3_MOE, main_ref=False, mtime=2e9)  # newer, but not what main points at
    put(hub, REPO, "bbb222", LLAMA_8B, mtime=1e9)
    m = resolve_model(REPO)
    assert m.name == "Llama-3.1-8B-Instruct"
    assert m.model_dump(exclude={"name", "source"}) == get_model("llama-3.1-8b").model_dump(exclude={"name", "source"})
    assert cached_config(REPO) == hub / "models--meta-llama--Llama-3.1-8B-Instruct/snapshots/bbb222/config.json"


def test_without_refs_the_newest_snapshot_holding_a_config(hub):
    put(hub, "Qwen/Qwen3-30B-A3B", "old", LLAMA_8B, main_ref=False, mtime=1e9)
    put(hub, "Qwen/Qwen3-30B-A3B", "new", QWEN3_MOE, main_ref=False, mtime=2e9)
    assert resolve_model("Qwen/Qwen3-30B-A3B").moe is not None


def test_cache_location_follows_huggingface_hub(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hf_hub_cache() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hf_hub_cache() == tmp_path / "hub"


def test_a_repo_id_not_in_the_cache_says_how_to_get_it_there(hub, capsys):
    with pytest.raises(SpecError) as err:
        resolve_model(REPO)
    msg = str(err.value)
    assert f"huggingface-cli download {REPO} config.json" in msg and str(hub) in msg
    assert main(["fit", "--model", REPO, "--gpu", "h100-sxm"]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "not in the local cache" in line and "downloads nothing" in line
    # the fix, whole: it came after the cache path, and the one-line cut took its end
    assert f"`huggingface-cli download {REPO} config.json`" in line and "or give a config.json path" in line



def test_fit_takes_a_cached_repo_id(hub, capsys):
    put(hub, REPO, "bbb222", LLAMA_8B)
    assert main(["fit", "--model", REPO, "--gpu", "h100-sxm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "Llama-3.1-8B-Instruct"
