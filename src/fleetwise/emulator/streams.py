"""How an emulated replica's answers reach the socket: a streamed response's chunks written by
the step end that produced them (`PushStream`, deciding what is due with `StreamCursor`), and a
non-streaming answer written by the step end that finishes its request (`AnswerAtEnd`).

No task wakes per token: a token reaches its socket while the step end runs. (A pull driver,
a body iterator woken after each step, was kept beside it as a reference; the tests now check
a pushed stream against the non-streaming answer of the same request instead.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.responses import Response

from fleetwise.emulator.protocol import ChunkWriter
from fleetwise.emulator.running import Live
from fleetwise.live.eager import start_now

__all__ = ["DROP", "END", "MORE", "AnswerAtEnd", "PushStream", "StreamCursor", "StreamDropped"]


class StreamDropped(Exception):
    """Raised inside a streaming body to cut the connection (the `drop_streams` fault)."""


MORE, END, DROP = 0, 1, 2
"""`StreamCursor.advance` states: more may come, the stream is complete, the stream is cut."""


class StreamCursor:
    """What one streamed response has sent of its request (`Live`) and what is due next: the one
    place that decides a stream's chunks (`PushStream` drives it)."""

    def __init__(self, live: Live, created: int, faults: Any) -> None:
        self.live, self.faults = live, faults
        self.w = ChunkWriter(live.req, live.rid, created)
        self.sent = 0

    def advance(self) -> tuple[list[bytes], int]:
        """The chunks due now, and `MORE`, `END` (the last ones were among them) or `DROP` (cut the
        stream after sending them: the `drop_streams` fault)."""
        live, w = self.live, self.w
        out: list[bytes] = []
        while True:
            if live.error is not None:
                out.append(w.error(live.error))
                out.append(w.DONE)
                return out, END
            if live.gated:  # the KV pull is not confirmed yet
                return out, MORE
            n = live.emitted
            drop = self.faults.drop_after_tokens
            if drop is not None and n >= drop:
                if drop > self.sent:
                    out.append(w.delta(live.text(self.sent, drop), None, drop))
                    self.sent = drop
                return out, DROP
            if n > self.sent:
                last = live.done and n >= live.target
                out.append(w.delta(live.text(self.sent, n), live.finish_reason if last else None, n))
                self.sent = n
                if last:
                    break
            elif live.done:
                out.append(w.delta("", live.finish_reason, self.sent))
                break
            else:
                return out, MORE
        if live.req.include_usage:
            out.append(w.usage_chunk(self.sent))
        out.append(w.DONE)
        return out, END


class PushStream(Response):
    """A streamed response whose chunks are written by the step end that produced them
    (`Live.on_change`), not by a task woken after it: a token reaches its socket while the step
    end runs (first tokens first, see `EmulatedReplica._on_output`), and no task or iterator
    runs per token (so no task wakes per token, the emulation's wall time the time scale would
    multiply). A send that must wait for the socket holds the next ones back until it is done
    (they go out together)."""

    def __init__(self, cur: StreamCursor, watcher: asyncio.Task[None], on_end: Callable[[], None],
                 headers: dict[str, str]) -> None:
        # As StreamingResponse sets itself up: no body, hence no content-length header.
        self.status_code, self.media_type, self.background = 200, "text/event-stream", None
        self.init_headers(headers)
        self.cur, self.watcher, self.on_end = cur, watcher, on_end

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        live = self.cur.live
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        busy: asyncio.Future[None] | None = None

        def sent(f: asyncio.Future[None]) -> None:
            nonlocal busy
            busy = None
            if f.cancelled():
                return
            err = f.exception()
            if err is not None:
                if not ended.done():
                    ended.set_exception(err)
                return
            pump()

        def pump() -> None:
            nonlocal busy
            if busy is not None or ended.done():
                return
            try:
                chunks, state = self.cur.advance()
            except Exception as err:  # a bug: end the response with it, not the step end
                ended.set_exception(err)
                return
            if chunks:
                f = start_now(send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True}))
                if not f.done():
                    busy = f
                    f.add_done_callback(sent)
                    if state == MORE:
                        return
                elif f.exception() is not None:
                    ended.set_exception(f.exception())  # type: ignore[arg-type]
                    return
            if state == DROP:
                ended.set_exception(StreamDropped(f"stream {live.rid} cut after {self.cur.sent} tokens "
                                                  "(injected fault)"))
            elif state == END:
                ended.set_result(None)

        live.on_change = pump
        try:
            pump()
            await ended
            if busy is not None:
                await busy
        finally:
            live.on_change = None
            self.watcher.cancel()
            self.on_end()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class AnswerAtEnd(Response):
    """A non-streaming answer written by the step end (or abort) that finishes its request,
    inside it (`Live.on_change`, `start_now`): a prefill replica's hand-off reaches its socket
    before the driver schedules the next step, not on a later turn of the loop."""

    def __init__(self, live: Live, watcher: asyncio.Task[None], build: Callable[[], Response]) -> None:
        super().__init__(status_code=200)
        self.live, self.watcher, self.build = live, watcher, build

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        live = self.live
        sent: asyncio.Future[asyncio.Future[None]] = asyncio.get_running_loop().create_future()

        def answer() -> None:
            if sent.done() or not live.done or live.gated:
                return
            live.on_change = None
            self.watcher.cancel()
            try:
                sent.set_result(start_now(self.build()(scope, receive, send)))
            except Exception as err:  # raised where the handler awaits it, not in the step end
                sent.set_exception(err)

        live.on_change = answer
        answer()  # finished already
        try:
            written = await sent
        finally:
            live.on_change = None
            self.watcher.cancel()
        await written
