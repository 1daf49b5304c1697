"""A fast fake upstream whose streams are as long as asked: chat, Responses and Messages events.

``POST /v1/chat/completions``, ``/v1/responses`` and ``/v1/messages`` with ``?deltas=N`` in the
URL answer an event stream of that API whose text arrives in N deltas of prose, then a tool call
written as text (JSON, in four deltas): a gated stream the proxy reads delta by delta and judges
at its end. ``benchmarks.growth`` times the proxy on N and 4N deltas.

    python -m benchmarks.support.stream_upstream --port 9300
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httptools
import orjson
import uvloop

__all__ = ["CALL_TEXT", "main", "serve"]

CALL_TEXT = '{"name": "get_order_details", "arguments": {"order_id": "#W2378156"}}'
_PROSE = "Checking the order details now. "


def _pieces(deltas: int) -> list[str]:
    call = [CALL_TEXT[i : i + 18] for i in range(0, len(CALL_TEXT), 18)]
    return [_PROSE] * deltas + ["\n"] + call


def _chunked(events: list[bytes]) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    return head + b"\r\n" + body


def _data(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), orjson.dumps({"type": kind, **payload}))


@functools.cache
def chat_stream(deltas: int) -> bytes:
    base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _data({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in _pieces(deltas)]
    events += [chunk({}, "stop"), b"data: [DONE]\n\n"]
    return _chunked(events)


@functools.cache
def responses_stream(deltas: int) -> bytes:
    text = "".join(_pieces(deltas))
    item = {"id": "msg_s", "type": "message", "role": "assistant", "status": "completed"}
    done_item = {**item, "content": [{"type": "output_text", "text": text, "annotations": []}]}
    response = {"id": "resp_s", "object": "response", "created_at": 1, "model": "m"}
    where = {"item_id": "msg_s", "output_index": 0, "content_index": 0}
    events = [
        _event("response.created", {"response": {**response, "status": "in_progress"}}),
        _event("response.output_item.added", {"output_index": 0, "item": {**item, "content": []}}),
        _event("response.content_part.added", {**where, "part": {"type": "output_text"}}),
    ]
    events += [_event("response.output_text.delta", {**where, "delta": p}) for p in _pieces(deltas)]
    events += [
        _event("response.output_text.done", {**where, "text": text}),
        _event("response.output_item.done", {"output_index": 0, "item": done_item}),
        _event(
            "response.completed",
            {"response": {**response, "status": "completed", "output": [done_item]}},
        ),
    ]
    return _chunked(events)


@functools.cache
def messages_stream(deltas: int) -> bytes:
    message = {"id": "msg_s", "type": "message", "role": "assistant", "model": "m", "content": []}
    usage = {"input_tokens": 10, "output_tokens": 1}
    events = [
        _event("message_start", {"message": {**message, "usage": usage}}),
        _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ]
    events += [
        _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": p}})
        for p in _pieces(deltas)
    ]
    events += [
        _event("content_block_stop", {"index": 0}),
        _event("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": usage}),
        _event("message_stop", {}),
    ]
    return _chunked(events)


_STREAMS = {
    "/v1/chat/completions": chat_stream,
    "/v1/responses": responses_stream,
    "/v1/messages": messages_stream,
}
_MODELS_BODY = b'{"object":"list","data":[{"id":"m","object":"model"}]}'
_MODELS = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_MODELS_BODY),
    _MODELS_BODY,
)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_message_complete(self) -> None:
        assert self._transport is not None
        parts = urlsplit(self._url.decode())
        stream = _STREAMS.get(parts.path)
        if stream is None:
            self._transport.write(_MODELS)
            return
        deltas = int(parse_qs(parts.query).get("deltas", ["8"])[0])
        self._transport.write(stream(min(max(deltas, 1), 100_000)))


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Protocol, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9300)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
