"""Fixtures for proxy tests: a scripted upstream, and real proxy servers on loopback before it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack
from typing import Any

import pytest

from repairproxy.settings import Settings
from tests.support.in_process import InProcessProxy, in_process_proxy
from tests.support.mock_transport import MockTransport
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream

StartProxy = Callable[..., RunningProxy]
StartInProcess = Callable[..., Awaitable[InProcessProxy]]


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as scripted:
        yield scripted


@pytest.fixture
def start_proxy(upstream: ScriptedUpstream) -> Iterator[StartProxy]:
    """Start a proxy in front of ``upstream``; keyword arguments override Settings fields.

    Defaults to ``repair="off"`` (observe only); repair tests pass their mode.
    """
    with ExitStack() as stack:

        def start(**overrides: Any) -> RunningProxy:
            fields: dict[str, Any] = {"upstream": upstream.base_url, "repair": "off", **overrides}
            return stack.enter_context(running_proxy(Settings(**fields)))

        yield start


@pytest.fixture
def proxy(start_proxy: StartProxy) -> RunningProxy:
    return start_proxy()


@pytest.fixture
def transport() -> MockTransport:
    """The in-process upstream: scripted replies, recorded requests, no socket."""
    return MockTransport()


@pytest.fixture
async def start_in_process(transport: MockTransport) -> AsyncIterator[StartInProcess]:
    """The default for route tests that do not test the HTTP layer: the app in process before
    ``transport``; keyword arguments override Settings fields (``repair="off"`` unless given)."""
    async with AsyncExitStack() as stack:

        async def start(**overrides: Any) -> InProcessProxy:
            fields: dict[str, Any] = {"upstream": "http://mock/v1", "repair": "off", **overrides}
            return await stack.enter_async_context(in_process_proxy(Settings(**fields), transport))

        yield start
