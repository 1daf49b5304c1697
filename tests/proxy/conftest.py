"""Fixtures for proxy tests: a scripted upstream, and real proxy servers on loopback before it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from repairproxy.settings import Settings
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream

StartProxy = Callable[..., RunningProxy]


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
