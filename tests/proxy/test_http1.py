"""The upstream connection pool against real loopback servers: reuse, limits, retry, timeouts."""

from __future__ import annotations

import asyncio
import base64
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from repairproxy.upstream.http1 import ConnectionPool, InvalidTargetError, Origin, PoolTimeoutError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    if not head:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + (await reader.readexactly(length) if length else b"")


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


@asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A raw server; the list counts connections accepted (index passed to the handler)."""
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(len(accepted))
        try:
            await handler(reader, writer, accepted[-1])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        server.close()
        await server.wait_closed()


async def _echo_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    while (request := await _read_request(reader)) is not None:
        writer.write(_ok(request.split(b"\r\n", 1)[0]))
        await writer.drain()


def test_origin_parsing() -> None:
    origin = Origin.parse("https://api.example.com/openai")
    assert (origin.port, origin.base_path, origin.host_header) == (
        443,
        "/openai",
        b"api.example.com",
    )
    assert Origin.parse("http://10.0.0.1:8000/").host_header == b"10.0.0.1:8000"
    with pytest.raises(ValueError):
        Origin.parse("ftp://x")


@pytest.mark.anyio
async def test_keep_alive_reuses_one_connection_and_prefixes_the_base_path() -> None:
    async with _server(_echo_forever) as (url, accepted):
        pool = ConnectionPool(url + "/prefix")
        for _ in range(3):
            response = await pool.request("POST", "/v1/x?a=1", [(b"x-k", b"v")], b"{}")
            assert response.status_code == 200
            assert await response.read() == b"POST /prefix/v1/x?a=1 HTTP/1.1"
        await pool.aclose()
    assert len(accepted) == 1


@pytest.mark.anyio
async def test_connection_limit_is_respected() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await _read_request(reader) is not None:
            await asyncio.sleep(0.05)
            writer.write(_ok(b"ok"))

    async with _server(slow) as (url, accepted):
        pool = ConnectionPool(url, max_connections=2)

        async def one() -> bytes:
            return await (await pool.request("GET", "/", [])).read()

        assert await asyncio.gather(*(one() for _ in range(6))) == [b"ok"] * 6
        await pool.aclose()
    assert len(accepted) == 2


@pytest.mark.anyio
async def test_a_closed_idle_connection_is_retried_once_on_a_fresh_one() -> None:
    async def first_connection_dies(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        served = 0
        while await _read_request(reader) is not None:
            if index == 0 and served == 1:
                return  # hang up on the second request without a byte of answer
            writer.write(_ok(b"ok"))
            served += 1

    async with _server(first_connection_dies) as (url, accepted):
        pool = ConnectionPool(url)
        assert await (await pool.request("POST", "/", [], b"1")).read() == b"ok"
        assert await (await pool.request("POST", "/", [], b"2")).read() == b"ok"
        await pool.aclose()
    assert len(accepted) == 2


@pytest.mark.anyio
async def test_chunked_bodies_stream_dechunked() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with _server(chunked) as (url, _):
        pool = ConnectionPool(url)
        response = await pool.request("GET", "/", [])
        parts = [part async for part in response.iter_body()]
        assert b"".join(parts) == b"data: 1\n\ndata: 2\n\n"
        await pool.aclose()


@pytest.mark.anyio
async def test_chunks_that_arrived_together_are_handed_over_as_one() -> None:
    """Six chunks in one write (an SSE answer sent whole) come out as one piece, so a relay runs
    once, not six times; chunks that arrive apart still come out apart (nothing is held back)."""
    parts = [b"data: %d\n\n" % index for index in range(6)]

    async def together(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _read_request(reader)
        framed = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.01)  # the head is read first: the body's chunks come in one read
        writer.write(framed + b"0\r\n\r\n")
        await writer.drain()
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in parts[:2]:
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with _server(together) as (url, accepted):
        pool = ConnectionPool(url)
        response = await pool.request("GET", "/", [])
        pieces = [piece async for piece in response.iter_body()]
        assert pieces == [b"".join(parts)]
        response = await pool.request("GET", "/", [])
        pieces = [piece async for piece in response.iter_body()]
        assert pieces == parts[:2]
        assert accepted == [0]  # both answers on one kept-alive connection
        await pool.aclose()


@pytest.mark.anyio
async def test_read_timeout_and_refused_connection_raise() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _read_request(reader)
        await asyncio.sleep(2)

    async with _server(silent) as (url, _):
        pool = ConnectionPool(url, read_timeout=0.2)
        with pytest.raises(PoolTimeoutError):
            await pool.request("GET", "/", [])
        await pool.aclose()
    refused = ConnectionPool(url)  # the server is gone
    with pytest.raises(OSError):
        await refused.request("GET", "/", [])


@pytest.mark.anyio
async def test_a_shorter_timeout_after_a_long_wait_on_the_same_connection_holds() -> None:
    """The read timeout is one timer per connection: a wait with a shorter timeout than the one
    it was armed for (``/readyz``'s 5 s after a chat's 600 s) fires at its own deadline, and a
    reused connection's next wait is timed from its own start."""

    async def answer_then_silence(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int
    ) -> None:
        await _read_request(reader)
        writer.write(_ok(b"first"))
        await writer.drain()
        while await _read_request(reader) is not None:
            pass  # never answers again

    async with _server(answer_then_silence) as (url, accepted):
        pool = ConnectionPool(url, read_timeout=600)
        assert await (await pool.request("GET", "/", [])).read() == b"first"
        await asyncio.sleep(0.3)  # idle longer than the next wait's timeout
        with pytest.raises(PoolTimeoutError):  # not asyncio.wait_for's own TimeoutError
            await asyncio.wait_for(pool.request("GET", "/", [], timeout=0.2), 10)
        await pool.aclose()
    assert len(accepted) == 1  # the second request went on the reused connection


