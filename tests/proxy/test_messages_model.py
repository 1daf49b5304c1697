"""``/v1/messages`` answered by the embedded real model (chat completions only, so translated),
through the official ``anthropic`` client: with ``tool_choice: any`` a validated ``tool_use`` block
comes back, buffered and streamed. Skipped
unless the model is fetched and llama-cpp-python is installed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from repairproxy.settings import Settings
from tests.local.model_fixtures import embedded_upstream, requires_model
from tests.local.retail_tools import RETAIL_SYSTEM, RETAIL_TOOLS
from tests.support.proxy_server import running_proxy

pytestmark = [pytest.mark.model, requires_model]

__all__ = ["embedded_upstream"]

TOOLS: list[Any] = [
    {
        "name": tool["function"]["name"],
        "description": tool["function"].get("description", ""),
        "input_schema": tool["function"]["parameters"],
    }
    for tool in RETAIL_TOOLS
]


@pytest.fixture(scope="module")
def client(embedded_upstream: str) -> Iterator[anthropic.Anthropic]:
    settings = Settings(
        upstream=embedded_upstream, upstream_apis=("chat",), repair="constrained", max_repairs=2
    )
    with (
        running_proxy(settings) as proxy,
        anthropic.Anthropic(
            base_url=proxy.root_url, api_key="unused", max_retries=0, timeout=300
        ) as c,
    ):
        yield c


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_the_embedded_model_answers_messages_with_a_validated_tool_use(
    client: anthropic.Anthropic, stream: bool
) -> None:
    arguments: dict[str, Any] = {
        "model": "local",
        "max_tokens": 80,
        "extra_body": {"temperature": 0, "seed": 1},
        "system": RETAIL_SYSTEM,
        "messages": [
            {
                "role": "user",
                "content": "I need help with an order. My email is ava.li@example.com.",
            }
        ],
        "tools": TOOLS,
        # "any" becomes chat's "required", which the embedded server holds to a call grammar
        "tool_choice": {"type": "any"},
    }
    if stream:
        with client.messages.stream(**arguments) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**arguments)
    calls = [block for block in message.content if block.type == "tool_use"]
    assert [(c.name, c.input) for c in calls] == [
        ("find_user_id_by_email", {"email": "ava.li@example.com"})
    ]
    assert message.stop_reason == "tool_use"
    assert message.usage.output_tokens > 0
