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


# -- the per-field table on chat-only upstreams ---------------------------------------------------


def test_the_committed_field_table_is_current() -> None:
    from pathlib import Path

    from repairproxy.wire.fields import field_table

    committed = Path(__file__).resolve().parents[2] / "docs" / "chat-only-fields.md"
    assert committed.read_text() == field_table(), "regenerate docs/chat-only-fields.md"


@pytest.fixture
def chat_proxy() -> Iterator[tuple[RunningProxy, Any]]:
    from tests.support.scripted_upstream import ScriptedUpstream

    with ScriptedUpstream() as chat:
        settings = Settings(upstream=chat.base_url, repair=RepairMode.OFF, upstream_apis=("chat",))
        with running_proxy(settings) as running:
            yield running, chat


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/responses", {"conversation": "conv_123"}, "conversation"),
        ("/responses", {"background": True}, "background"),
        ("/responses", {"tools": [{"type": "web_search"}]}, "tools[0]"),
        (
            "/messages",
            {"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]},
            "mcp_servers",
        ),
        (
            "/messages",
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools[0]",
        ),
    ],
)
def test_a_field_a_chat_upstream_cannot_honour_is_refused_by_name(
    chat_proxy: tuple[RunningProxy, Any], path: str, extra: dict[str, Any], param: str
) -> None:
    import httpx

    proxy, chat = chat_proxy
    base: dict[str, Any] = (
        {"model": "m", "input": "hi"}
        if path == "/responses"
        else {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    )
    answer = httpx.post(proxy.base_url + path, json={**base, **extra}, timeout=30)
    assert answer.status_code == 400, answer.text
    assert param.partition("[")[0] in answer.text
    assert not chat.requests  # never forwarded


@pytest.mark.parametrize("path", ["/responses", "/messages"])
def test_a_dropped_field_is_named_in_a_header_and_the_log(
    chat_proxy: tuple[RunningProxy, Any], path: str
) -> None:
    import httpx

    from tests.support.scripted_upstream import completion

    proxy, chat = chat_proxy
    chat.push(completion(content="Hello."))
    base: dict[str, Any] = (
        {"model": "m", "input": "hi", "reasoning": {"effort": "low"}}
        if path == "/responses"
        else {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    )
    answer = httpx.post(proxy.base_url + path, json={**base, "metadata": {"a": "b"}}, timeout=30)
    assert answer.status_code == 200, answer.text
    named = answer.headers["x-repairproxy-dropped-fields"].split(",")
    assert "metadata" in named and (path == "/messages" or "reasoning" in named)
    assert "metadata" not in chat.chat_requests[-1]
    line = next(line for line in proxy.log_lines() if line.get("path") == "/v1" + path)
    assert "metadata" in line["dropped_fields"]
