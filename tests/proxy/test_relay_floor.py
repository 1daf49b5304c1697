"""``benchmarks.support.relay_floor``, the byte relay ``benchmarks.overhead --floor`` measures
beside the proxy: on real loopback sockets it hands each client's bytes to its own upstream
connection and the answers back, in order, including bytes sent before the upstream connection is
up."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from benchmarks.support.relay_floor import serve

pytestmark = pytest.mark.anyio


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _upstream(seen: list[int], ended: list[int]) -> tuple[asyncio.Server, int]:
    """An upstream that answers each read with ``<connection number>:`` + the bytes read."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(len(seen))
        number = len(seen)
        while data := await reader.read(65536):
            writer.write(b"%d:" % number + data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
        ended.append(number)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _wait_listening(port: int) -> None:
    for _ in range(200):
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the relay never listened on {port}")


async def test_the_relay_copies_both_ways_one_upstream_connection_per_client() -> None:
    seen: list[int] = []
    ended: list[int] = []
    upstream, upstream_port = await _upstream(seen, ended)
    port = _free_port()
    relay = asyncio.ensure_future(serve("127.0.0.1", port, upstream_port))
    try:
        await _wait_listening(port)
        first = await asyncio.open_connection("127.0.0.1", port)
        second = await asyncio.open_connection("127.0.0.1", port)
        first[1].write(b"hello")  # likely before the relay's upstream connection is up
        await first[1].drain()
        assert (await first[0].readexactly(7)).endswith(b":hello")
        second[1].write(b"other")
        await second[1].drain()
        answer = await second[0].readexactly(7)
        first[1].write(b"again")
        await first[1].drain()
        again = await first[0].readexactly(7)
        assert answer[:2] != again[:2]  # two clients, two upstream connections
        assert again.endswith(b":again") and answer.endswith(b":other")
        for _, writer in (first, second):
            writer.close()
            await writer.wait_closed()
        for _ in range(200):  # the relay closes each upstream side when its client left
            if len(ended) == len(seen):
                break
            await asyncio.sleep(0.01)
        assert len(ended) == len(seen)
    finally:
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        upstream.close()
        await upstream.wait_closed()
    assert len(seen) >= 2  # the probe connection of _wait_listening may add one