@pytest.mark.anyio
async def test_an_abandoned_body_drops_the_connection() -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(100):
            writer.write(b"5\r\nhello\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)

    async with _server(endless) as (url, accepted):
        pool = ConnectionPool(url)
        response = await pool.request("GET", "/", [])
        body = response.iter_body()
        assert await body.__anext__() == b"hello"
        await body.aclose()
        await response.aclose()
        again = await pool.request("GET", "/", [])
        rest = again.iter_body()
        assert await rest.__anext__() == b"hello"
        await rest.aclose()
        await again.aclose()
        await pool.aclose()
    assert len(accepted) == 2  # the half-read connection was not put back


@pytest.mark.anyio
async def test_a_failed_read_gives_the_slot_back() -> None:
    async def head_then_silence(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int
    ) -> None:
        while await _read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")
            await writer.drain()

    async with _server(head_then_silence) as (url, _):
        pool = ConnectionPool(url, max_connections=1, read_timeout=0.1)
        for _ in range(3):  # with a leaked slot, the second request would wait forever
            response = await asyncio.wait_for(pool.request("GET", "/", []), 2)
            with pytest.raises(PoolTimeoutError):
                await response.read()
        await pool.aclose()


# -- framing, 1xx, close-delimited and truncated bodies, unsafe targets, proxies -------


def _tagged(request: bytes) -> bytes:
    """The answer a tagging server gives: the request's body, so each client can check its own."""
    return request.partition(b"\r\n\r\n")[2]


@pytest.mark.anyio
async def test_interim_1xx_answers_are_skipped_and_each_client_gets_its_own_answer() -> None:
    async def continue_then_answer(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int
    ) -> None:
        while (request := await _read_request(reader)) is not None:
            # 100 and 103 in their own packets, then the answer: the worst case for a parser.
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.005)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.005)
            writer.write(_ok(_tagged(request)))
            await writer.drain()

    async with _server(continue_then_answer) as (url, accepted):
        pool = ConnectionPool(url, max_connections=1)
        for tag in (b"client-1", b"client-2", b"client-3"):
            response = await pool.request("POST", "/", [], tag)
            assert response.status_code == 200
            assert response.header(b"link") is None  # the 103's headers are not the answer's
            assert await response.read() == tag
        await pool.aclose()
    assert len(accepted) == 1


@pytest.mark.anyio
async def test_a_101_answer_is_an_error_and_the_connection_is_not_reused() -> None:
    async def switch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        while (request := await _read_request(reader)) is not None:
            if i == 0:
                writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\nxx")
            else:
                writer.write(_ok(_tagged(request)))
            await writer.drain()

    async with _server(switch) as (url, accepted):
        pool = ConnectionPool(url)
        with pytest.raises(ConnectionError):
            await pool.request("POST", "/", [], b"first")
        response = await pool.request("POST", "/", [], b"second")
        assert await response.read() == b"second"
        await pool.aclose()
    assert len(accepted) == 2


@pytest.mark.anyio
async def test_framing_headers_from_the_caller_never_reach_the_upstream() -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while (request := await _read_request(reader)) is not None:
            seen.append(request.partition(b"\r\n\r\n")[0].lower())
            writer.write(_ok(b"ok"))

    caller = [
        (b"expect", b"100-continue"),
        (b"content-length", b"999"),
        (b"transfer-encoding", b"chunked"),
        (b"connection", b"close"),
        (b"host", b"evil.example"),
        (b"te", b"trailers"),
        (b"x-kept", b"yes"),
    ]
    async with _server(record) as (url, _):
        pool = ConnectionPool(url)
        assert await (await pool.request("POST", "/", caller, b"{}")).read() == b"ok"
        await pool.aclose()
    head = seen[0]
    for name in (b"expect", b"transfer-encoding", b"connection", b"te:", b"evil"):
        assert name not in head
    assert head.count(b"content-length") == 1 and b"content-length: 2" in head
    assert b"x-kept: yes" in head


