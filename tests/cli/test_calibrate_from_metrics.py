"""`calibrate --from-metrics` as an operator runs it: SGLang dumps of a fleet whose steps are 1.25x
the model give 1.25; a replica that is down or answers something other than HTTP is one line
naming the source and the fix, never a traceback or an internal error."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from fleetwise.cli.main import main
from fleetwise.planner.measured import ServiceRates, modelled_service
from fleetwise.spec.plan import PlanSpec

FLEET = {"name": "one", "routing": "round-robin",
         "pools": [{"name": "mixed", "replicas": 1, "accelerator": "h100-sxm", "model": "llama-3.1-8b"}]}
QUEUE_S = 0.05
"""Mean queueing time the SGLang dump says each request spent before its prefill."""


def sglang_dump(requests: float, prompt: float, output: float, ttft_s: float, e2e_s: float) -> str:
    """An SGLang /metrics page after `requests` finished requests with these means."""
    lab = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    lines = []
    for name, value in (("num_requests", requests), ("prompt_tokens", prompt * requests),
                        ("generation_tokens", output * requests)):
        lines += [f"# TYPE sglang:{name}_total counter", f"sglang:{name}_total{{{lab}}} {value}"]
    for name, mean in (("time_to_first_token", ttft_s), ("e2e_request_latency", e2e_s), ("queue_time", QUEUE_S)):
        lines += [f"# TYPE sglang:{name}_seconds histogram", f'sglang:{name}_seconds_bucket{{{lab},le="+Inf"}} {requests}',
                  f"sglang:{name}_seconds_count{{{lab}}} {requests}", f"sglang:{name}_seconds_sum{{{lab}}} {mean * requests}"]
    return "\n".join([*lines, "# TYPE sglang:token_usage gauge", f"sglang:token_usage{{{lab}}} 0.3", ""])


def test_sglang_dumps_of_a_slower_fleet_give_its_factor(tmp_path, capsys):
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps(FLEET), encoding="utf-8")
    plan = PlanSpec.load(fleet)
    load = ServiceRates(600, 1024, 128, 0.0, 0.0, 6.0)
    m = modelled_service(plan, {"mixed": load}, {"mixed": 1.25}, seed=3)["mixed"]
    ttft = QUEUE_S + m.prefill_s
    before, after = tmp_path / "before.prom", tmp_path / "after.prom"
    before.write_text(sglang_dump(100, 1024, 128, ttft, ttft + 127 * m.decode_s_per_token), encoding="utf-8")
    after.write_text(sglang_dump(700, 1024, 128, ttft, ttft + 127 * m.decode_s_per_token), encoding="utf-8")
    out = tmp_path / "measured.json"
    assert main(["calibrate", "--from-metrics", f"{before},{after}", "--plan", str(fleet), "--interval", "100",
                 "-o", str(out)]) == 0
    (pool,) = json.loads(out.read_text(encoding="utf-8"))["pools"]
    assert (pool["requests"], pool["rate_rps_per_replica"], pool["prompt_tokens_mean"]) == (600, 6.0, 1024)
    assert pool["step_time_factor"] == pytest.approx(1.25, rel=0.02)
    assert "mixed: 1 replica(s), 600 requests" in capsys.readouterr().out


def _serve_once(payload: bytes) -> int:
    """A loopback TCP server answering one connection with `payload`; its port."""
    srv = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        with srv:
            conn, _ = srv.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(payload)

    threading.Thread(target=answer, daemon=True).start()
    return int(srv.getsockname()[1])


def test_a_source_that_is_not_http_or_is_down_is_one_line(tmp_path, capsys):
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({**FLEET, "pools": [{**FLEET["pools"][0], "replicas": 2}]}), encoding="utf-8")
    port = _serve_once(b"SSH-2.0-OpenSSH_9.6\r\n")
    args = ["calibrate", "--plan", str(fleet), "--interval", "1", "-o", str(tmp_path / "m.json"), "--from-metrics"]
    assert main([*args, f"http://127.0.0.1:{port}/metrics"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"fleetwise calibrate: error: --from-metrics http://127.0.0.1:{port}/metrics: cannot "
                           "scrape it (BadStatusLine"), line
    with socket.socket() as s:  # a port nothing listens on: a replica that is down
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    assert main([*args, f"mixed-1=http://127.0.0.1:{down}/metrics"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "Connection refused" in line
    assert line.endswith("check the URL, or leave a replica that is down out and name the others (NAME=SOURCE)")


def test_a_pd_fleets_lines_show_each_pool_the_rate_it_serves(tmp_path, capsys):
    """vLLM dumps of a prefill and a decode replica: each pool's line names only its own phase."""
    fleet = tmp_path / "pd.json"
    fleet.write_text(json.dumps({"name": "pd", "routing": "round-robin", "pools": [
        {"name": "prefill", "role": "prefill", "replicas": 1, "accelerator": "h200-sxm", "model": "llama-3.1-8b"},
        {"name": "decode", "role": "decode", "replicas": 1, "accelerator": "h200-sxm", "model": "llama-3.1-8b"}]}),
        encoding="utf-8")

    def dump(requests: int, output: int, prefill_s: float, decode_s: float) -> str:
        lab = 'engine="0",model_name="llama-3.1-8b"'
        lines = ["# TYPE vllm:request_success counter", f"vllm:request_success_total{{{lab}}} {requests}"]
        for name, mean in (("vllm:request_prompt_tokens", 1024), ("vllm:request_generation_tokens", output),
                           ("vllm:request_prefill_time_seconds", prefill_s),
                           ("vllm:request_decode_time_seconds", decode_s)):
            lines += [f"# TYPE {name} histogram", f'{name}_bucket{{{lab},le="+Inf"}} {requests}',
                      f"{name}_count{{{lab}}} {requests}", f"{name}_sum{{{lab}}} {mean * requests}"]
        return "\n".join([*lines, ""])

    pre, dec = tmp_path / "pre.prom", tmp_path / "dec.prom"
    pre.write_text(dump(300, 1, 0.08, 0.0), encoding="utf-8")
    dec.write_text(dump(300, 64, 0.0, 63 * 0.009), encoding="utf-8")
    assert main(["calibrate", "--from-metrics", f"prefill-0={pre}", f"decode-0={dec}", "--plan", str(fleet),
                 "--interval", "60", "-o", str(tmp_path / "m.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("prefill: 1 replica(s), 300 requests: prefill 12,800 tok/s; step time x")
    assert lines[1].startswith("decode: 1 replica(s), 300 requests: decode 111.1 tok/s per request; step time x")


def vllm_dump(requests: int, prompt: int, output: int, prefill_s: float, decode_s: float,
              time_scale: float | None = None) -> str:
    """A vLLM page after `requests` finished requests with these means; with `time_scale`, the
    `fleetwise:time_scale` gauge an emulated replica adds."""
    lab = 'engine="0",model_name="llama-3.1-8b"'
    lines = ["# TYPE vllm:request_success counter", f"vllm:request_success_total{{{lab}}} {requests}"]
    for name, mean in (("vllm:request_prompt_tokens", prompt), ("vllm:request_generation_tokens", output),
                       ("vllm:request_prefill_time_seconds", prefill_s), ("vllm:time_to_first_token_seconds", prefill_s),
                       ("vllm:request_decode_time_seconds", decode_s)):
        lines += [f"# TYPE {name} histogram", f'{name}_bucket{{{lab},le="+Inf"}} {requests}',
                  f"{name}_count{{{lab}}} {requests}", f"{name}_sum{{{lab}}} {mean * requests}"]
    if time_scale is not None:
        lines += ["# TYPE fleetwise:time_scale gauge", f"fleetwise:time_scale{{{lab}}} {time_scale}"]
    return "\n".join([*lines, ""])


def test_an_emulated_replicas_own_time_scale_converts_the_span(tmp_path, capsys):
    """An emulated replica's page carries its time scale (`fleetwise:time_scale`): without
    --time-scale the span is converted with it (forgetting --time-scale 2 read the load as half and
    fitted x0.94 where x1.03 was measured with it), and a --time-scale that disagrees with the page
    is one line naming the page's value and the fix."""
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps(FLEET), encoding="utf-8")
    m = modelled_service(PlanSpec.load(fleet), {"mixed": ServiceRates(600, 1024, 128, 0.0, 0.0, 6.0)},
                         {"mixed": 1.0}, seed=3)["mixed"]
    args = ["calibrate", "--plan", str(fleet), "--interval", "400", "--from-metrics"]
    pools = []
    for scale, flags in ((0.25, []), (None, ["--time-scale", "0.25"])):
        before, after = tmp_path / f"b{scale}.prom", tmp_path / f"a{scale}.prom"
        before.write_text(vllm_dump(0, 1024, 128, 0.0, 0.0, scale), encoding="utf-8")
        after.write_text(vllm_dump(600, 1024, 128, m.prefill_s, 127 * m.decode_s_per_token, scale), encoding="utf-8")
        out = tmp_path / f"m{scale}.json"
        assert main([*args, f"{before},{after}", "-o", str(out), *flags]) == 0
        pools.append(json.loads(out.read_text(encoding="utf-8"))["pools"][0])
    assert pools[0]["rate_rps_per_replica"] == pools[1]["rate_rps_per_replica"] == 6.0
    assert pools[0]["step_time_factor"] == pools[1]["step_time_factor"]
    capsys.readouterr()
    assert main([*args, f"{tmp_path / 'b0.25.prom'},{tmp_path / 'a0.25.prom'}", "--time-scale", "1",
                 "-o", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fleetwise:time_scale 0.25" in err and "--time-scale 0.25" in err, err
