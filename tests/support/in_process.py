"""The real proxy app in process: no server, no sockets, the upstream a ``MockTransport``.

    transport = MockTransport(completion(content="hi"))
    async with in_process_proxy(Settings(upstream="http://mock/v1"), transport) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="k", http_client=proxy.http)

Route tests that do not test the HTTP layer itself run here; the loopback servers of
``proxy_server.py`` stay for the ones that do (conformance, faults, request targets).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import orjson

from repairproxy.app import RepairProxyApp, create_app
from repairproxy.settings import Settings
from tests.support.mock_transport import MockTransport

__all__ = ["InProcessProxy", "in_process_proxy"]


@dataclass
class InProcessProxy:
    app: RepairProxyApp
    http: httpx.AsyncClient
    transport: MockTransport
    _log: io.BytesIO

    base_url = "http://proxy/v1"

    def log_lines(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self._log.getvalue().splitlines() if line.strip()]

    def client(self) -> openai.AsyncOpenAI:
        """The official async client, talking to the app through the ASGI transport."""
        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key="k", max_retries=0, http_client=self.http
        )


async def _lifespan(
    app: RepairProxyApp,
) -> tuple[asyncio.Queue[dict[str, Any]], asyncio.Task[None]]:
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive() -> dict[str, Any]:
        return await inbox.get()

    async def send(message: dict[str, Any]) -> None:
        await outbox.put(message)

    task = asyncio.ensure_future(app({"type": "lifespan"}, receive, send))
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {started}")
    return inbox, task


@asynccontextmanager
async def in_process_proxy(
    settings: Settings, transport: MockTransport | None = None
) -> AsyncIterator[InProcessProxy]:
    transport = transport or MockTransport()
    log = io.BytesIO()
    app = create_app(settings, log_stream=log, transport=transport)
    inbox, lifespan = await _lifespan(app)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://proxy"
        ) as http:
            yield InProcessProxy(app, http, transport, log)
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(lifespan, 10)
