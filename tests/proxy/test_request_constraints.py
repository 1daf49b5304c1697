"""Structured calls that break the request's constraints (issue 52): a named ``tool_choice``
other than the call's tool, more calls than ``parallel_tool_calls: false`` allows.

They are reported as ``request_conflict`` (the tool-errors header, the log line, the answers
metric), re-asked in ``reflexive`` with the constraint named, and never charged to the episode's
budget; the text-written calls that do the same stay ``tool_call_in_content`` (ambiguous). Through
the real app in process, the upstream scripted at the transport seam.
"""

from __future__ import annotations

from typing import Any

import pytest

from repairproxy.episodes.budget import CHARGED_CHANNELS
from repairproxy.settings import Settings
from repairproxy.validation import CallRules, Channel, ToolsCache
from tests.support.in_process import in_process_proxy
from tests.support.mock_transport import MockTransport
from tests.support.scripted_upstream import completion, tool_call
from tests.support.tools import CANCEL_ORDER, GET_ORDER

pytestmark = pytest.mark.anyio

TOOLS = [GET_ORDER, CANCEL_ORDER]
MESSAGES = [{"role": "user", "content": "Where is order #W1?"}]
FORCED = {"type": "function", "function": {"name": "get_order_details"}}
CANCEL = tool_call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})
LOOKUP = tool_call("get_order_details", {"order_id": "#W1"})
LOOKUP_2 = tool_call("get_order_details", {"order_id": "#W2"})


def _verdict(body: dict[str, Any], calls: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    tools = ToolsCache().compile(body)
    assert tools is not None
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    verdict = tools.check_message(message, rules=CallRules.of_request(body))
    return [(str(call.channel), call.conflict) for call in verdict.calls]


def test_a_structured_call_to_another_tool_than_tool_choice_names_conflicts() -> None:
    body = {"tools": TOOLS, "tool_choice": FORCED}
    assert _verdict(body, [CANCEL]) == [
        ("request_conflict", "tool_choice names 'get_order_details'")
    ]
    assert _verdict(body, [LOOKUP]) == [("valid", None)]


def test_structured_calls_beyond_the_first_conflict_under_parallel_false() -> None:
    body: dict[str, Any] = {"tools": TOOLS, "parallel_tool_calls": False}
    assert _verdict(body, [LOOKUP, LOOKUP_2]) == [
        ("valid", None),
        ("request_conflict", "parallel_tool_calls is false: at most one call"),
    ]
    assert _verdict({"tools": TOOLS}, [LOOKUP, LOOKUP_2]) == [("valid", None), ("valid", None)]


def test_a_request_conflict_is_never_charged() -> None:
    assert Channel.REQUEST_CONFLICT not in CHARGED_CHANNELS


@pytest.mark.parametrize(
    ("options", "first", "constraint"),
    [
        ({"tool_choice": FORCED}, [CANCEL], "tool_choice names 'get_order_details'"),
        ({"parallel_tool_calls": False}, [LOOKUP, LOOKUP_2], "parallel_tool_calls is false"),
    ],
    ids=["named tool_choice", "parallel false"],
)
@pytest.mark.parametrize("mode", ["reflexive", "constrained"])
async def test_a_conflict_is_re_asked_naming_the_constraint_and_reported(
    options: dict[str, Any], first: list[dict[str, Any]], constraint: str, mode: str
) -> None:
    transport = MockTransport(completion(tool_calls=first), completion(tool_calls=[LOOKUP]))
    settings = Settings(upstream="http://mock/v1", repair=mode)
    async with in_process_proxy(settings, transport) as proxy:
        raw = await proxy.client().chat.completions.with_raw_response.create(
            model="scripted-model", messages=MESSAGES, tools=TOOLS, **options
        )
        answer = raw.parse()
        lines = [line for line in proxy.log_lines() if line.get("event") == "request"]
        metrics = (await proxy.http.get("/metrics")).text
    assert [c.function.name for c in answer.choices[0].message.tool_calls or ()] == [
        "get_order_details"
    ]
    requests = transport.chat_requests
    assert len(requests) == 2  # re-asked once
    repair_turn = str(requests[1]["messages"][len(MESSAGES) :])
    assert constraint in repair_turn
    assert "request_conflict" in raw.headers["x-repairproxy-tool-errors"]
    assert lines[-1]["channels"] == ["request_conflict"]
    assert 'channel="request_conflict"' in metrics
    assert lines[-1]["episode_errors"] == 0  # never charged to the budget


async def test_a_text_call_to_another_tool_stays_tool_call_in_content() -> None:
    text = '{"name": "cancel_pending_order", "arguments": {"order_id": "#W1", "reason": "x"}}'
    transport = MockTransport(completion(content=text))
    settings = Settings(upstream="http://mock/v1", repair="promote")
    async with in_process_proxy(settings, transport) as proxy:
        answer = await proxy.client().chat.completions.create(
            model="scripted-model", messages=MESSAGES, tools=TOOLS, tool_choice=FORCED
        )
        (line,) = [line for line in proxy.log_lines() if line.get("event") == "request"][-1:]
    assert answer.choices[0].message.tool_calls is None
    assert line["channels"] == ["tool_call_in_content"]


async def test_a_streamed_conflict_is_re_asked_before_anything_reaches_the_client() -> None:
    transport = MockTransport(completion(tool_calls=[CANCEL]), completion(tool_calls=[LOOKUP]))
    settings = Settings(upstream="http://mock/v1", repair="reflexive")
    names: list[str] = []
    async with in_process_proxy(settings, transport) as proxy:
        events = await proxy.client().chat.completions.create(
            model="scripted-model", messages=MESSAGES, tools=TOOLS, tool_choice=FORCED, stream=True
        )
        async for chunk in events:
            for part in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                if part.function and part.function.name:
                    names.append(part.function.name)
        lines = [line for line in proxy.log_lines() if line.get("event") == "request"]
    assert names == ["get_order_details"]
    assert len(transport.chat_requests) == 2
    assert lines[-1]["channels"] == ["request_conflict"]
