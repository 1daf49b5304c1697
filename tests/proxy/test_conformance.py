"""Conformance: what a client receives through the proxy equals what it receives directly.

Four kinds of real servers on loopback answer the same small API (``tests/support/servers.py``):
uvicorn, aiohttp, ``http.server`` speaking HTTP/1.1 and HTTP/1.0 (bodies ending at the close).
Each question is asked directly, through the upstream pool alone, and through the proxy (repair
off, pass-through and chat routes). A raw-socket server then plays the odd cases: interim 1xx,
close-delimited and truncated bodies, trailers, a slow trickle, resets mid-body and mid-stream,
malformed SSE, and a 100 MB body.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass

import httpx
import orjson
import pytest

from repairproxy.settings import Settings
from repairproxy.upstream.http1 import ConnectionPool
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.servers import (
    COMPLETION,
    SSE_EVENTS,
    aiohttp_server,
    raw_server,
    reset,
    stdlib_server,
    uvicorn_server,
)
from tests.support.tools import ORDER_TOOL

_KINDS: dict[str, Callable[[], AbstractContextManager[str]]] = {
    "uvicorn": uvicorn_server,
    "aiohttp": aiohttp_server,
    "http.server-1.1": lambda: stdlib_server("1.1"),
    "http.server-1.0": lambda: stdlib_server("1.0"),
}
_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [ORDER_TOOL]}


@dataclass(frozen=True)
class Case:
    method: str
    target: str
    body: bytes = b""
    sse: bool = False  # compare the data events, not the bytes (the proxy adds a comment)


CASES = {
    "models": Case("GET", "/v1/models"),
    "echo-query": Case("POST", "/v1/echo?x=1&y=%2F", b'{"hello": "world"}'),
    "sse-passthrough": Case("GET", "/v1/sse"),
    "blob": Case("GET", "/v1/blob?size=300000"),
    "rate-limited": Case("GET", "/v1/ratelimited"),
    "chat": Case("POST", "/v1/chat/completions", orjson.dumps(_CHAT)),
    "chat-stream": Case(
        "POST", "/v1/chat/completions", orjson.dumps({**_CHAT, "stream": True}), sse=True
    ),
}
_COMPARED_HEADERS = ("content-type", "retry-after", "cache-control")


@dataclass(frozen=True)
class Seen:
    status: int
    headers: dict[str, str]
    body: bytes


def _data_events(body: bytes) -> list[bytes]:
    return [
        line[len(b"data: ") :]
        for line in body.replace(b"\r\n", b"\n").split(b"\n")
        if line.startswith(b"data: ")
    ]


def _fetch(client: httpx.Client, base: str, case: Case) -> Seen:
    response = client.request(case.method, base + case.target, content=case.body)
    headers = {k: response.headers[k] for k in _COMPARED_HEADERS if k in response.headers}
    return Seen(response.status_code, headers, response.content)


def _assert_same(direct: Seen, other: Seen, case: Case) -> None:
    assert other.status == direct.status
    assert other.headers == direct.headers
    if case.sse:
        assert _data_events(other.body) == _data_events(direct.body)
        assert _data_events(other.body).count(b"[DONE]") == 1
    elif direct.headers.get("content-type") == "application/json":
        assert orjson.loads(other.body) == orjson.loads(direct.body)
    else:
        assert other.body == direct.body


@pytest.fixture(scope="module", params=list(_KINDS))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, RunningProxy]]:
    """One server of each kind with a proxy before it (repair off: answers pass unchanged)."""
    with (
        _KINDS[request.param]() as url,
        running_proxy(Settings(upstream=url + "/v1", repair="off")) as proxy,
    ):
        yield url, proxy


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=30) as http:
        yield http


@pytest.mark.parametrize("name", list(CASES))
def test_through_the_proxy_equals_direct(
    served: tuple[str, RunningProxy], client: httpx.Client, name: str
) -> None:
    url, proxy = served
    case = CASES[name]
    direct = _fetch(client, url, case)
    assert direct.status in (200, 429)
    for _ in range(2):  # twice: the second rides a pooled (or, for HTTP/1.0, a new) connection
        _assert_same(direct, _fetch(client, proxy.root_url, case), case)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.anyio
async def test_the_pool_alone_equals_direct(
    served: tuple[str, RunningProxy], client: httpx.Client, name: str
) -> None:
    url, _ = served
    case = CASES[name]
    direct = await asyncio.to_thread(_fetch, client, url, case)
    pool = ConnectionPool(url)
    try:
        for _ in range(2):
            response = await pool.request(case.method, case.target, [], case.body)
            body = await response.read()
            headers = {
                key.decode(): value.decode()
                for key, value in response.headers
                if key.decode() in _COMPARED_HEADERS
            }
            _assert_same(direct, Seen(response.status_code, headers, body), case)
    finally:
        await pool.aclose()


def test_head_keeps_its_content_length_directly_and_in_the_pool(
    served: tuple[str, RunningProxy], client: httpx.Client
) -> None:
    url, _ = served
    direct = client.head(url + "/v1/models")
    assert direct.status_code == 200 and int(direct.headers["content-length"]) > 0

    async def pooled() -> bytes | None:
        pool = ConnectionPool(url)
        response = await pool.request("HEAD", "/v1/models", [])
        assert await response.read() == b""
        await pool.aclose()
        return response.header(b"content-length")

    assert asyncio.run(pooled()) == direct.headers["content-length"].encode()


def test_head_through_the_proxy_keeps_content_length(
    served: tuple[str, RunningProxy], client: httpx.Client
) -> None:
    url, proxy = served
    direct = client.head(url + "/v1/models")
    proxied = client.head(proxy.root_url + "/v1/models")
    assert proxied.headers.get("content-length") == direct.headers["content-length"]


# -- the odd cases, on a raw socket ---------------------------------------------------------------


def _ok(body: bytes, *head: bytes) -> bytes:
    lines = b"".join(line + b"\r\n" for line in head)
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), lines, body)


def _json_ok(body: bytes) -> bytes:
    return _ok(body, b"content-type: application/json")


def _body_of(request: bytes) -> bytes:
    return request.partition(b"\r\n\r\n")[2]


@contextlib.contextmanager
def _proxied_raw(handler: Callable[..., object], **settings: object) -> Iterator[RunningProxy]:
    with (
        raw_server(handler) as url,  # type: ignore[arg-type]
        running_proxy(Settings(upstream=url + "/v1", repair="off", **settings)) as proxy,  # type: ignore[arg-type]
    ):
        yield proxy


def _alive(proxy: RunningProxy) -> None:
    assert httpx.get(proxy.root_url + "/healthz", trust_env=False).status_code == 200


def test_interim_100_continue_never_gives_a_client_someone_elses_answer() -> None:
    seen_expect: list[bytes] = []

    async def continue_first(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
        if b"\r\nexpect:" in request.lower():
            seen_expect.append(request)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.002)
        writer.write(_json_ok(orjson.dumps({"tag": _body_of(request).decode()})))

    with _proxied_raw(continue_first) as proxy, httpx.Client(trust_env=False) as http:
        url = proxy.root_url + "/v1/tagged"
        for index in range(5):  # sequential: each rides the pooled connection of the one before
            tag = f"client-{index}"
            answer = http.post(url, content=tag, headers={"expect": "100-continue"})
            assert answer.json() == {"tag": tag}

        def one(index: int) -> str:
            tag = f"concurrent-{index}"
            with httpx.Client(trust_env=False) as own:
                got = own.post(url, content=tag, headers={"expect": "100-continue"}).json()
            return str(got["tag"]) if got["tag"] == tag else f"WRONG {got} for {tag}"

        with ThreadPoolExecutor(8) as workers:
            tags = list(workers.map(one, range(24)))
        assert tags == [f"concurrent-{index}" for index in range(24)]
    assert seen_expect == []


def _close_delimited(payload: bytes, content_type: bytes) -> Callable[..., object]:
    async def handler(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + content_type + b"\r\n\r\n")
        for start in range(0, len(payload), 97):  # in pieces: the end is only the close
            writer.write(payload[start : start + 97])
            await writer.drain()
        writer.close()

    return handler


def test_close_delimited_bodies_are_read_to_the_close() -> None:
    completion = orjson.dumps(COMPLETION)
    with (
        _proxied_raw(_close_delimited(completion, b"application/json")) as proxy,
        httpx.Client(trust_env=False) as http,
    ):
        for _ in range(2):
            chat = http.post(proxy.base_url + "/chat/completions", json=_CHAT)
            assert chat.status_code == 200 and chat.json() == COMPLETION
            other = http.get(proxy.base_url + "/files")
            assert other.status_code == 200 and other.content == completion
    stream = b"".join(SSE_EVENTS)
    with (
        _proxied_raw(_close_delimited(stream, b"text/event-stream")) as proxy,
        httpx.Client(trust_env=False) as http,
    ):
        for body in ({**_CHAT, "stream": True}, {"model": "m", "messages": [], "stream": True}):
            chat = http.post(proxy.base_url + "/chat/completions", json=body)
            assert chat.status_code == 200
            assert _data_events(chat.content) == _data_events(stream)


_TRUNCATED = {
    "content-length": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"content-length: 500\r\n\r\n" + orjson.dumps(COMPLETION)[:100],
    "chunked": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"transfer-encoding: chunked\r\n\r\n64\r\n" + orjson.dumps(COMPLETION)[:100] + b"\r\n",
}


@pytest.mark.parametrize("framing", list(_TRUNCATED))
@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_truncated_chat_answer_is_a_502_never_a_short_200(framing: str, how: str) -> None:
    async def truncate(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(_TRUNCATED[framing])
        await writer.drain()
        await asyncio.sleep(0.01)
        reset(writer) if how == "reset" else writer.close()

    with _proxied_raw(truncate) as proxy, httpx.Client(trust_env=False) as http:
        answer = http.post(proxy.base_url + "/chat/completions", json=_CHAT)
        assert answer.status_code == 502
        assert answer.json()["error"]["code"] == "upstream_unavailable"
        _alive(proxy)


def _raw_exchange(port: int, request: bytes) -> tuple[bytes, bytes, bool]:
    """Send ``request``; return (head, de-chunked body, whether the body ended properly)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(65536):
                data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n")
             if line.lower().startswith(b"content-length:")),
            None,
        )  # fmt: skip
        return head, rest, length is None or len(rest) == length
    body = b""
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return head, body, True
        if len(rest) < size + 2:
            return head, body + rest[:size], False
        body, rest = body + rest[:size], rest[size + 2 :]
    return head, body, False