@pytest.mark.parametrize(
    "target", ["/v1/a b", "/v1/a\r\nGET /x HTTP/1.1", "/v1/caf\u00e9", "/v1/\x00", "/v1/\x7f"]
)
@pytest.mark.anyio
async def test_unsafe_request_targets_are_refused(target: str) -> None:
    async with _server(_echo_forever) as (url, accepted):
        pool = ConnectionPool(url)
        with pytest.raises(InvalidTargetError):
            await pool.request("GET", target, [])
        await pool.aclose()
    assert accepted == []
    assert issubclass(InvalidTargetError, ValueError)


@pytest.mark.anyio
async def test_a_body_delimited_by_the_close_is_read_to_the_close() -> None:
    async def close_delimited(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int
    ) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n")
        for part in (b"one ", b"two ", b"three"):
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.close()

    async with _server(close_delimited) as (url, accepted):
        pool = ConnectionPool(url)
        for _ in range(2):  # the connection is never reused: a second request opens a new one
            response = await pool.request("GET", "/", [])
            assert await response.read() == b"one two three"
        await pool.aclose()
    assert len(accepted) == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nhalf\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n8\r\nhalf",
    ],
    ids=["content-length", "chunked-before-last-chunk", "chunked-mid-chunk"],
)
@pytest.mark.anyio
async def test_a_truncated_body_is_an_error_not_a_short_answer(answer: bytes) -> None:
    async def truncate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    async with _server(truncate) as (url, _):
        pool = ConnectionPool(url)
        response = await pool.request("GET", "/", [])
        with pytest.raises(ConnectionError):
            await response.read()
        await pool.aclose()


@pytest.mark.anyio
async def test_trailers_are_kept_apart_from_the_headers() -> None:
    async def trailers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await _read_request(reader) is not None:
            writer.write(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-digest\r\n\r\n"
                b"2\r\nok\r\n0\r\nx-digest: abc\r\n\r\n"
            )

    async with _server(trailers) as (url, accepted):
        pool = ConnectionPool(url)
        for _ in range(2):
            response = await pool.request("GET", "/", [])
            assert await response.read() == b"ok"
            assert response.header(b"x-digest") is None
            assert response.trailers == [(b"x-digest", b"abc")]
        await pool.aclose()
    assert len(accepted) == 1


@pytest.mark.anyio
async def test_bytes_after_a_complete_answer_make_the_connection_unusable() -> None:
    async def extra(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        while (request := await _read_request(reader)) is not None:
            # A second, unasked-for answer right behind the first: it must never be delivered.
            writer.write(_ok(_tagged(request)) + (_ok(b"stray") if i == 0 else b""))
            await writer.drain()

    async with _server(extra) as (url, accepted):
        pool = ConnectionPool(url)
        assert await (await pool.request("POST", "/", [], b"a")).read() == b"a"
        await asyncio.sleep(0.05)
        assert await (await pool.request("POST", "/", [], b"b")).read() == b"b"
        await pool.aclose()
    assert len(accepted) == 2


@pytest.mark.anyio
async def test_http_origin_through_an_http_proxy_uses_absolute_form_and_proxy_auth() -> None:
    async with _server(_echo_head) as (proxy_url, _):
        proxy = proxy_url.replace("http://", "http://us%40r:p%3Ass@")
        pool = ConnectionPool("http://upstream.invalid:8000/base", proxy=proxy)
        head = await (await pool.request("GET", "/v1/models?x=1", [])).read()
        await pool.aclose()
    line, *headers = head.split(b"\r\n")
    assert line == b"GET http://upstream.invalid:8000/base/v1/models?x=1 HTTP/1.1"
    assert b"host: upstream.invalid:8000" in headers
    assert b"proxy-authorization: Basic " + base64.b64encode(b"us@r:p:ss") in headers


async def _echo_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    while (request := await _read_request(reader)) is not None:
        writer.write(_ok(request.partition(b"\r\n\r\n")[0]))
        await writer.drain()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
@pytest.mark.anyio
async def test_https_origin_through_an_http_proxy_uses_a_connect_tunnel(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def echo_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await _echo_head(reader, writer, 0)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    origin = await asyncio.start_server(echo_then_close, "127.0.0.1", 0, ssl=server_tls)
    origin_port = origin.sockets[0].getsockname()[1]
    connects: list[bytes] = []

    async def tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        connects.append(head.split(b"\r\n", 1)[0])
        _, port = head.split(b" ")[1].rsplit(b":", 1)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            finally:
                dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            up_writer.close()

    client_tls = ssl.create_default_context(cafile=str(cert))
    async with _server(tunnel) as (proxy_url, accepted):
        pool = ConnectionPool(
            f"https://localhost:{origin_port}/v1", proxy=proxy_url, ssl_context=client_tls
        )
        for _ in range(2):
            head = await (await pool.request("GET", "/models", [])).read()
            assert head.split(b"\r\n", 1)[0] == b"GET /v1/models HTTP/1.1"
        await pool.aclose()
    origin.close()
    await origin.wait_closed()
    assert connects == [f"CONNECT localhost:{origin_port} HTTP/1.1".encode()]
    assert len(accepted) == 1
