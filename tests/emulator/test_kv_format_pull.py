"""An emulated decode replica refuses a KV pull whose format it cannot take (and so does the
prefill replica asked for it), with one clear line; a compatible pull declares its format."""

from __future__ import annotations

from emu_helpers import asgi_post, cfg, run, serve

from fleetwise.core.tokens import words_text

PROMPT = words_text(list(range(200)))


async def _prefill(pc):
    r = await pc.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1,
                                               "kv_transfer_params": {"do_remote_decode": True}})
    assert r.status_code == 200, r.text
    return r.json()["kv_transfer_params"]


def test_the_hand_off_declares_the_prefill_replicas_kv_format():
    async def go():
        async with serve(cfg(role="prefill", kv_dtype="fp8", model_version="v3")) as (_, pc):
            ktp = await _prefill(pc)
            assert (ktp["model_version"], ktp["kv_cache_dtype"], ktp["block_size"], ktp["tp_size"], ktp["vendor"]) == (
                "v3", "fp8_e4m3fn", 16, 1, "nvidia")
    run(go())


def test_a_decode_replica_of_another_version_refuses_the_pull():
    async def go():
        async with serve(cfg(role="prefill", port=9111)) as (papp, pc):
            async with serve(cfg(role="decode", port=9112, model_version="v2"),
                             kv_post=asgi_post({"http://127.0.0.1:9111": papp})) as (_, dc):
                ktp = await _prefill(pc)
                d = await dc.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4,
                                                           "kv_transfer_params": ktp})
                assert d.status_code == 409, d.text
                err = d.json()["error"]
                assert err["type"] == "ConflictError" and err["param"] == "kv_transfer_params"
                assert err["message"].startswith("this decode replica refuses the KV pull: model_version 'v1' -> 'v2'")
                assert len(papp.state.replica.leases.held) == 1  # nothing was pulled: the lease still holds the KV
    run(go())


def test_a_prefill_replica_refuses_a_puller_with_no_common_format():
    async def go():
        # H100 fp8 KV is OCP E4M3FN; an MI300X decode reads bf16 and E4M3FNUZ only.
        async with serve(cfg(role="prefill", kv_dtype="fp8")) as (papp, pc):
            ktp = await _prefill(pc)
            body = {"remote_request_id": ktp["remote_request_id"],
                    "kv_format": {"model_version": "v1", "kv_cache_dtype": "bf16", "block_size": 16,
                                  "tp_size": 1, "vendor": "amd"}}
            r = await pc.post("/fleetwise/kv/pull", json=body)
            assert r.status_code == 409
            assert "kv_dtype 'fp8_e4m3fn' -> 'bf16': no common KV format" in r.json()["error"]["message"]
            assert len(papp.state.replica.leases.held) == 1
    run(go())
