"""Fields the client sent come back as sent: the proxy's repair instruction goes upstream inside
``instructions`` (native ``/v1/responses``), and the upstream echoes it, but the answer, its
stream and a later ``GET`` carry the client's own ``instructions`` (None when it sent none).
The official openai client against the scripted native Responses upstream, which echoes
``instructions`` as OpenAI does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.responses_upstream import ResponsesUpstream, function_call, message

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


@pytest.fixture
def upstream() -> Iterator[ResponsesUpstream]:
    with ResponsesUpstream() as scripted:
        yield scripted


@pytest.fixture
def proxy(upstream: ResponsesUpstream) -> Iterator[RunningProxy]:
    settings = Settings(
        upstream=upstream.base_url, repair=RepairMode.REFLEXIVE, upstream_apis=("responses",)
    )
    with running_proxy(settings) as running:
        yield running


@pytest.mark.parametrize("instructions", ["Answer in one sentence.", None])
@pytest.mark.parametrize("streamed", [False, True])
def test_responses_instructions_round_trip_as_sent(
    proxy: RunningProxy, upstream: ResponsesUpstream, instructions: str | None, streamed: bool
) -> None:
    client = proxy.client()
    upstream.push([function_call("get_order_details", {"order_id": "#W1"})])
    extra: dict[str, Any] = {} if instructions is None else {"instructions": instructions}
    if streamed:
        with client.responses.stream(model="m", input="Where?", tools=TOOLS, **extra) as events:
            answer = events.get_final_response()
    else:
        answer = client.responses.create(model="m", input="Where?", tools=TOOLS, **extra)
    sent = upstream.requests[-1]["instructions"]
    assert isinstance(sent, str) and len(sent) > len(instructions or "")  # the repair text went
    assert answer.instructions == instructions
    assert client.responses.retrieve(answer.id).instructions == instructions
    upstream.push([message("Delivered.")])
    follow = client.responses.create(
        model="m",
        previous_response_id=answer.id,
        input=[
            {"type": "function_call_output", "call_id": answer.output[0].call_id, "output": "ok"}
        ],
        tools=TOOLS,
        **extra,
    )
    assert follow.instructions == instructions
