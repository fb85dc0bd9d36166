"""A minimal, fast OpenAI-compatible responder speaking vLLM's wire format, for gateway tests
and the gateway benchmarks.

Raw asyncio HTTP/1.1 (keep-alive, Content-Length request bodies, chunked SSE responses), so its
own CPU per request stays far below any proxy put in front of it. It serves
`POST /v1/completions` and `/v1/chat/completions` (streaming and not), `GET /v1/models`,
`/health`, and `/metrics` with vLLM's metric names (or SGLang's with `flavor="sglang"`). It
honours vLLM's disaggregation protocol: a request with `kv_transfer_params.do_remote_decode`
returns `kv_transfer_params` naming its blocks; a request carrying `do_remote_prefill` counts as
a decode hand-off. Faults for tests: `fault` = `hang` (accept, never answer), `fail` (HTTP 500), `busy` (HTTP 429 with `Retry-After`), `garbage:body` (a 200 HTML
page), `garbage:first` (a stream whose first event is that page), `trickle:S` (a whole answer's
bytes one at a time, S seconds apart), `trickle_mid:S` (a stream's third event so),
`die_after:K` (close the connection after K chunks of a stream), `metrics_fail` (500 on
/metrics only), `health_fail` (503 on /health only), `end_after:K` (end the answer cleanly after K
chunks, without `[DONE]`), `error_after:K` (after K chunks an SSE error event, as vLLM sends
one when the engine fails mid-stream, then `[DONE]`), `models:JSON` (that JSON as the /v1/models
answer), `oversize:WHERE` (256 KiB where no legitimate answer to a short request has it: `first`
a first SSE event, `mid` an event after two tokens, `body` a non-streamed body, `error` a 400's
error body). With `chunk_usage` set, a stream asking for `continuous_usage_stats` gets the usage so
far on every chunk (vLLM's), so the gateway can migrate it.

Run standalone: `python tests/gateway/responder.py --port 8001 [--token-delay-ms 0]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from typing import Any

OK_HEADERS = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
SSE_HEADERS = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
               b"transfer-encoding: chunked\r\n\r\n")
GARBAGE = b"<html><body>502 Bad Gateway</body></html>"
"""What a misconfigured proxy answers with status 200 (the `garbage:` faults)."""
OVERSIZE = b"x" * (256 << 10)
"""Bytes no legitimate answer to a short request holds in one event, body or error body."""
DEFAULT_MAX_TOKENS = 16
"""Output tokens when the client sets no `max_tokens` (vLLM would use the context limit)."""
BLOCK_CHARS = 64
"""Characters per emulated KV block (the responder's prefix-cache granularity)."""


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Responder:
    """One emulated backend; `await start()` binds 127.0.0.1 and returns the port."""

    def __init__(self, *, model: str = "m", flavor: str = "vllm", token_delay_s: float = 0.0,
                 ttft_s: float = 0.0, engine_id: str = "engine-0") -> None:
        self.model, self.flavor = model, flavor
        self.token_delay_s, self.ttft_s = token_delay_s, ttft_s
        self.engine_id = engine_id
        self.fault = ""
        self.running = 0
        self.served = 0
        self.failed = 0
        """Requests answered 500 (`fail`)."""
        self.prefills = 0
        self.decodes_from_remote = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.paths: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self.keep_bodies = False
        self.chunk_usage = False
        self._blocks: set[str] = set()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        """Close the listener and every open connection (a crash, seen from the gateway)."""
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            await self._server.wait_closed()
            self._server = None

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    if line[:15].lower() == "content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length) if length else b""
                if not await self._handle(method, path, body, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _handle(self, method: str, path: str, body: bytes, w: asyncio.StreamWriter) -> bool:
        """Answer one request; False closes the connection."""
        self.paths.append(path)
        if path == "/health":
            if self.fault == "health_fail":
                w.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
                return True
            return self._json(w, b"{}")
        if path == "/metrics":
            if self.fault in ("metrics_fail", "hang_metrics"):
                if self.fault == "hang_metrics":
                    await asyncio.sleep(3600)
                w.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n")
                return True
            text = self.metrics_text().encode()
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(text), text))
            return True
        if path == "/v1/models":
            if self.fault.startswith("models:"):  # a well-formed JSON answer of another shape
                return self._json(w, self.fault[7:].encode())
            return self._json(w, json.dumps({"object": "list", "data": [
                {"id": self.model, "object": "model", "owned_by": "fleetwise"}]}).encode())
        if path not in ("/v1/completions", "/v1/chat/completions"):
            w.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return True
        if self.fault == "hang":
            await asyncio.sleep(3600)
        if self.fault == "oversize:error":
            w.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(OVERSIZE) + 13, b'{"error": "' + OVERSIZE + b'"}'))
            return True
        if self.fault == "garbage:body":  # a 200 no engine sends (an HTML error page from a proxy)
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(GARBAGE), GARBAGE))
            return True
        if self.fault == "garbage:first":  # a stream whose first event carries no JSON
            w.write(SSE_HEADERS + _chunk(b"data: " + GARBAGE + b"\n\n") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            return True
        if self.fault == "busy":  # a replica (or the proxy before it) shedding load
            err = b'{"error":{"message":"too many requests","type":"RateLimitError","code":429}}'
            w.write(b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 3\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(err), err))
            return True
        if self.fault == "fail":
            self.failed += 1
            err = b'{"error":{"message":"engine failure","type":"server_error","code":500}}'
            w.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(err), err))
            return True
        req = json.loads(body)
        if self.keep_bodies:
            self.bodies.append(req)
        if req.get("model") != self.model:
            err = json.dumps({"error": {"message": f"model {req.get('model')!r} not found",
                                        "type": "NotFoundError", "code": 404}}).encode()
            w.write(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(err), err))
            return True
        self.running += 1
        try:
            return await self._complete(path, req, w)
        finally:
            self.running -= 1

    async def _trickle(self, w: asyncio.StreamWriter, data: bytes, gap_s: float) -> bool:
        w.write(OK_HEADERS + b"%d\r\n\r\n" % len(data))
        await self._bytes_apart(w, data, gap_s)
        return True

    async def _trickle_chunk(self, w: asyncio.StreamWriter, data: bytes, gap_s: float) -> None:
        w.write(b"%x\r\n" % len(data))
        await self._bytes_apart(w, data, gap_s)
        w.write(b"\r\n")

    @staticmethod
    async def _bytes_apart(w: asyncio.StreamWriter, data: bytes, gap_s: float) -> None:
        for i in range(len(data)):
            await asyncio.sleep(gap_s)
            if w.is_closing():
                return
            w.write(data[i:i + 1])

    def _json(self, w: asyncio.StreamWriter, data: bytes) -> bool:
        w.write(OK_HEADERS + b"%d\r\n\r\n%s" % (len(data), data))
        return True

    def _count_prefix(self, req: dict[str, Any]) -> None:
        text = json.dumps(req.get("prompt", req.get("messages", "")))
        for i in range(len(text) // BLOCK_CHARS):
            key = text[: (i + 1) * BLOCK_CHARS]
            self.prefix_queries += BLOCK_CHARS
            if key in self._blocks:
                self.prefix_hits += BLOCK_CHARS
            else:
                self._blocks.add(key)

    async def _complete(self, path: str, req: dict[str, Any], w: asyncio.StreamWriter) -> bool:
        chat = path.endswith("chat/completions")
        n = int(req.get("max_completion_tokens") or req.get("max_tokens") or DEFAULT_MAX_TOKENS)
        kv = req.get("kv_transfer_params") or {}
        self._count_prefix(req)
        out_kv: dict[str, Any] | None = None
        if kv.get("do_remote_decode"):
            self.prefills += 1
            out_kv = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1, 2, 3],
                      "remote_engine_id": self.engine_id, "remote_request_id": f"cmpl-{self.served}",
                      "remote_host": "127.0.0.1", "remote_port": self.port}
        elif kv.get("do_remote_prefill"):
            self.decodes_from_remote += 1
        rid = f"cmpl-{self.served}"
        self.served += 1
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
        if req.get("stream"):  # headers at once, as vLLM sends them; the first event after ttft_s
            w.write(SSE_HEADERS)
        if self.ttft_s:
            await asyncio.sleep(self.ttft_s)
        if not req.get("stream"):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s * n)
            text = "".join(f"t{i} " for i in range(n))
            choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                       "finish_reason": "length"} if chat else
                                      {"index": 0, "text": text, "finish_reason": "length"})
            doc: dict[str, Any] = {"id": rid, "object": kind, "created": created, "model": self.model,
                                   "choices": [choice], "usage": usage}
            if self.fault == "oversize:body":
                doc["padding"] = OVERSIZE.decode()
            if out_kv is not None:
                doc["kv_transfer_params"] = out_kv
            if self.fault.startswith("trickle:"):  # the answer's bytes one at a time, each after that many s
                return await self._trickle(w, json.dumps(doc).encode(), float(self.fault[8:]))
            return self._json(w, json.dumps(doc).encode())
        die_after = int(self.fault.split(":")[1]) if self.fault.startswith("die_after:") else -1
        end_after = int(self.fault.split(":")[1]) if self.fault.startswith("end_after:") else -1
        error_after = int(self.fault.split(":")[1]) if self.fault.startswith("error_after:") else -1
        counted = self.chunk_usage and (req.get("stream_options") or {}).get("continuous_usage_stats")
        head = json.dumps({"id": rid, "object": kind + ".chunk" if chat else kind, "created": created,
                           "model": self.model})[:-1]
        for i in range(n):
            if i == die_after:
                w.transport.abort()
                return False
            if i == end_after:  # a well-formed end of the answer, without the rest or [DONE]
                w.write(b"0\r\n\r\n")
                return True
            if (i, self.fault) in ((0, "oversize:first"), (2, "oversize:mid")):  # an event that never ends
                w.write(_chunk(b"data: " + OVERSIZE))
                await w.drain()
                await asyncio.sleep(3600)
            if i == error_after:  # vLLM's error event for an engine failing mid-stream, then the end
                err = b'{"error": {"object": "error", "message": "engine failed", "type": "InternalServerError", ' \
                      b'"param": null, "code": 500}}'
                w.write(_chunk(b"data: " + err + b"\n\n") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                return True
            if w.is_closing():  # the client went away: stop generating (as an engine aborts)
                return False
            last = i == n - 1
            fin = '"length"' if last else "null"
            if chat:
                role = '"role":"assistant",' if i == 0 else ""
                ev = f'{head}, "choices":[{{"index":0,"delta":{{{role}"content":"t{i} "}},"finish_reason":{fin}}}]}}'
            else:
                ev = f'{head}, "choices":[{{"index":0,"text":"t{i} ","finish_reason":{fin}}}]}}'
            if counted:
                ev = ev[:-1] + f', "usage":{{"prompt_tokens":8,"completion_tokens":{i + 1},"total_tokens":{9 + i}}}}}'
            if i == 2 and self.fault.startswith("trickle_mid:"):  # the third event a byte at a time
                await self._trickle_chunk(w, b"data: " + ev.encode() + b"\n\n", float(self.fault[12:]))
            else:
                w.write(_chunk(b"data: " + ev.encode() + b"\n\n"))
            if self.token_delay_s and not last:
                await asyncio.sleep(self.token_delay_s)
            elif i % 8 == 7:
                await w.drain()
        if (req.get("stream_options") or {}).get("include_usage"):
            ev = f'{head}, "choices":[],"usage":{json.dumps(usage)}}}'
            w.write(_chunk(b"data: " + ev.encode() + b"\n\n"))
        w.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await w.drain()
        return True

    def metrics_text(self) -> str:
        """Prometheus text with the engine's load in vLLM's (or SGLang's) metric names."""
        lbl = f'{{model_name="{self.model}"}}'
        if self.flavor == "sglang":
            rate = self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
            return (f"sglang:num_running_reqs{lbl} {self.running}\nsglang:num_queue_reqs{lbl} 0\n"
                    f"sglang:token_usage{lbl} {min(1.0, self.running / 64):.4f}\n"
                    f"sglang:cache_hit_rate{lbl} {rate:.4f}\n")
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{lbl} {self.running}\n"
            f"vllm:num_requests_waiting{lbl} 0\n"
            f"vllm:kv_cache_usage_perc{lbl} {min(1.0, self.running / 64):.4f}\n"
            f"vllm:prefix_cache_queries_total{lbl} {self.prefix_queries}\n"
            f"vllm:prefix_cache_hits_total{lbl} {self.prefix_hits}\n"
        )


async def _serve(args: argparse.Namespace) -> None:
    r = Responder(model=args.model, flavor=args.flavor, token_delay_s=args.token_delay_ms / 1e3,
                  ttft_s=args.ttft_ms / 1e3, engine_id=f"engine-{args.port}")
    await r.start(args.port)
    print(f"responder on {r.url}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="m")
    p.add_argument("--flavor", choices=("vllm", "sglang"), default="vllm")
    p.add_argument("--token-delay-ms", type=float, default=0.0)
    p.add_argument("--ttft-ms", type=float, default=0.0)
    args = p.parse_args()
    try:
        import uvloop  # type: ignore[import-not-found]
        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_serve(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
