"""The upstream connection pool against real loopback servers: reuse, limits, retry, timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from repairproxy.http1 import ConnectionPool, Origin, PoolTimeoutError

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