@pytest.mark.parametrize("path", ["/v1/files", "/v1/chat/completions"])
def test_a_body_cut_mid_way_reaches_the_client_cut_not_completed(path: str) -> None:
    sse = b"".join(SSE_EVENTS[:3])

    async def cut(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(sse), sse)
        )
        await writer.drain()
        await asyncio.sleep(0.05)
        reset(writer)

    body = orjson.dumps({"model": "m", "messages": [], "stream": True})
    with _proxied_raw(cut) as proxy:
        request = (
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (path.encode(), len(body), body)
        )
        head, received, complete = _raw_exchange(proxy.port, request)
        assert head.startswith(b"HTTP/1.1 200")
        assert received.startswith(sse[:50])
        assert b"[DONE]" not in received and b'"error"' not in received
        assert not complete
        _alive(proxy)


def test_trailers_and_a_slow_trickle_pass_through() -> None:
    pieces = [b"piece-%d;" % i for i in range(8)]

    async def trickle(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n"
            b"trailer: x-digest\r\n\r\n"
        )
        for piece in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\nx-digest: abc\r\n\r\n")

    # A read timeout shorter than the whole answer but longer than each gap: no 504.
    with (
        _proxied_raw(trickle, upstream_timeout=0.5) as proxy,
        httpx.Client(trust_env=False) as http,
    ):
        for _ in range(2):
            started = time.perf_counter()
            with http.stream("GET", proxy.base_url + "/files") as response:
                assert response.status_code == 200
                stream = response.iter_raw()
                first = next(stream)
                first_after = time.perf_counter() - started
                rest = b"".join(stream)
            assert first + rest == b"".join(pieces)
            assert first_after < 0.3  # streamed as it came, not buffered to the end (0.4 s)
            assert "x-digest" not in response.headers


