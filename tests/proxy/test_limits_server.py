"""The server layer's limits against the real uvicorn server, driven by raw loopback sockets.

Each test counts bytes the HTTP parser was fed, status codes and the refusal counter; none times
anything (the timeouts are set short so the tests end soon, and every read has a generous bound).
"""

from __future__ import annotations

import dataclasses
import io
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any

import uvicorn

from repairproxy.app import RepairProxyApp, create_app
from repairproxy.server import LimitedProtocol, server_options
from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.scripted_upstream import ScriptedUpstream, completion

BASE = Settings(upstream="http://127.0.0.1:9/v1")


class _CountingParser:
    """Wraps httptools' parser: counts the bytes fed to it (what it may hold)."""

    def __init__(self, parser: Any, fed: list[int]) -> None:
        self._parser = parser
        self._fed = fed

    def feed_data(self, data: bytes) -> None:
        self._fed.append(len(data))
        self._parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


@dataclass
class _Server:
    port: int
    app: RepairProxyApp
    fed: list[int]  # sizes of every feed_data call, all connections

    def refused(self, reason: str) -> float:
        value = self.app.metrics.registry.get_sample_value(
            "repairproxy_connections_refused_total", {"reason": reason}
        )
        return float(value or 0.0)


@contextmanager
def _serving(settings: Settings) -> Iterator[_Server]:
    fed: list[int] = []

    class Counting(LimitedProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.parser = _CountingParser(self.parser, fed)  # type: ignore[assignment]

    app = create_app(settings, log_stream=io.BytesIO())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    options = {k: v for k, v in server_options(settings).items() if k not in ("host", "port")}
    options["http"] = Counting
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield _Server(sock.getsockname()[1], app, fed)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=15)
    return client


def _send_all(client: socket.socket, data: bytes) -> None:
    """Send what the server takes; it may answer and close half way (that is the point)."""
    with suppress(BrokenPipeError, ConnectionResetError):
        client.sendall(data)


def _answer(client: socket.socket) -> bytes:
    """Everything the server sends until it closes (or the bound runs out)."""
    chunks = []
    try:
        while chunk := client.recv(65536):
            chunks.append(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    return b"".join(chunks)


def _get(port: int, path: bytes, extra: bytes = b"") -> bytes:
    with _connect(port) as client:
        _send_all(
            client, b"GET %s HTTP/1.1\r\nhost: x\r\n%sconnection: close\r\n\r\n" % (path, extra)
        )
        return _answer(client)


def test_oversized_headers_get_431_with_the_parser_fed_at_most_the_cap() -> None:
    settings = replace(BASE, max_header_bytes=16 * 1024)
    with _serving(settings) as server:
        with _connect(server.port) as client:
            _send_all(client, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (8 << 20))
            answer = _answer(client)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
        assert sum(server.fed) <= settings.max_header_bytes, sum(server.fed)
        assert server.refused("header_bytes") == 1


def test_headers_within_the_cap_and_a_large_body_pass() -> None:
    settings = replace(BASE, max_header_bytes=16 * 1024)
    with _serving(settings) as server:
        answer = _get(server.port, b"/healthz", b"x-near: " + b"a" * 15_000 + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:80]
        body = b"{" + b" " * (2 << 20) + b"}"  # the body is not header bytes: no 431
        with _connect(server.port) as client:
            _send_all(
                client,
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                b"\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body),
            )
            answer = _answer(client)
        assert not answer.startswith(b"HTTP/1.1 431"), answer[:80]
        # The whole body reached the app, which went upstream (nothing listens there: 502).
        assert answer.startswith(b"HTTP/1.1 502 ") and b"upstream_unavailable" in answer
        assert server.refused("header_bytes") == 0


def test_half_open_connections_are_refused_or_timed_out_and_healthz_answers() -> None:
    # The timeout is long next to opening 30 loopback sockets, so all 20 admitted ones are still
    # open when the last 10 arrive (a bound for the test's sake, nothing is timed).
    settings = replace(BASE, max_client_connections=20, header_timeout=3.0)
    with _serving(settings) as server:
        held = [_connect(server.port) for _ in range(30)]
        for index, client in enumerate(held):
            if index % 2:  # half of them start a request and never finish its headers
                _send_all(client, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: 1")
        answers = [_answer(client) for client in held]
        for client in held:
            client.close()
        busy = [a for a in answers if a.startswith(b"HTTP/1.1 503 ")]
        late = [a for a in answers if a.startswith(b"HTTP/1.1 408 ")]
        silent = [a for a in answers if a == b""]
        assert (len(busy), len(late) + len(silent)) == (10, 20), answers
        assert server.refused("max_connections") == 10
        assert server.refused("header_timeout") == 20
        assert _get(server.port, b"/healthz").startswith(b"HTTP/1.1 200 ")


def test_idle_keep_alive_connections_are_closed() -> None:
    settings = replace(BASE, keep_alive_timeout=0.3)
    with _serving(settings) as server, _connect(server.port) as client:
        _send_all(client, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = _answer(client)  # ends when the server closes the idle connection
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1") == 1


def _one_answer(client: socket.socket) -> bytes:
    """One /healthz answer on a connection that stays open (its body ends the read)."""
    data = b""
    while not data.endswith(b'{"status":"ok"}'):
        chunk = client.recv(65536)
        assert chunk, f"the connection closed after {data!r}"
        data += chunk
    return data


def test_a_used_keep_alive_connection_stays_open_a_whole_timeout_after_each_answer() -> None:
    # One timer per connection (armed at the first answer, re-armed from the last answer when it
    # fires): the third request comes after the first answer's deadline but within the second's.
    settings = replace(BASE, keep_alive_timeout=2.0)
    request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    with _serving(settings) as server, _connect(server.port) as client:
        answers = []
        for pause in (0.0, 1.2, 1.2):
            time.sleep(pause)
            client.sendall(request)
            answers.append(_one_answer(client))
        last = _answer(client)  # ends when the server closes the idle connection
    assert [a.startswith(b"HTTP/1.1 200 ") for a in answers] == [True, True, True]
    assert last == b""


def test_settings_come_from_flags() -> None:
    from repairproxy.settings import settings_from_args

    settings = settings_from_args(
        [
            "--max-header-bytes",
            "1000",
            "--header-timeout",
            "2",
            "--keep-alive-timeout",
            "3",
            "--max-client-connections",
            "7",
        ],
        {},
    )
    assert (
        settings.max_header_bytes,
        settings.header_timeout,
        settings.keep_alive_timeout,
        settings.max_client_connections,
    ) == (1000, 2.0, 3.0, 7)
    options = server_options(settings)
    assert options["timeout_keep_alive"] == 3.0 and options["http"] is LimitedProtocol


def test_an_answer_slower_than_the_header_timeout_is_not_cut() -> None:
    # The header timer is for a request's headers; a whole request that arrived in one read
    # must not leave it armed while the answer is being made (it cut every answer > 10 s).
    with ScriptedUpstream() as upstream:
        upstream.push(dataclasses.replace(completion(content="hi"), delay=2.5))
        settings = replace(
            BASE, upstream=upstream.base_url, header_timeout=1.0, repair=RepairMode.OFF
        )
        with _serving(settings) as server, _connect(server.port) as client:
            body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
            _send_all(
                client,
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                b"\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body),
            )
            answer = _answer(client)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
            assert server.refused("header_timeout") == 0
