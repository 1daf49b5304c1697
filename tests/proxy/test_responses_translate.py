"""``/v1/responses`` on an upstream that serves chat completions only (``--upstream-apis chat``,
the embedded model's default): the request is asked in chat, the judged answer comes back in
Responses shape (JSON and event streams), and chains are served from the proxy's store. The
official openai client against a scripted chat-only upstream."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import orjson
import pytest

from repairproxy.settings import Settings
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_order_details",
        "description": "Get the status and details of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    }
]
GOOD = {"order_id": "#W1"}


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as scripted:
        yield scripted


@pytest.fixture
def start(upstream: ScriptedUpstream) -> Iterator[Any]:
    with ExitStack() as stack:

        def start(**overrides: Any) -> RunningProxy:
            fields = {
                "upstream": upstream.base_url,
                "upstream_apis": ("chat",),
                "repair": "reflexive",
                **overrides,
            }
            return stack.enter_context(running_proxy(Settings(**fields)))

        yield start


def _client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)


def _only_chat(upstream: ScriptedUpstream) -> None:
    assert {r.path for r in upstream.requests} == {"/v1/chat/completions"}


def test_a_repaired_call_comes_back_as_a_function_call_item(
    start: Any, upstream: ScriptedUpstream
) -> None:
    proxy = start()
    upstream.push(
        completion(tool_calls=[tool_call("lookup_order", GOOD)]),  # invented: re-asked
        completion(tool_calls=[tool_call("get_order_details", GOOD, call_id="call_good")]),
    )
    raw = _client(proxy).responses.with_raw_response.create(
        model="m", input="Where is #W1?", tools=TOOLS, instructions="Be brief."
    )
    response = raw.parse()
    assert raw.headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert raw.headers["x-repairproxy-repairs"] == "1"
    calls = [i for i in response.output if i.type == "function_call"]
    assert [(c.name, orjson.loads(c.arguments), c.call_id) for c in calls] == [
        ("get_order_details", GOOD, "call_good")
    ]
    assert response.status == "completed" and response.usage is not None
    _only_chat(upstream)
    sent = upstream.chat_requests[0]
    assert sent["messages"][0]["role"] == "system"
    assert sent["messages"][0]["content"].startswith("Be brief.")
    assert sent["messages"][1] == {"role": "user", "content": "Where is #W1?"}
    assert sent["tools"][0]["function"]["name"] == "get_order_details"
    assert sent["stream"] is False


def test_a_chain_is_rebuilt_from_the_store_in_chat_messages(
    start: Any, upstream: ScriptedUpstream
) -> None:
    proxy = start()
    client = _client(proxy)
    upstream.push(
        completion(content="Let me check.", tool_calls=[tool_call("get_order_details", GOOD)]),
        completion(content="It was delivered."),
    )
    first = client.responses.create(
        model="m", input="Where is #W1?", tools=TOOLS, instructions="Answer in French."
    )
    call = next(i for i in first.output if i.type == "function_call")
    assert first.output_text == "Let me check."
    second = client.responses.create(
        model="m",
        previous_response_id=first.id,
        tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "delivered"}],
    )
    assert second.output_text == "It was delivered."
    assert second.previous_response_id == first.id
    messages = upstream.chat_requests[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert "Answer in French." not in messages[0]["content"]  # not carried over
    assert messages[2]["content"] == "Let me check."
    assert messages[2]["tool_calls"][0]["id"] == call.call_id
    assert messages[3] == {"role": "tool", "tool_call_id": call.call_id, "content": "delivered"}
    items = client.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in items.data] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
    ]
    _only_chat(upstream)


def test_the_official_client_streams_a_translated_answer(
    start: Any, upstream: ScriptedUpstream
) -> None:
    proxy = start()
    upstream.push(
        completion(content="Checking.", tool_calls=[tool_call("lookup_order", GOOD)]),
        completion(content="Checking.", tool_calls=[tool_call("get_order_details", GOOD)]),
    )
    with _client(proxy).responses.stream(model="m", input="Where?", tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == "Checking."
    assert [i.name for i in final.output if i.type == "function_call"] == ["get_order_details"]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created = events[0].response  # type: ignore[union-attr]
    assert created.id == final.id
    _only_chat(upstream)


def test_unknown_chain_ids_are_404s_and_never_reach_the_upstream(
    start: Any, upstream: ScriptedUpstream
) -> None:
    proxy = start()
    client = _client(proxy)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="m", previous_response_id="resp_nope", input="and?")
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nope")
    assert upstream.requests == []


def test_an_upstream_error_is_passed_on(start: Any, upstream: ScriptedUpstream) -> None:
    from tests.support.scripted_upstream import error_reply

    proxy = start()
    upstream.push(error_reply(400, "model 'm' does not exist"))
    sent = httpx.post(proxy.base_url + "/responses", json={"model": "m", "input": "hi"}, timeout=30)
    assert sent.status_code == 400
    assert sent.json()["error"]["message"] == "model 'm' does not exist"