def test_malformed_sse_never_crashes_the_proxy() -> None:
    garbage = (
        b"data: {not json\n\n"
        b": a comment\n\nevent: odd\ndata: {}\n\n"
        b"no colon line\n\n"
        b"data: " + orjson.dumps({"choices": "not a list"}) + b"\n\n"
        b"data: "
        + orjson.dumps({"choices": [{"delta": {"tool_calls": [{"index": "x"}]}}]})
        + b"\r\n\r\n"
        b"data: [DONE]\n\n"
    )

    async def malformed(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(_ok(garbage, b"content-type: text/event-stream"))

    with _proxied_raw(malformed) as proxy, httpx.Client(trust_env=False) as http:
        for body in ({**_CHAT, "stream": True}, {"model": "m", "messages": [], "stream": True}):
            answer = http.post(proxy.base_url + "/chat/completions", json=body)
            assert answer.status_code in (200, 502)
            if answer.status_code == 502:
                assert answer.json()["error"]["type"] == "upstream_error"
            else:
                assert _data_events(answer.content).count(b"[DONE]") <= 1
        _alive(proxy)


_HUNDRED_MB = 100 * 1024 * 1024


def test_a_100_mb_body_streams_through_in_bounded_memory() -> None:
    block = bytes(range(256)) * 4096  # 1 MiB

    async def huge(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
            b"content-length: %d\r\n\r\n" % _HUNDRED_MB
        )
        for _ in range(_HUNDRED_MB // len(block)):
            writer.write(block)
            await writer.drain()

    with _proxied_raw(huge) as proxy, httpx.Client(trust_env=False, timeout=60) as http:
        received = 0
        with http.stream("GET", proxy.base_url + "/files/big") as response:
            assert response.status_code == 200
            assert response.headers.get("content-length") in (None, str(_HUNDRED_MB))
            for chunk in response.iter_raw(1 << 20):
                received += len(chunk)
        assert received == _HUNDRED_MB
        _alive(proxy)


def test_the_pool_reads_a_100_mb_body_without_buffering_it() -> None:
    block = bytes(range(256)) * 4096

    async def huge(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % _HUNDRED_MB)
        for _ in range(_HUNDRED_MB // len(block)):
            writer.write(block)
            await writer.drain()

    async def read_all(url: str) -> tuple[int, int]:
        pool = ConnectionPool(url)
        response = await pool.request("GET", "/big", [])
        received, largest = 0, 0
        async for chunk in response.iter_body():
            received += len(chunk)
            largest = max(largest, len(chunk))
        await pool.aclose()
        return received, largest

    with raw_server(huge) as url:  # type: ignore[arg-type]
        received, largest = asyncio.run(read_all(url))
    assert received == _HUNDRED_MB
    assert largest <= 4 << 20  # chunks as the socket gave them, never the whole body


_FAULTS = [
    b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\ntruncated",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhal",
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokSTRAY BYTES",
    b"HTTP/1.1 999 Nonsense\r\nbad header line\r\n\r\n",
    b"not http at all\r\n\r\n",
]


def test_after_each_fault_the_one_pooled_slot_serves_the_next_client() -> None:
    """One upstream connection allowed: a fault that leaked it would hang every later request."""
    served = 0

    async def alternate(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
        nonlocal served
        served += 1
        body = _body_of(request)
        if body.startswith(b"fault-"):
            writer.write(_FAULTS[int(body[6:])])
            await writer.drain()
            writer.close()
        else:
            writer.write(_json_ok(orjson.dumps({"tag": body.decode()})))

    with (
        _proxied_raw(alternate, max_connections=1, upstream_timeout=5) as proxy,
        httpx.Client(trust_env=False, timeout=10) as http,
    ):
        for index in range(len(_FAULTS)):
            try:
                faulty = http.post(proxy.base_url + "/files", content=b"fault-%d" % index)
                assert faulty.status_code in (200, 502)  # "ok" + stray bytes is a 200
            except httpx.RemoteProtocolError:
                pass  # the body was cut after it started: the client sees it cut, as it should
            good = http.post(proxy.base_url + "/files", content=b"good-%d" % index)
            assert good.status_code == 200 and good.json() == {"tag": f"good-{index}"}
    assert served == 2 * len(_FAULTS)
