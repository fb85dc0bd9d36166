"""The plan as text: full rows when piped, and the SLO, the GPU prices and where the perf model
is uncalibrated stated alike in the JSON, the terminal report and the HTML page."""

from __future__ import annotations

import html
import json
import re
from types import SimpleNamespace

from fleetwise.cli.common import PIPE_WIDTH, console
from fleetwise.perf.profile import Profile
from fleetwise.planner.calibration import FACTORS_BY_FIGURE, MOE_FACTORS, calibration
from fleetwise.report.plan_text import calibration_lines, price_lines, render, slo_line
from fleetwise.spec.catalog import resolve_gpu, resolve_model


def test_piped_plan_table_keeps_every_cell_whole(plan_run, capsys):
    doc = json.loads((plan_run / "plan.json").read_text())
    out = console(markup=True)
    assert out.width == PIPE_WIDTH  # captured stdout is not a terminal
    render(doc, out)
    text = capsys.readouterr().out
    assert "…" not in text
    for p in doc["plans"]:
        for q in p["pools"]:
            assert f"{q['replicas']}x {q['role']} {q['accelerator']} {q['weight_dtype']} TP{q['tp']}" in text
    rows = [line for line in text.splitlines() if line.startswith("│") and "x " in line]
    assert rows
    for token in re.findall(r"\d[\d,]*\.\d+", "".join(rows)):  # table numbers: at most 4 significant digits
        assert len(token.replace(",", "").replace(".", "").lstrip("0")) <= 4, token


def test_plan_states_its_slo_prices_and_uncalibrated_factors_everywhere(plan_run, capsys):
    doc = json.loads((plan_run / "plan.json").read_text())
    assert doc["slo"] == {"ttft_s": 0.6, "tpot_s": 0.03, "percentile": 90, "attainment": 0.9}
    assert doc["prices"] == {"h100-sxm": {"usd_per_gpu_hour": resolve_gpu("h100-sxm").price_per_hour_usd,
                                          "source": doc["prices"]["h100-sxm"]["source"]}}
    assert doc["prices"]["h100-sxm"]["source"].startswith("catalog default")
    cal = doc["calibration"]
    assert cal["profile"] is None
    assert [(u["accelerator"], u["figure"]) for u in cal["uncalibrated"]] == [("h100-sxm", "TTFT"), ("h100-sxm", "TPOT")]
    assert cal["uncalibrated"][0]["factors"] == "gemm_compute_eff 0.7, attn_compute_eff 0.4"
    render(doc, console(markup=True))
    terminal = capsys.readouterr().out
    page = html.unescape((plan_run / "report.html").read_text())
    lines = [slo_line(doc), *price_lines(doc), *calibration_lines(doc)]
    assert "SLO held to: TTFT 600 ms and TPOT 30 ms at p90, met by 90% of requests" in lines
    assert any(line.startswith("uncalibrated on h100-sxm, TPOT: gemm_mem_eff 0.7, kv_mem_eff 0.85") for line in lines)
    for line in lines:
        assert line in terminal
        assert line in page


def _search(profile_path: str | None, profile: Profile, model: str, gpus: list[str]) -> SimpleNamespace:
    return SimpleNamespace(perf=SimpleNamespace(profile=profile), spec=SimpleNamespace(profile=profile_path),
                           hw=SimpleNamespace(model=resolve_model(model), gpus={g: resolve_gpu(g) for g in gpus}))


def test_a_profile_from_another_card_is_uncalibrated_there_only():
    fitted = Profile(accelerator="h200-sxm", gemm_mem_eff=0.81, fit={"median_abs_pct": 1.45, "max_abs_pct": 10.9})
    cal = calibration(_search("h200.json", fitted, "llama-3.1-8b", ["h200-sxm", "h100-sxm"]))  # type: ignore[arg-type]
    assert {u["accelerator"] for u in cal["uncalibrated"]} == {"h100-sxm"}
    assert all(u["reason"] == "the profile was fitted on h200-sxm, not on h100-sxm" for u in cal["uncalibrated"])
    tpot = next(u for u in cal["uncalibrated"] if u["figure"] == "TPOT")
    assert tpot["factors"] == "gemm_mem_eff 0.81, kv_mem_eff 0.85"
    lines = calibration_lines({"calibration": cal})
    assert lines[0] == "perf profile h200.json (measured on h200-sxm, fitted to median 1.45% / max 10.9% error)"
    same = calibration(_search("h200.json", fitted, "llama-3.1-8b", ["h200-sxm"]))  # type: ignore[arg-type]
    assert same["uncalibrated"] == [] and same["fix"] == ""


def test_moe_models_name_their_grouped_gemm_factors():
    cal = calibration(_search(None, Profile(), "qwen3-30b-a3b", ["h100-sxm"]))  # type: ignore[arg-type]
    assert [u["figure"] for u in cal["uncalibrated"]] == [*FACTORS_BY_FIGURE, "TTFT and TPOT (MoE)"]
    assert cal["uncalibrated"][-1]["factors"].split(", ")[0] == f"{MOE_FACTORS[0][0]} {Profile().grouped_tile_k:g}"
