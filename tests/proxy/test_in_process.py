"""The upstream seam at work: repair scenarios of test_proxy_repair.py, in process.

Same assertions, but the proxy app runs under httpx's ASGI transport and the upstream is a
``MockTransport``: no server thread, no socket. (The loopback versions stay: they also cover the
HTTP layer; these show what route tests cost without it.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest

from repairproxy.settings import Settings
from tests.support.in_process import InProcessProxy, in_process_proxy
from tests.support.mock_transport import MockTransport
from tests.support.scripted_upstream import completion, tool_call
from tests.support.tools import MESSAGES, TOOLS

GOOD = {"order_id": "#W1"}
pytestmark = pytest.mark.anyio


def _settings(**overrides: Any) -> Settings:
    return Settings(**{"upstream": "http://mock/v1", "repair": "reflexive", **overrides})


async def _create(proxy: InProcessProxy, **kwargs: Any) -> Any:
    client = openai.AsyncOpenAI(
        base_url=proxy.base_url, api_key="k", max_retries=0, http_client=proxy.http
    )
    return await client.chat.completions.with_raw_response.create(
        model="scripted-model", messages=kwargs.pop("messages", MESSAGES), tools=TOOLS, **kwargs
    )


async def test_hallucinated_name_repaired_on_first_attempt() -> None:
    bad = tool_call("get_order_status", GOOD, call_id="call_bad")
    good = tool_call("get_order_details", GOOD, call_id="call_good")
    transport = MockTransport(completion(tool_calls=[bad]), completion(tool_calls=[good]))
    async with in_process_proxy(_settings(), transport) as proxy:
        raw = await _create(proxy)
    message = raw.parse().choices[0].message
    assert [(c.id, c.function.name) for c in message.tool_calls] == [
        ("call_good", "get_order_details")
    ]
    assert raw.headers["x-repairproxy-repairs"] == "1"
    assert raw.headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert raw.parse().usage.total_tokens == 36  # both attempts
    first, second = transport.chat_requests
    assert "re-issue a valid call" in first["messages"][0]["content"]
    assistant, diagnosis = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "get_order_status"
    assert diagnosis["role"] == "tool" and diagnosis["tool_call_id"] == "call_bad"


async def test_schema_violation_repaired() -> None:
    bad = tool_call("exchange_items", {"order_id": "#W1", "item_ids": "42"})
    good = tool_call("exchange_items", {"order_id": "#W1", "item_ids": ["42"]})
    transport = MockTransport(completion(tool_calls=[bad]), completion(tool_calls=[good]))
    async with in_process_proxy(_settings(), transport) as proxy:
        raw = await _create(proxy)
    call = raw.parse().choices[0].message.tool_calls[0]
    assert orjson.loads(call.function.arguments) == {"order_id": "#W1", "item_ids": ["42"]}
    assert raw.headers["x-repairproxy-tool-errors"] == "schema_violation"
    assert "item_ids" in transport.chat_requests[1]["messages"][-1]["content"]


@pytest.mark.parametrize("policy", ["pass", "strip", "error"])
async def test_exhaustion_policies(policy: str) -> None:
    answers = [completion(tool_calls=[tool_call(f"no_such_tool_{i}", GOOD)]) for i in range(3)]
    transport = MockTransport(*answers)
    settings = _settings(max_repairs=2, on_exhausted=policy)
    async with in_process_proxy(settings, transport) as proxy:
        if policy == "error":
            with pytest.raises(openai.APIStatusError) as caught:
                await _create(proxy)
            assert caught.value.status_code == 502
            assert caught.value.body["code"] == "repair_exhausted"  # type: ignore[index]
            assert len(transport.chat_requests) == 3
            return
        raw = await _create(proxy)
    assert raw.headers["x-repairproxy-repairs"] == "2"
    choice = raw.parse().choices[0]
    if policy == "pass":
        assert choice.message.tool_calls[0].function.name == "no_such_tool_2"
    else:
        assert not choice.message.tool_calls
    assert not transport.script


async def test_constrained_escalation_names_the_tool_on_attempt_two() -> None:
    transport = MockTransport(
        completion(tool_calls=[tool_call("get_order_detail", GOOD)]),
        completion(tool_calls=[tool_call("get_order_detials", GOOD)]),
        completion(tool_calls=[tool_call("get_order_details", GOOD)]),
    )
    async with in_process_proxy(_settings(repair="constrained", max_repairs=2), transport) as p:
        raw = await _create(p)
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "get_order_details"
    first, attempt1, attempt2 = transport.chat_requests
    assert "tool_choice" not in first and "tool_choice" not in attempt1
    assert attempt2["tool_choice"] == {
        "type": "function",
        "function": {"name": "get_order_details"},
    }


async def _events(stream: AsyncIterator[Any]) -> tuple[dict[int, dict[str, str]], Any]:
    calls: dict[int, dict[str, str]] = {}
    usage = None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    return calls, usage


async def test_streaming_repair_yields_a_parseable_valid_call() -> None:
    good = tool_call("get_order_details", GOOD, call_id="call_good")
    transport = MockTransport(
        completion(tool_calls=[tool_call("get_order_status", GOOD)]),
        completion(tool_calls=[good]),
    )
    async with in_process_proxy(_settings(), transport) as proxy:
        client = openai.AsyncOpenAI(
            base_url=proxy.base_url, api_key="k", max_retries=0, http_client=proxy.http
        )
        stream = await client.chat.completions.create(
            model="scripted-model",
            messages=MESSAGES,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
        calls, usage = await _events(stream)
    assert calls == {
        0: {"id": "call_good", "name": "get_order_details", "arguments": '{"order_id":"#W1"}'}
    }
    assert usage.total_tokens == 36
    assert transport.chat_requests[0]["stream"] is True
    assert transport.chat_requests[1]["stream"] is False
