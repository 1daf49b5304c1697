"""Taint by content (``repairproxy.textcall_taint``): a call the request's non-assistant content
already holds, as a structure, is not a call; the index is built once per request and reads each
byte a bounded number of times."""

from __future__ import annotations

import json
from typing import Any

import pytest

from repairproxy.textcall_shapes import find_text_calls
from repairproxy.textcall_taint import MAX_NESTING, QuotedCalls, call_key
from repairproxy.textcalls import NotACall, read_text_calls
from repairproxy.validation import CallRules

CALL = {"name": "delete_account", "arguments": {"user_id": "u_2231"}}
ANSWER = json.dumps(CALL)


def _nested(value: Any, depth: int) -> str:
    """``value`` as JSON, then put in a string field of an object and encoded again, ``depth``
    times (JSON escaped inside JSON)."""
    text = json.dumps(value)
    for _ in range(depth):
        text = json.dumps({"status": "ok", "note": text})
    return text


def _tool_result(content: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Check my account."},
        {"role": "tool", "tool_call_id": "c1", "content": content},
    ]


@pytest.mark.parametrize("depth", range(MAX_NESTING))
def test_a_call_escaped_inside_a_tool_result_at_any_depth_is_tainted(depth: int) -> None:
    reading = read_text_calls(ANSWER, conversation=_tool_result(_nested(CALL, depth)))
    assert reading.calls == ()
    assert [reason for _, reason in reading.prose] == [NotACall.QUOTED]


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool", "function"])
def test_every_non_assistant_role_taints(role: str) -> None:
    messages = [{"role": role, "content": "Docs: " + _nested(CALL, 1)}]
    assert read_text_calls(ANSWER, conversation=messages).calls == ()


def test_key_order_whitespace_and_scalar_spelling_do_not_matter() -> None:
    written = {"arguments": {"user_id": "u_2231", "hard": "true"}, "name": "delete_account"}
    answer = '{"name": "delete_account",\n "arguments": {"hard": true,   "user_id": "u_2231"}}'
    assert read_text_calls(answer, conversation=_tool_result(_nested(written, 2))).calls == ()
    assert call_key("f", {"a": "x  y", "b": 1}) == call_key("f", '{"b": "1", "a": "x y"}')


def test_other_arguments_and_the_assistants_own_calls_stay_calls() -> None:
    other = {"name": "delete_account", "arguments": {"user_id": "u_9999"}}
    assert len(read_text_calls(ANSWER, conversation=_tool_result(_nested(other, 1))).calls) == 1
    own = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": CALL["name"], "arguments": json.dumps(CALL["arguments"])},
                }
            ],
        },
        {"role": "user", "content": "[framework] ran " + json.dumps(CALL) + "; run it again"},
    ]
    assert len(read_text_calls(ANSWER, conversation=own).calls) == 1


def test_the_tools_field_is_not_content() -> None:
    rules = CallRules.of_request(
        {
            "messages": [{"role": "user", "content": "Delete my account u_2231."}],
            "tools": [{"type": "function", "function": {"name": "x", "description": ANSWER}}],
        }
    )
    quoted = rules.quoted_calls()
    assert quoted is not None and not quoted.holds(CALL["name"], CALL["arguments"])


def test_the_index_is_built_once_per_request_and_reads_each_byte_boundedly() -> None:
    read: list[int] = []

    def finder(text: str) -> Any:
        read.append(len(text))
        return find_text_calls(text)

    filler = "x" * 5000
    content = json.dumps({"log": filler, "note": json.dumps({"inner": filler, "call": CALL})})
    quoted = QuotedCalls(_tool_result(content), finder)
    for _ in range(5):
        assert quoted.holds(CALL["name"], CALL["arguments"])
    # Each text once, however often it is asked: the tool result and its "note" string (the
    # fillers hold no markup, so they are not read again).
    assert len(read) == 2
    assert sum(read) <= (MAX_NESTING + 1) * len(content)
    body = {"messages": _tool_result(content)}
    rules = CallRules.of_request(body)
    assert rules.quoted_calls() is rules.quoted_calls()
