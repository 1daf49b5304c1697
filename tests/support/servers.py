"""Real HTTP servers of several kinds on loopback, all answering the same small API (``ENDPOINTS``).

The conformance suite asks each kind the same questions directly and through the proxy:

    uvicorn_server()          uvicorn + httptools (what vLLM runs)
    aiohttp_server()          aiohttp.web
    stdlib_server("1.1")      http.server, keep-alive, chunked SSE
    stdlib_server("1.0")      http.server, one request per connection, bodies end at the close
    raw_server(handler)       a socket and a function: the odd cases no framework would produce

Each yields the server's ``http://127.0.0.1:PORT`` and serves until the ``with`` block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import uvicorn
from aiohttp import web

__all__ = [
    "COMPLETION",
    "ENDPOINTS",
    "SSE_EVENTS",
    "RawHandler",
    "aiohttp_server",
    "raw_server",
    "read_request",
    "reset",
    "stdlib_server",
    "uvicorn_server",
]

COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-conformance",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "conformance-model",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_order_details",
                            "arguments": '{"order_id": "#W1"}',
                        },
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-conformance",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "conformance-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


_CALL = COMPLETION["choices"][0]["message"]["tool_calls"][0]
_CALL_HEAD = {"index": 0, **_CALL, "function": {**_CALL["function"], "arguments": ""}}
SSE_EVENTS: list[bytes] = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"tool_calls": [_CALL_HEAD]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"order_id": '}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"#W1"}'}}]}),
    _chunk({}, "tool_calls"),
    b"data: [DONE]\n\n",
]  # fmt: skip
MODELS = orjson.dumps({"object": "list", "data": [{"id": "conformance-model", "object": "model"}]})
RATE_LIMITED = orjson.dumps(
    {"error": {"message": "slow down", "type": "rate_limit", "param": None, "code": None}}
)
# What every framework server answers (method, path): the conformance suite's question list.
ENDPOINTS = [
    ("GET", "/v1/models"),
    ("HEAD", "/v1/models"),
    ("POST", "/v1/echo?x=1&y=%2F"),
    ("GET", "/v1/sse"),
    ("GET", "/v1/blob?size=300000"),
    ("GET", "/v1/ratelimited"),
    ("POST", "/v1/chat/completions"),
]


class _Answer:
    """One answer of the shared API, framework-neutral: status, headers, and body parts."""

    def __init__(self, status: int, content_type: str, parts: list[bytes], **extra: str) -> None:
        self.status = status
        self.headers = {"content-type": content_type, **extra}
        self.parts = parts
        self.streamed = content_type == "text/event-stream"


def _answer(method: str, target: str, body: bytes) -> _Answer:
    parts = urlsplit(target)
    path = parts.path
    if path == "/v1/models":
        return _Answer(200, "application/json", [MODELS])
    if path == "/v1/echo":
        echo = {"method": method, "target": target, "body": body.decode("utf-8", "replace")}
        return _Answer(200, "application/json", [orjson.dumps(echo)])
    if path == "/v1/sse":
        return _Answer(200, "text/event-stream", list(SSE_EVENTS), **{"cache-control": "no-cache"})
    if path == "/v1/blob":
        size = int(parse_qs(parts.query).get("size", ["0"])[0])
        return _Answer(200, "application/octet-stream", [bytes(i % 251 for i in range(size))])
    if path == "/v1/ratelimited":
        return _Answer(429, "application/json", [RATE_LIMITED], **{"retry-after": "7"})
    if path == "/v1/chat/completions":
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            request = {}
        if isinstance(request, dict) and request.get("stream") is True:
            return _Answer(200, "text/event-stream", list(SSE_EVENTS))
        return _Answer(200, "application/json", [orjson.dumps(COMPLETION)])
    return _Answer(404, "application/json", [b'{"error": "no such path"}'])


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


# -- uvicorn --------------------------------------------------------------------------------------


async def _asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    target = scope["raw_path"].decode("ascii")
    if scope["query_string"]:
        target += "?" + scope["query_string"].decode("ascii")
    answer = _answer(scope["method"], target, body)
    headers = [(k.encode(), v.encode()) for k, v in answer.headers.items()]
    if not answer.streamed:
        headers.append((b"content-length", str(sum(map(len, answer.parts))).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    for part in answer.parts:
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


@contextmanager
def uvicorn_server() -> Iterator[str]:
    sock = _free_socket()
    config = uvicorn.Config(
        _asgi, loop="asyncio", http="httptools", lifespan="on", access_log=False,
        log_level="warning", server_header=False, date_header=False,
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


# -- aiohttp --------------------------------------------------------------------------------------


async def _aiohttp_handler(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    answer = _answer(request.method, request.raw_path, body)
    if answer.streamed:
        response = web.StreamResponse(status=answer.status, headers=answer.headers)
        await response.prepare(request)
        for part in answer.parts:
            await response.write(part)
        await response.write_eof()
        return response
    headers = {k: v for k, v in answer.headers.items() if k != "content-type"}
    return web.Response(
        status=answer.status,
        body=b"".join(answer.parts),
        content_type=answer.headers["content-type"],
        headers=headers,
    )


@contextmanager
def aiohttp_server() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _aiohttp_handler)
    runner = web.AppRunner(app, access_log=None)
    sock = _free_socket()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.SockSite(runner, sock).start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("aiohttp did not start")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        sock.close()


# -- http.server ----------------------------------------------------------------------------------


class _StdlibHandler(BaseHTTPRequestHandler):
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        answer = _answer(self.command, self.path, body)
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        chunked = answer.streamed and self.protocol_version == "HTTP/1.1"
        if chunked:
            self.send_header("transfer-encoding", "chunked")
        elif not answer.streamed:
            self.send_header("content-length", str(sum(map(len, answer.parts))))
        else:
            self.close_connection = True  # HTTP/1.0 stream: the body ends at the close
        self.end_headers()
        if self.command == "HEAD":
            return
        for part in answer.parts:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            self.wfile.flush()
        if chunked:
            self.wfile.write(b"0\r\n\r\n")


class _Http10Handler(_StdlibHandler):
    protocol_version = "HTTP/1.0"


class _Http11Handler(_StdlibHandler):
    protocol_version = "HTTP/1.1"


class _StdlibServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def stdlib_server(version: str) -> Iterator[str]:
    handler = _Http10Handler if version == "1.0" else _Http11Handler
    server = _StdlibServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# -- raw sockets ----------------------------------------------------------------------------------

RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request (head + content-length body), or None when the peer closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0) instead of a clean FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextmanager
def raw_server(handler: RawHandler) -> Iterator[str]:
    """Every request goes to ``handler(reader, writer, request)``; it answers with raw bytes.

    The connection is kept while the handler leaves the writer open (keep-alive).
    """
    loop = asyncio.new_event_loop()
    sock = _free_socket()
    started = threading.Event()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not writer.is_closing() and (request := await read_request(reader)) is not None:
                await handler(reader, writer, request)
                if not writer.is_closing():
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def serve() -> asyncio.Server:
        server = await asyncio.start_server(on_connect, sock=sock)
        started.set()
        return server

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(serve())
        loop.run_forever()
        server.close()
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.wait_for(server.wait_closed(), 2))
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the raw server did not start")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        sock.close()
