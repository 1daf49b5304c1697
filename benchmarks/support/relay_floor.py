"""The floor under any proxy process on this machine: a uvloop TCP relay that parses nothing.

Each client connection gets its own upstream connection and bytes are copied both ways as they
arrive, so a request costs what the event loop and the kernel's four socket calls cost (read the
request, write it upstream, read the answer, write it back) and nothing else. ``benchmarks.overhead
--floor`` measures it beside the proxy: the proxy's CPU per request minus the relay's is what HTTP
parsing, the app and the decision add, and no Python proxy can go below the relay.

    python -m benchmarks.support.relay_floor --port 9200 --upstream-port 9100
"""

from __future__ import annotations

import argparse
import asyncio

import uvloop

__all__ = ["main", "serve"]


class _Upstream(asyncio.Protocol):
    """The relay's side towards the upstream: what arrives goes to the client as it is."""

    def __init__(self, client: asyncio.Transport) -> None:
        self._client = client

    def data_received(self, data: bytes) -> None:
        self._client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.close()


class _Client(asyncio.Protocol):
    """The relay's side towards a client: bytes go upstream, held only until it is connected."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._upstream: asyncio.Transport | None = None
        self._early: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self._gone = False  # the client left, perhaps before its upstream connection was up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        assert self._transport is not None
        client = self._transport
        try:
            upstream, _ = await asyncio.get_running_loop().create_connection(
                lambda: _Upstream(client), "127.0.0.1", self._upstream_port
            )
        except OSError:
            client.close()
            return
        if self._gone:
            upstream.close()
            return
        self._upstream = upstream
        for data in self._early:
            upstream.write(data)
        self._early.clear()

    def data_received(self, data: bytes) -> None:
        if self._upstream is None:
            self._early.append(data)
        else:
            self._upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone = True
        if self._upstream is not None:
            self._upstream.close()


async def serve(host: str, port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream_port), host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.upstream_port))


if __name__ == "__main__":
    main()
