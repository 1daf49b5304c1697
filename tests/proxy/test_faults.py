"""The fault matrix: every way an upstream can fail, through the real proxy on loopback.

Each case ends in an OpenAI-shaped error (``{"error": {"message", "type", "code", ...}}``) or in
the upstream's own answer, unchanged; a stream that already started is either cut (the client
sees an incomplete body) or ends with one in-band OpenAI-shaped error; and the same process
answers the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import orjson
import pytest

from repairproxy.settings import Settings
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.servers import COMPLETION, SSE_EVENTS, raw_server, reset
from tests.support.tools import ORDER_TOOL

Play = Callable[[asyncio.StreamWriter, bytes], Awaitable[None]]
_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [ORDER_TOOL]}
_STREAM = {**_CHAT, "stream": True}


@dataclass
class Faulty:
    """A proxy before a raw upstream that plays ``script`` to chat requests, one per request."""

    proxy: RunningProxy
    script: deque[Play] = field(default_factory=deque)


async def _good(writer: asyncio.StreamWriter, request: bytes) -> None:
    body = orjson.dumps(COMPLETION)
    wants_stream = b'"stream":true' in request.replace(b" ", b"")
    if wants_stream:
        events = b"".join(SSE_EVENTS)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(events), events)
        )
    else:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )


@pytest.fixture
def faulty() -> Iterator[Faulty]:
    script: deque[Play] = deque()

    async def handler(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
        play = script.popleft() if script and b"/chat/completions" in request[:200] else _good
        await play(writer, request)

    with (
        raw_server(handler) as url,  # type: ignore[arg-type]
        running_proxy(Settings(upstream=url + "/v1", repair="off", upstream_timeout=1.0)) as proxy,
    ):
        yield Faulty(proxy, script)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    complete: bool  # the body's framing ended properly (else the client saw it cut)

    def json(self) -> dict[str, object]:
        parsed = orjson.loads(self.body)
        assert isinstance(parsed, dict)
        return parsed


def _send(proxy: RunningProxy, path: str, body: dict[str, object] | None) -> Answer:
    """One request on a raw socket: what a client gets, including a cut body."""
    payload = orjson.dumps(body) if body is not None else b""
    method = b"POST" if body is not None else b"GET"
    request = (
        b"%s %s HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s"
        % (method, path.encode(), len(payload), payload)
    )
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        try:
            while chunk := sock.recv(1 << 20):
                data += chunk
        except ConnectionError:
            pass
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if headers.get(b"transfer-encoding") != b"chunked":
        length = int(headers.get(b"content-length", b"-1"))
        return Answer(status, headers, rest, length < 0 or len(rest) == length)
    body_parts: list[bytes] = []
    while True:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            return Answer(status, headers, b"".join(body_parts), False)
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return Answer(status, headers, b"".join(body_parts), True)
        if len(rest) < size + 2:
            body_parts.append(rest[:size])
            return Answer(status, headers, b"".join(body_parts), False)
        body_parts.append(rest[:size])
        rest = rest[size + 2 :]


def _openai_error(answer: Answer, status: int, code: str | None = None) -> None:
    assert answer.status == status, answer.body[:300]
    error = answer.json()["error"]
    assert isinstance(error, dict)
    assert {"message", "type", "code"} <= set(error)
    if code is not None:
        assert error["code"] == code


def _stream_ended_honestly(answer: Answer, code: str) -> None:
    """A stream the upstream broke: cut for the client, or closed by one in-band OpenAI error."""
    if answer.status != 200:
        _openai_error(answer, answer.status, code)
        return
    data = [
        line[6:] for line in answer.body.split(b"\n") if line.startswith(b"data: ")
    ]  # fmt: skip
    assert data.count(b"[DONE]") <= 1
    if answer.complete:
        assert data[-1] == b"[DONE]"
        assert orjson.loads(data[-2])["error"]["code"] == code


def _next_request_works(faulty: Faulty) -> None:
    assert _send(faulty.proxy, "/v1/chat/completions", _CHAT).json() == COMPLETION


# -- connection-level faults -----------------------------------------------------------------------


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_upstream_refused_is_a_502() -> None:
    settings = Settings(upstream=f"http://127.0.0.1:{_unused_port()}/v1", repair="off")
    with running_proxy(settings) as proxy:
        for body in (_CHAT, _STREAM):
            _openai_error(_send(proxy, "/v1/chat/completions", body), 502, "upstream_unavailable")
        _openai_error(_send(proxy, "/v1/models", None), 502, "upstream_unavailable")


def test_connect_timeout_is_a_504() -> None:
    # A listener that never accepts, its backlog full: the next SYN gets no answer.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        settings = Settings(
            upstream=f"http://127.0.0.1:{port}/v1", repair="off", upstream_timeout=0.5
        )
        try:
            with running_proxy(settings) as proxy:
                _openai_error(_send(proxy, "/v1/chat/completions", _CHAT), 504, "upstream_timeout")
        finally:
            for filler in fillers:
                filler.close()


def test_read_timeout_before_the_head_is_a_504(faulty: Faulty) -> None:
    async def silent(writer: asyncio.StreamWriter, request: bytes) -> None:
        await asyncio.sleep(1.5)

    faulty.script.extend([silent, silent])
    for body in (_CHAT, _STREAM):
        answer = _send(faulty.proxy, "/v1/chat/completions", body)
        _openai_error(answer, 504, "upstream_timeout")
    _next_request_works(faulty)


def test_timeout_between_sse_events(faulty: Faulty) -> None:
    async def stalls(writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for event in SSE_EVENTS[:3]:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(1.5)

    faulty.script.extend([stalls, stalls])
    _stream_ended_honestly(_send(faulty.proxy, "/v1/chat/completions", _STREAM), "upstream_timeout")
    no_tools = {"model": "m", "messages": [], "stream": True}
    answer = _send(faulty.proxy, "/v1/chat/completions", no_tools)
    _stream_ended_honestly(answer, "upstream_timeout")
    assert answer.body.startswith(SSE_EVENTS[0])  # what had come was relayed at once
    _next_request_works(faulty)


# -- answers the upstream chose -------------------------------------------------------------------


def _status(status: int, body: bytes, *extra: bytes) -> Play:
    async def play(writer: asyncio.StreamWriter, request: bytes) -> None:
        lines = b"".join(line + b"\r\n" for line in extra)
        writer.write(
            b"HTTP/1.1 %d Whatever\r\ncontent-type: application/json\r\n%s"
            b"content-length: %d\r\n\r\n%s" % (status, lines, len(body), body)
        )

    return play


@pytest.mark.parametrize("status", [500, 502, 503])
def test_upstream_5xx_passes_through_unchanged(faulty: Faulty, status: int) -> None:
    error = orjson.dumps({"error": {"message": "engine dead", "type": "server_error"}})
    faulty.script.extend([_status(status, error), _status(status, error)])
    for body in (_CHAT, _STREAM):
        answer = _send(faulty.proxy, "/v1/chat/completions", body)
        assert (answer.status, answer.body) == (status, error)
    _next_request_works(faulty)


def test_429_with_retry_after_passes_through(faulty: Faulty) -> None:
    error = orjson.dumps({"error": {"message": "slow down", "type": "rate_limit_exceeded"}})
    faulty.script.extend([_status(429, error, b"retry-after: 17")] * 2)
    for body in (_CHAT, _STREAM):
        answer = _send(faulty.proxy, "/v1/chat/completions", body)
        assert (answer.status, answer.body) == (429, error)
        assert answer.headers[b"retry-after"] == b"17"
    _next_request_works(faulty)


def _reset_after(payload: bytes, content_type: bytes) -> Play:
    async def play(writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (content_type, len(payload) * 2, payload)
        )
        await writer.drain()
        await asyncio.sleep(0.02)
        reset(writer)

    return play


def test_reset_mid_body_is_a_502(faulty: Faulty) -> None:
    faulty.script.append(_reset_after(orjson.dumps(COMPLETION)[:80], b"application/json"))
    answer = _send(faulty.proxy, "/v1/chat/completions", _CHAT)
    _openai_error(answer, 502, "upstream_unavailable")
    _next_request_works(faulty)


@pytest.mark.parametrize("tools", [True, False])
def test_reset_mid_stream(faulty: Faulty, tools: bool) -> None:
    faulty.script.append(_reset_after(b"".join(SSE_EVENTS[:3]), b"text/event-stream"))
    body = _STREAM if tools else {"model": "m", "messages": [], "stream": True}
    _stream_ended_honestly(
        _send(faulty.proxy, "/v1/chat/completions", body), "upstream_unavailable"
    )
    _next_request_works(faulty)


@pytest.mark.parametrize(
    "garbage",
    [
        b"data: {broken\n\n",
        b"random line\n\n: comment\n\nevent: odd\ndata: {}\n\n",
        pytest.param(
            b"data: " + orjson.dumps({"choices": [{"delta": {"tool_calls": "x"}}]}) + b"\n\n",
        ),
        pytest.param(b"data: " + orjson.dumps({"choices": 7}) + b"\n\n"),
    ],
    ids=["broken-json", "no-data", "tool-calls-not-a-list", "choices-not-a-list"],
)
def test_malformed_sse(faulty: Faulty, garbage: bytes) -> None:
    async def play(writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(garbage), garbage)
        )

    faulty.script.extend([play, play])
    for body in (_STREAM, {"model": "m", "messages": [], "stream": True}):
        answer = _send(faulty.proxy, "/v1/chat/completions", body)
        assert answer.status in (200, 502), answer.body[:200]
        if answer.status == 502:
            _openai_error(answer, 502)
    _next_request_works(faulty)


@pytest.mark.parametrize(
    "payload",
    [b'{"object": "list", "data": []}', b"[1, 2, 3]", b"<html>maintenance</html>", b""],
    ids=["other-json", "json-array", "html", "empty"],
)
def test_a_200_that_is_not_a_chat_completion_is_a_502_naming_the_upstream(
    faulty: Faulty, payload: bytes
) -> None:
    faulty.script.append(_status(200, payload))
    answer = _send(faulty.proxy, "/v1/chat/completions", _CHAT)
    _openai_error(answer, 502)
    assert "upstream" in str(answer.json()["error"]["message"]).lower()  # type: ignore[index]
    _next_request_works(faulty)


def test_a_giant_answer_is_delivered_whole(faulty: Faulty) -> None:
    giant = dict(COMPLETION)
    giant["choices"] = [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "x" * (24 << 20)},
            "finish_reason": "length",
        }
    ]
    payload = orjson.dumps(giant)
    faulty.script.append(_status(200, payload))
    answer = _send(faulty.proxy, "/v1/chat/completions", _CHAT)
    assert answer.status == 200 and answer.complete
    assert len(answer.body) == len(payload)
    _next_request_works(faulty)
