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

ORDER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_order_details",
        "description": "Get the status and details of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    },
}
EXCHANGE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "exchange_items",
        "description": "Exchange items of a delivered order.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "item_ids": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "reason": {"type": "string", "enum": ["size", "color", "defect"]},
            },
            "required": ["order_id", "item_ids"],
        },
    },
}
EMAIL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "find_user_id_by_email",
        "parameters": {
            "type": "object",
            "properties": {"email": {"type": "string"}},
            "required": ["email"],
        },
    },
}
TOOLS = [ORDER_TOOL, EXCHANGE_TOOL, EMAIL_TOOL]
MESSAGES = [
    {"role": "system", "content": "You are a retail support agent."},
    {"role": "user", "content": "Where is my order #W1?"},
]


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
