"""A real engine behind the gateway: two llama.cpp servers (llama-cpp-python's OpenAI-compatible
server) on a tiny random-weight Llama model, routed and streamed through `fleetwise gateway`.

Run it with the Python of a throwaway venv that has `llama-cpp-python[server]` and `gguf`
(never the project's own: llama.cpp is not a dependency of fleetwise):

    python3 -m venv /work/venvs/llamacpp
    nice -n 15 /work/venvs/llamacpp/bin/pip install 'llama-cpp-python[server]' gguf
    /work/venvs/llamacpp/bin/python benchmarks/gateway_llamacpp.py --fleetwise .venv/bin/fleetwise

1. `write_model` writes a GGUF file with the `gguf` package: the llama architecture, 2 layers,
   64-wide embeddings, a 320-token SentencePiece-style vocabulary (3 specials, 256 byte
   fallbacks, 61 pieces), float32 weights drawn from a seeded normal. No download.
2. Two `python -m llama_cpp.server` processes serve it on 127.0.0.1.
3. The gateway (both as backends, `metrics_path: null`: llama-cpp-python's server has no
   Prometheus page; health from `HEALTH_PATH`, see there) routes greedy
   (temperature 0) streamed and non-streamed completions and chats round-robin; each answer is
   compared with the same request sent straight to the backend that served it.

Results go to benchmarks/results/gateway_llamacpp.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from processes import free_port, stop  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N_LAYER, N_EMBD, N_HEAD, N_FF, N_CTX = 2, 64, 4, 128, 512
"""The model's shape: small enough to load in well under a second on one core."""
PIECES = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u2581" + w for w in (
    "the", "a", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "with", "as", "be",
    "at", "one", "have", "this", "from", "by", "hot", "word", "but", "what", "some", "we", "can", "out",
    "other", "were", "all", "there", "when")]
"""Vocabulary pieces after the specials and the 256 byte tokens (SentencePiece's word marker)."""
SEED = 0
MODEL = "tiny"
"""The name the servers serve the model under (`--model_alias`)."""
HEALTH_PATH = "/openapi.json"
"""llama-cpp-python's server has no /health. Its /v1/models takes the model lock, and with the
server's default `interrupt_requests` any request taking that lock cuts the stream in flight
(seen as mid-stream disconnects when the gateway polled /v1/models), so the gateway checks
health on the FastAPI schema page instead, and the model names are configured."""


def write_model(path: Path) -> dict[str, Any]:
    """A random-weight llama GGUF at `path`; returns its shape."""
    import gguf  # the throwaway venv's

    rng = np.random.default_rng(SEED)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + \
        [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(PIECES)
    scores = [0.0] * 259 + [-float(i) for i in range(len(PIECES))]
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("fleetwise-tiny-random")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}<|assistant|>\n")

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    t("token_embd.weight", n_vocab, N_EMBD)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    t("output.weight", n_vocab, N_EMBD)
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{name}.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"architecture": "llama", "layers": N_LAYER, "embedding": N_EMBD, "heads": N_HEAD, "ffn": N_FF,
            "vocab": n_vocab, "context": N_CTX, "bytes": path.stat().st_size}


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float = 180.0) -> None:
    end = time.time() + timeout_s
    while time.time() < end:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-3000:] if proc.stderr else ""
            raise RuntimeError(f"exited with {proc.returncode}: {err}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready in {timeout_s} s")




