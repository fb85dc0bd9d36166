"""`fleetwise measure`: the grid, the shapes it accepts, and (with PyTorch) the file it writes feeding calibrate."""

from __future__ import annotations

import pytest

from fleetwise.cli.main import main
from fleetwise.cli.measure_cmd import TINY, TINY_MOE, grid, model_config
from fleetwise.errors import SpecError
from fleetwise.perf.groundtruth import load_groundtruth
from fleetwise.spec.catalog import get_model


def test_grid_is_the_ground_truths():
    """Full grid: 11 prefills, decodes within the KV budget, 14 mixed steps; --tiny clips the lengths."""
    llama = model_config(get_model("llama-3.1-8b"))
    full = grid(llama, ("prefill", "decode", "mixed"), tiny=False)
    kinds = [p[0] for p in full]
    assert kinds.count("prefill") == 11 and kinds.count("mixed") == 14
    # 40 GiB of KV at 128 KiB per token: 19 of the 28 decode points, as in h200_dense.json
    assert kinds.count("decode") == 19
    tiny = grid(TINY, ("prefill", "decode", "mixed"), tiny=True)
    assert [p for p in tiny if p[0] == "prefill"] == [("prefill", 1, 128, 0), ("prefill", 1, 256, 0),
                                                       ("prefill", 4, 256, 0), ("prefill", 8, 256, 0),
                                                       ("prefill", 16, 256, 0)]
    assert [p for p in tiny if p[0] != "prefill"] == [("decode", 1, 256, 0), ("decode", 4, 256, 0),
                                                       ("mixed", 4, 256, 0), ("mixed", 4, 256, 64)]
    assert model_config(get_model("mixtral-8x7b"))["experts"] == 8


def test_shapes_it_cannot_time_are_one_line(capsys, tmp_path):
    with pytest.raises(SpecError, match=r"--model deepseek-v3: mla attention .* pass --shape"):
        model_config(get_model("deepseek-v3"))
    assert main(["measure", "-o", str(tmp_path / "gt.json"), "--tiny", "--kinds", "prefil"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kinds 'prefil': expected a comma list of prefill, decode, mixed" in err[0]


def test_moe_block_matches_a_per_token_reference():
    """The harness's routed experts (sorted rows, grouped products, weighted scatter-add) equal each
    token's top-k experts summed with their router weights."""
    torch = pytest.importorskip("torch", reason="fleetwise measure needs PyTorch (pip install 'fleetwise[measure]')")
    from fleetwise.cli.measure_torch import Decoder

    cfg = {**TINY_MOE, "layers": 1}
    model = Decoder(cfg, "cpu", torch.float32, seed=3)
    layer = model.layers[0]
    h = torch.randn(7, cfg["hidden"], generator=torch.Generator().manual_seed(1))
    got = model._experts(layer, h)
    probs = (h @ layer["router"].T).softmax(-1)
    want = torch.zeros_like(h)
    for t in range(h.shape[0]):
        w, idx = probs[t].topk(cfg["topk"])
        for weight, e in zip(w, idx.tolist(), strict=True):
            g, u = (h[t] @ layer["e13"][e].T).chunk(2)
            want[t] += weight * ((torch.nn.functional.silu(g) * u) @ layer["e2"][e].T)
    assert torch.allclose(got, want, atol=1e-5)


def test_moe_block_ceiling_times_the_decoders_own_block():
    """The MoE-block ceiling (`moe_block_ms`) times the same routed-expert code the steps run; on the CPU a
    tiny block, to prove the path (the reference shape is timed on a GPU, beside the 8192^3 GEMM)."""
    torch = pytest.importorskip("torch", reason="fleetwise measure needs PyTorch (pip install 'fleetwise[measure]')")
    from fleetwise.cli.measure_torch import time_moe_block

    ms = time_moe_block(torch, "cpu", {"experts": 4, "topk": 2, "hidden": 64, "moe_ffn": 32, "tokens": 16}, 2)
    assert 0.0 < ms < 10_000.0


@pytest.mark.slow
@pytest.mark.parametrize("tiny", ["dense", "moe"])
def test_tiny_measurement_on_cpu_feeds_calibrate(tmp_path, capsys, tiny):
    """On the CPU, a two-layer shape: the file is a ground-truth file with every kind of step, and
    `fleetwise calibrate` fits it."""
    pytest.importorskip("torch", reason="fleetwise measure needs PyTorch (pip install 'fleetwise[measure]')")
    out = tmp_path / "gt.json"
    assert main(["measure", "--tiny", tiny, "-o", str(out), "--device", "cpu", "--threads", "1", "--reps", "1"]) == 0
    gt = load_groundtruth(out)
    name = f"tiny-{tiny}"
    kinds = [p.kind for p in gt.points]
    assert set(gt.models) == {name} and (kinds.count("prefill"), kinds.count("decode"), kinds.count("mixed")) == (5, 2, 2)
    assert all(p.measured_s > 0 for p in gt.points)
    assert (gt.models[name].moe is not None) == (tiny == "moe")
    assert main(["calibrate", str(out), "-o", str(tmp_path / "p.json"), "--no-band"]) == 0
    capsys.readouterr()
