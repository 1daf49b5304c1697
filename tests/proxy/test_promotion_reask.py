"""A re-ask never manufactures a call: asked for a tool that none of the listed ones replaces, a
model that then calls a listed tool with values found nowhere in the conversation has that call
refused, and the client gets the first answer as text (whatever ``on_exhausted`` says).

Through ``repair_completion`` with a scripted send (the upstream seam); the pure grounding check
(``reask.ungrounded_values``) on its own.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest

import repairproxy
from repairproxy.reask import (
    DEFAULT_TEMPLATE,
    DEFAULT_TEMPLATE_FILE,
    grounding_texts,
    ungrounded_values,
)
from repairproxy.repair import RepairPolicy, repair_completion
from repairproxy.types import OnExhausted, RepairMode
from repairproxy.validation import CompiledTools, ToolsCache
from tests.support.tools import GET_ORDER

pytestmark = pytest.mark.anyio

EMAIL = "Send an email to bob@example.com saying that his refund is on its way."
BODY: dict[str, Any] = {
    "model": "m",
    "tools": [GET_ORDER],
    "messages": [
        {"role": "system", "content": "Order #12345 is an example."},
        {"role": "user", "content": EMAIL},
    ],
}
SEND_EMAIL = (
    '{"name": "send_email", "arguments": {"to": "bob@example.com", '
    '"body": "Your refund is on its way."}}'
)


def _completion(content: str | None, *calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
            }
            for i, (name, arguments) in enumerate(calls)
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class ScriptedSend:
    def __init__(self, *responses: dict[str, Any]) -> None:
        self.responses = list(responses)
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(copy.deepcopy(request))
        return self.responses.pop(0)


def _tools(body: dict[str, Any]) -> CompiledTools:
    compiled = ToolsCache().compile(body)
    assert compiled is not None
    return compiled


@pytest.mark.parametrize("mode", [RepairMode.REFLEXIVE, RepairMode.CONSTRAINED])
@pytest.mark.parametrize("on_exhausted", list(OnExhausted))
async def test_a_made_up_call_after_a_re_ask_is_refused_and_the_text_delivered(
    mode: RepairMode, on_exhausted: OnExhausted
) -> None:
    made_up = _completion(None, ("get_order_details", {"order_id": "12345"}))
    send = ScriptedSend(made_up, made_up)
    policy = RepairPolicy(mode=mode, on_exhausted=on_exhausted)
    outcome = await repair_completion(BODY, _completion(SEND_EMAIL), _tools(BODY), policy, send)
    message = outcome.response["choices"][0]["message"]
    assert "tool_calls" not in message
    assert message["content"] == SEND_EMAIL  # the first answer, as text
    assert outcome.made_up and outcome.attempts == 1 and len(send.requests) == 1
    assert outcome.promoted == 0


async def test_a_re_asked_call_with_values_from_the_conversation_is_kept() -> None:
    body = copy.deepcopy(BODY)
    body["messages"][-1]["content"] = "Email bob@example.com about order #W1, or look it up."
    reply = _completion(None, ("get_order_details", {"order_id": "#w1"}))
    send = ScriptedSend(reply)
    policy = RepairPolicy(mode=RepairMode.REFLEXIVE)
    outcome = await repair_completion(body, _completion(SEND_EMAIL), _tools(body), policy, send)
    calls = outcome.response["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_order_details"]
    assert not outcome.made_up and outcome.attempts == 1


async def test_a_misspelled_tool_re_asked_is_not_judged_for_grounding() -> None:
    misspelled = '{"name": "get_order_detail", "arguments": {"order_id": "12345"}}'
    reply = _completion(None, ("get_order_details", {"order_id": "12345"}))
    policy = RepairPolicy(mode=RepairMode.REFLEXIVE)
    outcome = await repair_completion(
        BODY, _completion(misspelled), _tools(BODY), policy, ScriptedSend(reply)
    )
    assert outcome.response["choices"][0]["message"]["tool_calls"]
    assert not outcome.made_up


async def test_a_re_ask_answered_in_text_is_delivered() -> None:
    reply = _completion("I cannot send emails; I can only look up orders.")
    policy = RepairPolicy(mode=RepairMode.REFLEXIVE, on_exhausted=OnExhausted.ERROR)
    outcome = await repair_completion(
        BODY, _completion(SEND_EMAIL), _tools(BODY), policy, ScriptedSend(reply)
    )
    message = outcome.response["choices"][0]["message"]
    assert message["content"].startswith("I cannot send emails")
    assert not outcome.made_up and not outcome.exhausted


def test_values_are_grounded_in_user_tool_and_assistant_turns_and_the_tools() -> None:
    body = {
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"enum": ["pending"]}}}
        ],
        "messages": [
            {"role": "system", "content": "example id 999"},
            {"role": "user", "content": "My order is #W1."},
            {"role": "tool", "tool_call_id": "c", "content": '{"item_id": 4242}'},
        ],
    }
    grounding = grounding_texts(body, [{"role": "assistant", "content": "zip 10001"}])
    assert ungrounded_values({"order_id": "#W1", "n": 4242, "s": "pending"}, grounding) == []
    assert ungrounded_values({"zip": "10001", "flag": True, "blank": " "}, grounding) == []
    assert ungrounded_values({"a": ["999", {"b": 7.5}]}, grounding) == ["7.5", "999"]


def test_the_default_re_ask_texts_are_the_ones_the_study_records() -> None:
    """The study's provenance records the template's version and sha256: a change to the texts
    must come as a new version (a new file), not as an edit under the recorded one."""
    path = Path(repairproxy.__file__).parent / DEFAULT_TEMPLATE_FILE
    assert DEFAULT_TEMPLATE.version == "repair-v3"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "3d79dfcc2c5f653a011ccb774fce1b23b0f57c8c2eb90898d8d828ffecee845d"
    )
