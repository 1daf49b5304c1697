"""A native Responses re-ask repeats the answer it repairs with that answer's ``reasoning``
items first and unmodified (``encrypted_content`` included), and never escalates to a forced
``tool_choice`` while reasoning is on. The official openai client, the scripted native
Responses upstream, constrained mode (the one that escalates)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.responses_upstream import ResponsesUpstream, function_call

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_order_details",
        "description": "Get the status of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    }
]


def _reasoning(n: int) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": f"gAAAA{n}=="}


@pytest.fixture
def upstream() -> Iterator[ResponsesUpstream]:
    with ResponsesUpstream() as scripted:
        yield scripted


@pytest.fixture
def proxy(upstream: ResponsesUpstream) -> Iterator[RunningProxy]:
    settings = Settings(
        upstream=upstream.base_url,
        repair=RepairMode.CONSTRAINED,
        max_repairs=3,
        upstream_apis=("responses",),
    )
    with running_proxy(settings) as running:
        yield running


def test_a_responses_reask_keeps_reasoning_items_and_forces_no_tool(
    proxy: RunningProxy, upstream: ResponsesUpstream
) -> None:
    upstream.push(
        [_reasoning(1), function_call("lookup_order", {"order_id": "#W1"})],
        [_reasoning(2), function_call("find_order", {"order_id": "#W1"})],
        [_reasoning(3), function_call("get_order_details", {"order_id": "#W1"})],
    )
    answer = proxy.client().responses.create(
        model="m",
        input="Where is #W1?",
        tools=TOOLS,
        reasoning={"effort": "low"},
        include=["reasoning.encrypted_content"],
    )
    assert [i.type for i in answer.output][-1] == "function_call"
    assert answer.output[-1].name == "get_order_details"
    requests = upstream.requests
    assert len(requests) == 3
    for attempt, reask in enumerate(requests[1:], start=1):
        items = reask["input"]
        reasoning = [i for i in items if i.get("type") == "reasoning"]
        assert reasoning == [_reasoning(n) for n in range(1, attempt + 1)]
        first = items.index(_reasoning(1))
        assert items[first + 1]["type"] == "function_call"  # reasoning first, then its call
        choice = reask.get("tool_choice", "auto")
        assert choice != "required" and not (isinstance(choice, dict) and choice.get("name"))
