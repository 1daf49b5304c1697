"""The Messages adapter's pure functions (``repairproxy.wire.messages``): the chat view the
pipeline judges, re-asks in Messages' own shape, and the delivered answer's stop reason."""

from __future__ import annotations

from typing import Any

from repairproxy.wire.messages import (
    message_events,
    messages_request,
    to_chat_body,
    to_chat_completion,
    to_message,
    with_system_instruction,
)

TOOLS: list[Any] = [
    {"name": "get_order", "input_schema": {"type": "object"}},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 1},  # a server tool
]
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_order", "input": {"id": "#W1"}}


def test_the_chat_view_orders_tool_results_first_and_marks_errors() -> None:
    body = {
        "model": "m",
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Looking."}, CALL]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "and?"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "no such order",
                        "is_error": True,
                    },
                ],
            },
        ],
        "tools": TOOLS,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
    }
    chat = to_chat_body(body)
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool", "user"]
    assert chat["messages"][2]["tool_calls"][0]["function"] == {
        "name": "get_order",
        "arguments": '{"id":"#W1"}',
    }
    assert chat["messages"][3] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "Error: no such order",  # is_error, in the words the budget's detector reads
    }
    assert [t["function"]["name"] for t in chat["tools"]] == ["get_order"]  # server tool left out
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["stop"] == ["END"]


def test_a_re_ask_answers_the_bad_call_and_drops_a_call_that_is_not_an_object() -> None:
    forward = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    history = len(to_chat_body(forward)["messages"])
    kept = "(kept)"
    repair_turns = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "get_order", "arguments": '{"id": '},
                },
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "get_order", "arguments": '{"id": "1"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "unknown tool lookup"},
        {"role": "tool", "tool_call_id": "b", "content": "broken JSON"},
        {"role": "tool", "tool_call_id": "c", "content": kept},
    ]
    chat_body = {"messages": [{"role": "user", "content": "hi"}, *repair_turns]}
    request = messages_request(forward, history, chat_body, kept)
    assert request["stream"] is False
    _, assistant, results = request["messages"]
    assert [b["id"] for b in assistant["content"] if b["type"] == "tool_use"] == ["a", "c"]
    assert [(b["type"], b.get("tool_use_id"), b.get("is_error")) for b in results["content"]] == [
        ("tool_result", "a", True),
        ("tool_result", "c", False),
        ("text", None, None),  # the broken call's diagnosis, as text after the results
    ]


def test_an_empty_answer_re_ask_joins_the_last_user_turn() -> None:
    forward = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    chat_body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "user", "content": "Say something."},
        ]
    }
    request = messages_request(forward, 1, chat_body)
    assert request["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "Say something."}],
        }
    ]


def test_stop_reason_follows_the_delivered_calls_and_the_first_id_stays() -> None:
    first = {
        "id": "msg_first",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, CALL],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 1},
    }
    stripped = {
        "choices": [{"message": {"role": "assistant", "content": "Sorry."}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4},
    }
    answer = to_message(stripped, first)
    assert answer["id"] == "msg_first" and answer["stop_reason"] == "end_turn"
    assert [b["type"] for b in answer["content"]] == ["thinking", "text"]
    assert answer["usage"] == {"input_tokens": 9, "output_tokens": 4, "cache_read_input_tokens": 1}
    promoted = to_chat_completion({**first, "stop_reason": "end_turn"})
    assert to_message(promoted, {**first, "stop_reason": "end_turn"})["stop_reason"] == "tool_use"


def test_the_instruction_joins_the_system_field_once() -> None:
    once = with_system_instruction({"system": "Be brief."}, "Use the tools.")
    assert once["system"] == "Be brief.\n\nUse the tools."
    assert with_system_instruction(once, "Use the tools.") == once
    blocks = with_system_instruction({"system": [{"type": "text", "text": "A"}]}, "B")
    assert blocks["system"] == [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]


def test_a_whole_answer_as_events() -> None:
    message = {
        "id": "msg_1",
        "content": [{"type": "text", "text": "hi"}, CALL],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 1, "output_tokens": 2},
    }
    kinds = [e["type"] for e in message_events(message)]
    assert kinds == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    rest = message_events(message, first_block=1, preamble=False)
    assert rest[0] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {**CALL, "input": {}},
    }
    assert rest[1]["delta"] == {"type": "input_json_delta", "partial_json": '{"id":"#W1"}'}
