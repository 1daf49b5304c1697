"""The per-phase deadlines of issue 51 that cut a connection, and the ones that must not: a
client that stops reading is dropped after ``--write-timeout``; a long SSE stream and a slow
authenticated upload that keep making progress outlive every deadline; before the app takes a
body, its deadline counts from the head however slowly bytes come. Real servers on loopback;
nothing is timed but with generous bounds: the tests count statuses, bytes and refusals."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import orjson
import pytest
import uvicorn

from repairproxy.server import LimitedProtocol
from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.raw_http import connect, read_until_close, send_all, serving, statuses
from tests.support.scripted_upstream import ScriptedUpstream, completion

BASE = Settings(upstream="http://127.0.0.1:9/v1", repair=RepairMode.OFF)
SHORT = {
    "header_timeout": 0.4,
    "body_timeout": 0.4,
    "write_timeout": 0.4,
    "keep_alive_timeout": 0.4,
}
CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


def _chat(body: dict[str, Any], *headers: bytes, close: bool = True) -> tuple[bytes, bytes]:
    raw = orjson.dumps(body)
    head = CHAT + b"".join(h + b"\r\n" for h in headers)
    if close:
        head += b"connection: close\r\n"
    return head + b"content-length: %d\r\n\r\n" % len(raw), raw


def _wait_for(condition: Any, bound: float = 20.0) -> bool:
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection: close"])
def test_a_client_that_stops_reading_is_dropped_after_the_write_timeout(close: bool) -> None:
    # With connection: close the whole answer is handed over, then the connection closes:
    # the deadline must hold a closing connection too (it did not, before this test).
    content = "x" * (16 << 20)  # far more than the socket buffers on both sides hold
    with ScriptedUpstream() as upstream:
        upstream.push(completion(content=content))
        settings = replace(BASE, upstream=upstream.base_url, write_timeout=0.5)
        with serving(settings) as server:
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.settimeout(20)
            client.connect(("127.0.0.1", server.port))
            with client:
                head, body = _chat(
                    {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, close=close
                )
                send_all(client, head + body)
                # The client reads nothing: the answer fills the buffers, the server pauses
                # writing, and after write_timeout without progress drops the connection.
                assert _wait_for(lambda: server.refused("write_timeout") == 1)
                data, closed = read_until_close(client)
            assert closed and statuses(data) == [200]
            assert len(data) < len(content), "the whole answer came: nothing was dropped"
            assert server.refused("write_timeout") == 1


def test_a_long_stream_that_keeps_progressing_outlives_every_deadline() -> None:
    with ScriptedUpstream() as upstream:
        # Six events 0.3 s apart: 1.8 s in all, against deadlines of 0.4 s each.
        upstream.push(completion(content="one two three four five six", event_delay=0.3))
        settings = replace(BASE, upstream=upstream.base_url, **SHORT)
        with serving(settings) as server, connect(server.port, timeout=20) as client:
            head, body = _chat(
                {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            )
            send_all(client, head + body)
            data, closed = read_until_close(client)
            assert closed and statuses(data) == [200]
            assert b"data: [DONE]" in data
            text = b"".join(
                orjson.loads(line[6:])["choices"][0]["delta"].get("content", "").encode()
                for line in data.split(b"\n")
                if line.startswith(b"data: {") and b'"choices":[{' in line
            )
            assert text == b"one two three four five six"
            for reason in ("header_timeout", "body_timeout", "write_timeout"):
                assert server.refused(reason) == 0, reason


def test_a_slow_authenticated_upload_that_keeps_progressing_is_not_cut() -> None:
    with ScriptedUpstream() as upstream:
        upstream.push(completion(content="done"))
        settings = replace(BASE, upstream=upstream.base_url, api_keys=("k",), **SHORT)
        message = "a slow upload " * 8
        head, body = _chat(
            {"model": "m", "messages": [{"role": "user", "content": message}]},
            b"authorization: Bearer k",
        )
        with serving(settings) as server, connect(server.port, timeout=20) as client:
            send_all(client, head)
            pieces = [body[start : start + 16] for start in range(0, len(body), 16)]
            assert len(pieces) * 0.15 > 3 * 0.4  # longer in all than three body deadlines
            for piece in pieces:
                time.sleep(0.15)  # each gap shorter than the body deadline: progress
                send_all(client, piece)
            data, closed = read_until_close(client)
            assert closed and statuses(data) == [200] and b"done" in data
            assert server.refused("body_timeout") == 0
        assert upstream.chat_requests[0]["messages"][0]["content"] == message


class _Unread:
    """An app that never takes the body (as if still deciding who the client is)."""

    settings = replace(BASE, body_timeout=0.5, header_timeout=0.5)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        disconnected = scope["extensions"]["repairproxy:disconnect"]
        gone = disconnected["loop"].create_future()
        disconnected["watch"](lambda: gone.set_result(None))
        await gone


@contextmanager
def _unread_server() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_Unread(), http=LimitedProtocol, loop="asyncio", log_level="critical")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert _wait_for(lambda: server.started, 10)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def test_before_the_app_takes_a_body_its_deadline_counts_from_the_head() -> None:
    with _unread_server() as port, connect(port, timeout=20) as client:
        send_all(client, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n")
        answer = b""
        sent = 0
        for _ in range(40):  # a byte every 0.1 s (progress) for up to 4 s, 8 deadlines
            time.sleep(0.1)
            try:
                client.sendall(b"x")
                sent += 1
            except OSError:
                break
            client.setblocking(False)
            try:
                answer += client.recv(4096)
            except BlockingIOError:
                pass
            finally:
                client.setblocking(True)
            if answer:
                break
        data, closed = read_until_close(client)
    assert statuses(answer + data) == [408] and closed
    assert sent < 20, "the deadline moved with the bytes the app never took"
