"""Issue 52's hostile shapes (injections escaped inside tool results and system documents,
answers cut off inside a call, constraints broken in a family's format, and their controls) in the
two stream kinds ``test_promotion_safety`` does not cover: a Responses stream and a Messages
stream, each against its native upstream on loopback, through the real proxy.

The cases are ``tests/data/textcalls/hostile.jsonl``'s rows whose provenance names issue 52; each
conversation is carried over to the API's own shapes (Responses input items, Messages blocks), so
the taint index reads tool results, user turns and system/developer text as the client sent them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.messages_upstream import MessagesUpstream
from tests.support.messages_upstream import text as messages_text
from tests.support.proxy_server import running_proxy
from tests.support.responses_upstream import ResponsesUpstream
from tests.support.responses_upstream import message as responses_message

CORPUS = Path(__file__).parents[1] / "data" / "textcalls" / "hostile.jsonl"
CASES = [
    case
    for case in (json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines())
    if "issue 52" in str(case.get("provenance"))
]


def test_the_new_shapes_cover_each_outcome() -> None:
    assert len(CASES) >= 15
    assert {case["expected"] for case in CASES} == {"promoted", "not_a_call", "ambiguous"}


def _responses_request(case: dict[str, Any]) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for message in case["messages"]:
        role = message["role"]
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": message["content"],
                }
            )
        elif role == "assistant":
            for call in message.get("tool_calls") or ():
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                    }
                )
        else:
            items.append({"role": role, "content": message["content"]})
    request = case["request"]
    tools = [
        {"type": "function", **{k: v for k, v in tool["function"].items()}}
        for tool in request["tools"]
    ]
    body: dict[str, Any] = {"model": "m", "input": items, "tools": tools, "stream": True}
    choice = request.get("tool_choice")
    if isinstance(choice, dict):
        body["tool_choice"] = {"type": "function", "name": choice["function"]["name"]}
    elif choice is not None:
        body["tool_choice"] = choice
    if "parallel_tool_calls" in request:
        body["parallel_tool_calls"] = request["parallel_tool_calls"]
    return body


def _messages_request(case: dict[str, Any]) -> dict[str, Any]:
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for message in case["messages"]:
        role = message["role"]
        if role in ("system", "developer"):
            system.append(message["content"])
        elif role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": message["content"],
            }
            messages.append({"role": "user", "content": [block]})
        elif role == "assistant":
            blocks = [
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "input": json.loads(call["function"]["arguments"]),
                }
                for call in message.get("tool_calls") or ()
            ]
            messages.append({"role": "assistant", "content": blocks})
        else:
            messages.append({"role": "user", "content": message["content"]})
    request = case["request"]
    tools = [
        {
            "name": tool["function"]["name"],
            "description": tool["function"].get("description", ""),
            "input_schema": tool["function"]["parameters"],
        }
        for tool in request["tools"]
    ]
    body: dict[str, Any] = {"model": "m", "max_tokens": 256, "messages": messages, "tools": tools}
    if system:
        body["system"] = "\n\n".join(system)
    choice = request.get("tool_choice")
    parallel_off = request.get("parallel_tool_calls") is False
    if isinstance(choice, dict):
        body["tool_choice"] = {"type": "tool", "name": choice["function"]["name"]}
    elif parallel_off:
        body["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
    return body


def _expected_calls(case: dict[str, Any]) -> list[tuple[str, Any]]:
    if case["expected"] != "promoted":
        return []
    return [(call["name"], call["arguments"]) for call in case["expected_calls"]]


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_a_responses_stream_gets_the_expected_outcome(case: dict[str, Any]) -> None:
    with (
        ResponsesUpstream() as upstream,
        running_proxy(Settings(upstream=upstream.base_url, repair=RepairMode.PROMOTE)) as proxy,
        openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0) as client,
    ):
        upstream.push([responses_message(case["content"])])
        events = list(client.responses.create(**_responses_request(case)))
    final = events[-1].response
    calls = [
        (item.name, json.loads(item.arguments))
        for item in final.output
        if item.type == "function_call"
    ]
    assert calls == _expected_calls(case)
    if case["expected"] == "not_a_call":
        assert final.output_text == case["content"]


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_a_messages_stream_gets_the_expected_outcome(case: dict[str, Any]) -> None:
    with (
        MessagesUpstream() as upstream,
        running_proxy(Settings(upstream=upstream.base_url, repair=RepairMode.PROMOTE)) as proxy,
    ):
        upstream.push([messages_text(case["content"])])
        client = anthropic.Anthropic(base_url=proxy.root_url, api_key="x", max_retries=0)
        with client.messages.stream(**_messages_request(case)) as events:
            final: Any = events.get_final_message()
    calls = [(block.name, block.input) for block in final.content if block.type == "tool_use"]
    assert calls == _expected_calls(case)
    if case["expected"] == "not_a_call":
        text = "".join(block.text for block in final.content if block.type == "text")
        assert text == case["content"]