def post(url: str, body: dict[str, Any], timeout_s: float = 120.0) -> tuple[int, dict[str, str], bytes, float]:
    """(status, headers, raw body, seconds to the first body byte)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    try:
        r = urllib.request.urlopen(req, timeout=timeout_s)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read(), time.perf_counter() - t0
    with r:
        first = r.read(1)
        t1 = time.perf_counter() - t0
        return r.status, dict(r.headers), first + r.read(), t1


def text_of(raw: bytes, stream: bool, chat: bool) -> tuple[str, int]:
    """(generated text, number of SSE data events) of an answer."""
    if not stream:
        doc = json.loads(raw)
        c = doc["choices"][0]
        return (c["message"]["content"] if chat else c["text"]), 0
    out, n = [], 0
    for block in raw.decode().split("\n"):
        if block.startswith("data: ") and block[6:].strip() != "[DONE]":
            n += 1
            ev = json.loads(block[6:])
            if "choices" not in ev:
                raise ValueError(f"event without choices: {block[:300]}")
            ch = ev["choices"]
            if ch:
                out.append((ch[0].get("delta") or {}).get("content") or "" if chat else ch[0].get("text") or "")
    return "".join(out), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleetwise", default=str(ROOT / ".venv/bin/fleetwise"), help="the fleetwise executable")
    ap.add_argument("--requests", type=int, default=8, help="requests of each kind through the gateway")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gateway_llamacpp.json"))
    a = ap.parse_args()
    work = Path("/tmp/fleetwise-llamacpp")
    work.mkdir(exist_ok=True)
    model = work / "tiny-random-llama.gguf"
    shape = write_model(model)
    import llama_cpp  # the throwaway venv's

    ports = [free_port() for _ in range(2)]
    servers = [subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                                 "--port", str(p), "--n_ctx", str(N_CTX), "--n_threads", "1", "--model_alias", MODEL],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
               for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    gw_port = free_port()
    cfg = work / "gateway.json"
    cfg.write_text(json.dumps({"backends": [{"url": u, "name": f"llama{i}", "metrics_path": None,
                                             "health_path": HEALTH_PATH} for i, u in enumerate(urls)],
                               "models": [MODEL], "routing": {"policy": "round-robin"}, "port": gw_port}))
    gw: subprocess.Popen[bytes] | None = None
    rows: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"what": "gateway in front of two llama.cpp servers (llama-cpp-python) on a tiny "
                                   "random-weight llama GGUF", "llama_cpp_python": llama_cpp.__version__,
                           "model": shape}
    try:
        for p, u in zip(servers, urls, strict=True):
            wait_ready(p, u + "/v1/models")
        gw = subprocess.Popen([a.fleetwise, "gateway", "--config", str(cfg)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
        gurl = f"http://127.0.0.1:{gw_port}"
        wait_ready(gw, gurl + "/readiness")
        with urllib.request.urlopen(gurl + "/v1/models") as r:
            doc["models_via_gateway"] = [m["id"] for m in json.load(r)["data"]]
        for i in range(a.requests):
            for chat in (False, True):
                for stream in (True, False):
                    body: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "temperature": 0.0, "stream": stream,
                                            "seed": SEED}
                    if chat:
                        body["messages"] = [{"role": "user", "content": f"the word {i} is hot"}]
                    else:
                        body["prompt"] = f"the word {i} is hot and"
                    path = "/v1/chat/completions" if chat else "/v1/completions"
                    st, hdr, raw, ttfb = post(gurl + path, body)
                    backend = hdr.get("x-fleetwise-backend", "")
                    row: dict[str, Any] = {"i": i, "chat": chat, "stream": stream, "status": st,
                                           "backend": backend, "ttfb_ms": round(ttfb * 1e3, 2)}
                    if st == 200 and b'"error"' in raw:
                        row["error"] = raw[raw.find(b'{"error"'):][:300].decode(errors="replace")
                    elif st == 200:
                        text, events = text_of(raw, stream, chat)
                        dst, _, draw, dttfb = post(urls[int(backend[-1])] + path, body)
                        dtext, devents = text_of(draw, stream, chat)
                        row.update(events=events, tokens_text=text[:60], same_as_direct=(dst == 200 and dtext == text),
                                   direct_ttfb_ms=round(dttfb * 1e3, 2), done=raw.rstrip().endswith(b"[DONE]")
                                   if stream else None)
                    else:
                        row["error"] = raw[:300].decode(errors="replace")
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        with urllib.request.urlopen(gurl + "/metrics") as r:
            metrics = r.read().decode()
        doc["gateway_requests_total"] = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in metrics.splitlines()
                                         if ln.startswith("fleetwise_gateway_requests_total")}
        for i, u in enumerate(urls):  # what the engine's server exposes where the gateway would scrape
            try:
                with urllib.request.urlopen(u + "/metrics", timeout=2) as r:
                    doc[f"llama{i}_metrics_status"] = r.status
            except urllib.error.HTTPError as err:
                doc[f"llama{i}_metrics_status"] = err.code
    finally:
        if gw is not None:
            stop(gw)
        for p in servers:
            stop(p)
    ok = [r for r in rows if r["status"] == 200 and "error" not in r]
    doc.update(rows=rows, answered=len(ok), requests=len(rows),
               all_same_as_direct=all(r.get("same_as_direct") for r in ok),
               share={b: sum(r["backend"] == b for r in ok) for b in ("llama0", "llama1")},
               streams_ended_with_done=all(r["done"] for r in ok if r["stream"]))
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
