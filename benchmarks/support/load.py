"""The load the figures drive: the request they send, a keep-alive HTTP/1.1 client (uvloop +
httptools) that drives a target at a given concurrency, and small process helpers (free port,
wait for a port, RSS). ``benchmarks.overhead`` built them; every figure that drives a proxy
shares them from here.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field

import httptools

__all__ = [
    "REQUEST_BODY",
    "TOOLS",
    "UNCHECKED_PATH",
    "Connection",
    "Target",
    "free_port",
    "http_request",
    "pct",
    "rss_mib",
    "wait_port",
]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "Get the status and details of an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string", "description": "e.g. #W0000000"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "find_user_id_by_email",
            "description": "Find a user id by email.",
            "parameters": {
                "type": "object",
                "properties": {"email": {"type": "string"}},
                "required": ["email"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "exchange_delivered_order_items",
            "description": "Exchange items of a delivered order.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "item_ids": {"type": "array", "items": {"type": "string"}},
                    "new_item_ids": {"type": "array", "items": {"type": "string"}},
                    "payment_method_id": {"type": "string"},
                },
                "required": ["order_id", "item_ids", "new_item_ids", "payment_method_id"],
            },
        },
    },
]
REQUEST_BODY = {
    "model": "bench-model",
    "messages": [
        {"role": "system", "content": "You are a retail customer service agent. " * 20},
        {"role": "user", "content": "Where is my order #W2378156?"},
    ],
    "tools": TOOLS,
    "temperature": 0.0,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


class Connection(asyncio.Protocol):
    """One keep-alive connection; ``request`` sends prebuilt bytes and awaits the whole answer."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._done: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc or ConnectionError("closed"))

    async def request(self, data: bytes) -> float:
        assert self.transport is not None
        self._done = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        self.transport.write(data)
        await self._done
        return time.perf_counter() - started


@dataclass
class Target:
    name: str
    port: int
    payload: bytes
    pools: dict[int, list[Connection]] = field(default_factory=dict)
    latencies: dict[int, list[float]] = field(default_factory=dict)
    elapsed: dict[int, float] = field(default_factory=dict)
    count: dict[int, int] = field(default_factory=dict)

    async def pool(self, size: int) -> list[Connection]:
        conns = self.pools.get(size, [])
        if any(c.transport is None or c.transport.is_closing() for c in conns):
            del self.pools[size]  # the server closed idle keep-alive connections: reconnect
        if size not in self.pools:
            loop = asyncio.get_running_loop()
            conns = []
            for _ in range(size):
                _, proto = await loop.create_connection(Connection, "127.0.0.1", self.port)
                sock = proto.transport.get_extra_info("socket") if proto.transport else None
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns.append(proto)
            self.pools[size] = conns
        return self.pools[size]

    async def round(self, concurrency: int, requests: int, record: bool = True) -> None:
        conns = await self.pool(concurrency)
        per_conn = max(1, requests // concurrency)
        samples: list[float] = []

        async def worker(conn: Connection) -> None:
            for _ in range(per_conn):
                samples.append(await conn.request(self.payload))

        started = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed = time.perf_counter() - started
        if record:
            self.latencies.setdefault(concurrency, []).extend(samples)
            self.elapsed[concurrency] = self.elapsed.get(concurrency, 0.0) + elapsed
            self.count[concurrency] = self.count.get(concurrency, 0) + len(samples)


def http_request(
    port: int, body: bytes, path: bytes = b"/v1/chat/completions", extra: bytes = b""
) -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
        b"content-type: application/json\r\nauthorization: Bearer bench\r\n%b"
        b"content-length: %d\r\n\r\n" % (path, port, extra, len(body))
    ) + body


# ``--floor``: the first proxy on a route it relays without judging (the fast upstream answers
# any path holding "chat/completions" as it answers the chat route), so the server, the upstream
# client and the relay route are measured without the decision.
UNCHECKED_PATH = b"/v1/floor/chat/completions"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")
