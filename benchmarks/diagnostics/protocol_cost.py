"""CPU the server-layer limits add per request: ``repairproxy.server.LimitedProtocol`` against
uvicorn's own httptools protocol, fed the same keep-alive requests in process (no sockets, a
trivial ASGI app), so the difference is the limits' bookkeeping alone. Interleaved repeats; prints
median CPU microseconds per request of each.

    python -m benchmarks.diagnostics.protocol_cost [--requests 20000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from repairproxy.server import LimitedProtocol

__all__ = ["main"]

_REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"authorization: Bearer b\r\ncontent-length: 2\r\n\r\n{}"
)


class _Sink(asyncio.Transport):
    """A transport that swallows what the protocol writes."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def write(self, data: Any) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


async def _cpu_us(kind: type[HttpToolsProtocol], requests: int) -> float:
    config = Config(_app, lifespan="off", log_level="warning")
    config.load()
    protocol = kind(config=config, server_state=ServerState(), app_state={})
    protocol.connection_made(_Sink())
    for index in range(requests + 200):  # the first 200 warm up
        if index == 200:
            started = time.process_time()
        protocol.data_received(_REQUEST)
        await asyncio.sleep(0)  # the request's task runs
        await asyncio.sleep(0)
    return (time.process_time() - started) / requests * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    kinds: dict[str, type[HttpToolsProtocol]] = {
        "uvicorn": HttpToolsProtocol,
        "limited": LimitedProtocol,
    }
    samples: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(args.repeats):
        for name, kind in kinds.items():
            samples[name].append(uvloop.run(_cpu_us(kind, args.requests)))
    for name, values in samples.items():
        print(
            f"{name:>8}: median {statistics.median(values):.2f} us CPU/request "
            f"(min {min(values):.2f}, max {max(values):.2f}; "
            f"{args.requests} requests x{args.repeats})"
        )
    added = statistics.median(samples["limited"]) - statistics.median(samples["uvicorn"])
    print(f"the limits add {added:.2f} us CPU/request (median difference)")


if __name__ == "__main__":
    main()
