"""`fleetwise deploy` and `fleetwise up` with careless or hostile flag values: exit 0, or exit 2 with
one line naming the flag; never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwise.cli.main import main

PLAN = Path(__file__).resolve().parents[2] / "examples" / "plans" / "colocated-8b.yaml"
class Started(BaseException):
    """Raised where `up` would start processes (not an Exception, so the CLI does not catch it)."""


VALUES = ["nan", "-1", "0", "", "abc", "x" * 3000, "--", " 7 ", "Bad_NS", "../../etc"]


@pytest.mark.parametrize("flag", ["--target", "-o", "--model-path", "--vllm-image", "--fleetwise-image",
                                  "--namespace"])
def test_deploy_flags(flag, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for value in VALUES:
        argv = {"--target": "k8s", "-o": str(tmp_path / "out"), flag: value}
        rc = main(["deploy", str(PLAN), *[x for k, v in argv.items() for x in (k, v) if not (k == flag and v == "")],
                   *([flag, value] if value == "" else [])])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc in (0, 2), (flag, value, err)
        if rc == 2:
            assert len(err) == 1 and ("error:" in err[0]), (flag, value, err)
            assert "Traceback" not in err[0]


@pytest.mark.parametrize("flag", ["--port", "--time-scale", "--duration", "--seed", "--host", "--faults"])
def test_up_flags_are_refused_before_anything_starts(flag, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import fleetwise.cli.local_fleet as lf

    def refuse(self, timeout_s=0.0):  # a valid command line would start a fleet: stop there
        raise Started

    monkeypatch.setattr(lf.LocalFleet, "start", refuse)
    for value in ["nan", "-1", "0", "", "abc", "1e999", "x" * 300]:
        try:
            rc = main(["up", str(PLAN), flag, value])
        except Started:
            continue
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "error:" in err[0], (flag, value, err)


@pytest.mark.parametrize("target", ["vllm", "k8s", "compose"])
def test_deploy_refuses_a_fleet_whose_replicas_do_not_fit_their_cards(target, tmp_path, capsys):
    plan = tmp_path / "big.yaml"
    plan.write_text("name: big\npools:\n  - {name: m, replicas: 1, accelerator: h100-sxm, model: llama-3.1-405b}\n")
    assert main(["deploy", str(plan), "--target", target, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fleetwise deploy: error: {plan}: pools.0 (m): fit failed: no room for KV cache (tp=1, pp=1, "
                   "bf16, gpu_memory_utilization 0.9); raise tp/pp or the share, or use smaller dtypes; see "
                   "`fleetwise fit --model llama-3.1-405b --gpu h100-sxm`"]
    assert not (tmp_path / "out").exists()
