"""The server's response cycle (``repairproxy.server._Cycle``) against uvicorn's own, message for
message: the same ASGI messages must write the same bytes, raise the same errors and leave the
connection in the same state; the same writes made through the response extension (no message
dicts) must too; the scope's path and query must be what uvicorn's parse gives; and the real
server must use the cycle for every request."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    RequestResponseCycle,
)

from repairproxy.server import LimitedProtocol, _Cycle, bad_header_name, bad_header_value


class _Transport:
    """Records what a cycle writes and whether it closed the connection."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


class _Protocol:
    """What ``_Cycle`` reads from its connection's protocol."""

    def __init__(self, transport: _Transport, default_headers: list[tuple[bytes, bytes]]) -> None:
        self.transport = transport
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        self.loop = asyncio.get_running_loop()
        self.logger = logging.getLogger("test")
        self.access_logger = logging.getLogger("test.access")
        self.access_log = False
        self.server_state = SimpleNamespace(default_headers=default_headers)
        self.responses = 0

    def on_response_complete(self) -> None:
        self.responses += 1


def _run(
    cls: type,
    messages: list[dict[str, Any]],
    *,
    writer: str = "",
    method: str = "GET",
    keep_alive: bool = True,
    default_headers: list[tuple[bytes, bytes]] | None = None,
) -> tuple[bytes, bool, bool, bool, str | None, int]:
    async def go() -> tuple[bytes, bool, bool, bool, str | None, int]:
        transport = _Transport()
        responses: list[int] = []
        scope = {"type": "http", "method": method, "http_version": "1.1"}
        cycle: Any
        if cls is _Cycle:
            protocol = _Protocol(transport, default_headers or [])
            cycle = _Cycle(
                protocol,  # type: ignore[arg-type]
                scope,
                keep_alive=keep_alive,
                expect_100_continue=False,
            )
        else:
            cycle = cls(
                scope=scope,
                transport=transport,
                flow=FlowControl(transport),  # type: ignore[arg-type]
                logger=logging.getLogger("test"),
                access_logger=logging.getLogger("test.access"),
                access_log=False,
                default_headers=default_headers or [],
                message_event=asyncio.Event(),
                expect_100_continue=False,
                keep_alive=keep_alive,
                on_response=lambda: responses.append(1),
            )
        # The request was read whole (the parser's end of message): an answer given before that
        # closes the connection, which only ours does (tests/proxy/test_front_door.py).
        cycle.more_body = False
        error = None
        try:
            if writer == "calls":  # RESPONSE_EXTENSION: the same writes as plain calls
                for message in messages:
                    if message["type"] == "http.response.start":
                        cycle.start(message["status"], message["headers"])
                    else:
                        cycle.body(message["body"], message["more_body"])
            elif writer == "whole":
                start, body = messages
                cycle.whole(start["status"], start["headers"], body["body"])
            else:
                for message in messages:
                    await cycle.send(message)
        except (RuntimeError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(0)  # a head held for the body goes out at the iteration's end
        count = protocol.responses if cls is _Cycle else len(responses)
        # Ours writes the head with the body in one write: compare the bytes, not the writes.
        return (
            b"".join(transport.writes),
            transport.closed,
            cycle.keep_alive,
            cycle.response_complete,
            error,
            count,
        )

    return asyncio.run(go())


def _start(status: int, headers: Any) -> dict[str, Any]:
    return {"type": "http.response.start", "status": status, "headers": headers}


def _body(body: bytes = b"", more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": body, "more_body": more}


_MANY = [(f"x-repairproxy-h{i}".encode(), f"value {i}, ok".encode()) for i in range(20)]
CASES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "json": ([_start(200, [(b"content-length", b"2"), *_MANY]), _body(b"{}")], {}),
    "stream": (
        [_start(200, [(b"content-type", b"text/event-stream")]), _body(b"a", True), _body()],
        {},
    ),
    "stream, empty chunk in the middle": (
        [_start(200, []), _body(b"a", True), _body(b"", True), _body(b"b")],
        {},
    ),
    "explicit chunked": (
        [_start(200, [(b"Transfer-Encoding", b"Chunked")]), _body(b"abc")],
        {},
    ),
    "head": ([_start(200, [(b"content-length", b"10")]), _body(b"")], {"method": "HEAD"}),
    "204": ([_start(204, []), _body()], {}),
    "upper-case names": (
        [_start(200, [(b"Content-Length", b"1"), (b"X-A", b"B")]), _body(b"x")],
        {},
    ),
    "connection close": (
        [_start(200, [(b"content-length", b"0"), (b"connection", b"keep-alive, Close")]), _body()],
        {},
    ),
    "http/1.0": ([_start(200, [(b"content-length", b"0")]), _body()], {"keep_alive": False}),
    "default headers": (
        [_start(200, [(b"content-length", b"0")]), _body()],
        {"default_headers": [(b"server", b"uvicorn")]},
    ),
    "headers as a tuple": ([_start(200, ((b"content-length", b"1"),)), _body(b"x")], {}),
    "bad name": ([_start(200, [(b"x-ok", b"1"), (b"bad name", b"1")])], {}),
    "bad name characters": ([_start(200, [(b"x(y)", b"1")])], {}),
    "bad value": ([_start(200, [(b"x-ok", b"1"), (b"x-b", b"a\r\nset-cookie: x")])], {}),
    "nul in value": ([_start(200, [(b"x-b", b"a\x00")])], {}),
    "tab in value is allowed": (
        [_start(200, [(b"content-length", b"0"), (b"x", b"a\tb")]), _body()],
        {},
    ),
    "longer than content-length": ([_start(200, [(b"content-length", b"1")]), _body(b"xy")], {}),
    "shorter than content-length": ([_start(200, [(b"content-length", b"3")]), _body(b"xy")], {}),
    "body first": ([_body(b"x")], {}),
    "start twice": ([_start(200, []), _start(200, [])], {}),
    "after the end": ([_start(200, [(b"content-length", b"0")]), _body(), _body()], {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_cycle_writes_and_raises_what_uvicorns_does(case: str) -> None:
    messages, options = CASES[case]
    ours, theirs = (
        _run(_Cycle, messages, **options),
        _run(RequestResponseCycle, messages, **options),
    )
    writes, closed, keep_alive, complete, error, responses = ours
    assert writes == theirs[0]
    assert (closed, keep_alive, complete, responses) == (*theirs[1:4], theirs[5])
    # Which of two bad headers is named first may differ; that one is refused may not.
    assert (error is None) == (theirs[4] is None)
    if error is not None and theirs[4] is not None:
        assert error.split(" ")[0:3] == theirs[4].split(" ")[0:3]


@pytest.mark.parametrize("case", list(CASES))
def test_the_response_extension_writes_and_raises_what_send_does(case: str) -> None:
    messages, options = CASES[case]
    expected = _run(_Cycle, messages, **options)
    assert _run(_Cycle, messages, writer="calls", **options) == expected
    whole = (
        len(messages) == 2
        and messages[0]["type"] == "http.response.start"
        and messages[1]["type"] == "http.response.body"
        and not messages[1]["more_body"]
    )
    if whole:  # a start and a last body: one whole() call
        assert _run(_Cycle, messages, writer="whole", **options) == expected


def test_the_cases_cover_each_outcome() -> None:
    """The table above is not vacuous: some cases raise, some close, some chunk."""
    results = {case: _run(RequestResponseCycle, m, **o) for case, (m, o) in CASES.items()}
    assert results["bad value"][4] == "RuntimeError: Invalid HTTP header value."
    assert results["bad name"][4] == "RuntimeError: Invalid HTTP header name."
    assert results["connection close"][1] is True
    assert b"transfer-encoding: chunked" in results["stream"][0]


def test_header_checks_find_what_uvicorns_expressions_find() -> None:
    """The byte-deletion checks against uvicorn's regular expressions: every byte alone, and at
    the start, middle and end of a real verdict's header names and values."""
    names = b"content-typex-repairproxy-tool-errorsx-repairproxy-repairsx-repairproxy-overhead-ms"
    values = b"application/jsonunknown_tool,schema_violation10.153"
    for byte in range(256):
        one = bytes([byte])
        for text in (one, one + names, names[:20] + one + names[20:], names + one):
            assert bad_header_name(text) == bool(HEADER_RE.search(text)), (byte, text)
        for text in (one, one + values, values[:20] + one + values[20:], values + one):
            assert bad_header_value(text) == bool(HEADER_VALUE_RE.search(text)), (byte, text)
    assert not bad_header_name(names) and not bad_header_value(values)
    assert bad_header_name(b"x-a b") and bad_header_value(b"a\r\nb") and not bad_header_value(b"\t")


def _asgi_app(headers: list[tuple[bytes, bytes]]) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


@contextmanager
def _serving(app: Any, seen: list[type], http: Any = None) -> Iterator[int]:
    class Recording(LimitedProtocol):
        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            seen.append(type(self.cycle))

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=http or Recording, loop="asyncio", lifespan="off", log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _exchange(port: int, requests: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(requests)
        chunks = []
        while chunk := client.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_the_real_server_answers_every_request_through_the_cycle() -> None:
    seen: list[type] = []
    app = _asgi_app([(b"content-length", b"2"), *_MANY])
    with _serving(app, seen) as port:
        keep = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
        answer = _exchange(
            port, keep * 2 + b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert answer.count(b"x-repairproxy-h19: value 19, ok\r\n") == 3
    assert seen == [_Cycle, _Cycle, _Cycle]


def test_an_invalid_header_from_the_app_never_reaches_the_client() -> None:
    seen: list[type] = []
    with _serving(_asgi_app([(b"x-a", b"1\r\nx-injected: 1")]), seen) as port:
        answer = _exchange(port, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert answer == b""  # as uvicorn does: the response had started, the connection closes
    assert seen == [_Cycle]


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/chat/completions",
        b"/v1/models?limit=2&after=x",
        b"/a%20b/%2e%2e?q=%41",
        b"/frag#part",
        b"//double/slash",
        b"http://example.com/absolute?x=1",
        b"/",
    ],
)
def test_the_scope_holds_what_uvicorn_parses_from_the_request_target(target: bytes) -> None:
    """The path, raw path and query as uvicorn's protocol sets them (ours skips httptools'
    URL parser for a bare path)."""
    scopes: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        scopes.append({key: scope[key] for key in ("path", "raw_path", "query_string")})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    request = b"GET %s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n" % target
    with _serving(app, []) as port:
        assert _exchange(port, request).startswith(b"HTTP/1.1 200 OK")
    with _serving(app, [], http="httptools") as port:
        assert _exchange(port, request).startswith(b"HTTP/1.1 200 OK")
    ours, uvicorns = scopes
    assert ours == uvicorns


def _ours(protocol: object) -> bool:
    """A protocol of a server ``_serving`` started (not one another test may have left)."""
    return isinstance(protocol, LimitedProtocol) and type(protocol).__name__ == "Recording"


@contextmanager
def _collector_off() -> Iterator[None]:
    """No cycle collection meanwhile: what is not freed by reference counting stays, countable."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_finished_request_is_freed_without_the_collector() -> None:
    """The scope's extensions hold the cycle and the cycle holds the scope: left as it was, every
    request became garbage only the collector frees (~11 objects a request, freed in pauses of
    milliseconds under load). Once the app returns, that loop is broken: with the collector off,
    the requests answered are gone, all but the last one the connection still holds."""
    seen: list[type] = []
    requests = 5
    with _collector_off(), _serving(_asgi_app([(b"content-length", b"2")]), seen) as port:
        keep = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
        answer = _exchange(
            port, keep * (requests - 1) + b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        alive = sum(type(o) is _Cycle and _ours(o._protocol) for o in gc.get_objects())
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == requests and len(seen) == requests
    assert alive <= 1


def test_a_closed_connection_is_freed_without_the_collector() -> None:
    """The protocol and its last cycle hold each other; left so, every connection (a client that
    opens one per request: every request) left ~23 objects to the collector. With the collector
    off, connections that have closed are gone."""
    seen: list[type] = []
    connections = 5
    with _collector_off(), _serving(_asgi_app([(b"content-length", b"2")]), seen) as port:
        answers = [
            _exchange(port, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            for _ in range(connections)
        ]
        deadline = time.monotonic() + 5
        while True:  # the server sees each connection's end on its own thread
            alive = sum(_ours(o) for o in gc.get_objects())
            if alive == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    assert all(answer.startswith(b"HTTP/1.1 200 OK\r\n") for answer in answers)
    assert len(seen) == connections
    assert alive == 0
