"""A deliberately fast fake OpenAI upstream for overhead measurements (uvloop + httptools).

Every ``POST .../chat/completions`` gets the same canned answer holding one valid tool call (as an
SSE stream when the request says ``"stream": true``), so the time measured through the proxy minus
the time measured directly is the proxy's own cost.

    python -m benchmarks.support.fast_upstream --port 9100
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httptools
import orjson
import uvloop

__all__ = ["CANNED_COMPLETION", "main", "serve"]

CANNED_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "bench-model",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_bench_1",
                        "type": "function",
                        "function": {
                            "name": "get_order_details",
                            "arguments": '{"order_id": "#W2378156"}',
                        },
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 812, "completion_tokens": 23, "total_tokens": 835},
}


def _response(body: bytes) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    return head + body


def _sse_answer() -> bytes:
    base = {k: CANNED_COMPLETION[k] for k in ("id", "created", "model")}
    call = CANNED_COMPLETION["choices"][0]["message"]["tool_calls"][0]
    args = call["function"]["arguments"]
    head = {"index": 0, **call, "function": {**call["function"], "arguments": ""}}
    deltas: list[tuple[dict[str, object], str | None]] = [
        ({"role": "assistant", "content": None}, None),
        ({"tool_calls": [head]}, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": args[:10]}}]}, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": args[10:]}}]}, None),
        ({}, "tool_calls"),
    ]  # fmt: skip
    events = [
        b"data: "
        + orjson.dumps(
            {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )
        + b"\n\n"
        for delta, finish in deltas
    ]
    events.append(b"data: [DONE]\n\n")
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    status = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    return status + b"\r\n" + body


_CHAT = _response(orjson.dumps(CANNED_COMPLETION))
_STREAM = _sse_answer()
_MODELS = _response(b'{"object":"list","data":[{"id":"bench-model","object":"model"}]}')


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._streamed = False
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
        self._streamed = False

    def on_body(self, body: bytes) -> None:
        # The flag sits in the JSON body; bodies arrive whole or split, so look at each piece.
        self._streamed = self._streamed or b'"stream":true' in body or b'"stream": true' in body

    def on_message_complete(self) -> None:
        assert self._transport is not None
        if b"chat/completions" not in self._url:
            self._transport.write(_MODELS)
        else:
            self._transport.write(_STREAM if self._streamed else _CHAT)


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Protocol, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
