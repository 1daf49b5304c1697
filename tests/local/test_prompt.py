"""The Qwen2.5 Hermes/ChatML renderer: tools, calls, tool results, null content, multi-turn."""

from __future__ import annotations

import json

from repairproxy.local.prompt import DEFAULT_SYSTEM, REPAIR_MARKER, render_prompt
from repairproxy.reask import DEFAULT_TEMPLATE, with_repair_instruction

TOOL = {
    "type": "function",
    "function": {
        "name": "get_order_details",
        "description": "Get the status and details of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}


def test_no_tools_default_system() -> None:
    prompt = render_prompt([{"role": "user", "content": "hi"}])
    assert prompt == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_are_listed_as_json_lines_in_the_system_turn() -> None:
    messages = [
        {"role": "system", "content": "Be a retail agent."},
        {"role": "user", "content": "x"},
    ]
    prompt = render_prompt(messages, [TOOL, TOOL])
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe a retail agent.\n\n# Tools\n")
    inside = system.split(":\n<tools>")[1].split("\n</tools>")[0]
    lines = inside.strip("\n").split("\n")
    assert [json.loads(line) for line in lines] == [TOOL, TOOL]
    assert '{"name": <function-name>, "arguments": <args-json-object>}' in system
    assert prompt.count("<|im_start|>system") == 1


def test_assistant_call_with_null_content_then_grouped_tool_results() -> None:
    messages = [
        {"role": "user", "content": "where are my orders?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_order_details", "arguments": '{"order_id": "#W1"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_order_details", "arguments": '{"order_id":"#W2"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "pending"}'},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: order not found"},
        {"role": "assistant", "content": "One is pending."},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
    ]
    prompt = render_prompt(messages, [TOOL])
    turns = prompt.split("<|im_start|>")[2:]
    assert turns[1] == (
        "assistant\n<tool_call>\n"
        '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>\n'
        "<tool_call>\n"
        '{"name": "get_order_details", "arguments": {"order_id": "#W2"}}\n</tool_call><|im_end|>\n'
    )
    assert turns[2] == (
        'user\n<tool_response>\n{"status": "pending"}\n</tool_response>\n'
        "<tool_response>\nError: order not found\n</tool_response><|im_end|>\n"
    )
    assert turns[3] == "assistant\nOne is pending.<|im_end|>\n"
    assert turns[4] == "user\nthanks<|im_end|>\n"
    assert turns[5] == "assistant\n"


def test_assistant_text_before_call_and_broken_arguments_are_replayed() -> None:
    messages = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"a": '},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "Error: bad"},
    ]
    prompt = render_prompt(messages, [TOOL], add_generation_prompt=False)
    assert (
        "<|im_start|>assistant\nChecking.\n<tool_call>\n"
        '{"name": "lookup", "arguments": {"a": }\n</tool_call>' in prompt
    )
    assert prompt.endswith("</tool_response><|im_end|>\n")


def test_later_system_message_is_its_own_turn() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "system", "content": "note"}]
    prompt = render_prompt(messages)
    assert "<|im_start|>system\nnote<|im_end|>\n" in prompt
    assert prompt.startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}")


def test_repair_instruction_renders_after_the_tools_so_both_modes_share_the_prefix() -> None:
    policy = "You are a retail agent.\n\nFollow the policy."
    tools = [TOOL]
    body = {"messages": [{"role": "system", "content": policy}, {"role": "user", "content": "hi"}]}
    repaired = with_repair_instruction({**body, "tools": tools}, DEFAULT_TEMPLATE)
    off = render_prompt(body["messages"], tools)
    on = render_prompt(repaired["messages"], tools)
    tools_end = off.index("<|im_end|>")  # the end of the system turn: policy + tools
    assert on[:tools_end] == off[:tools_end]  # policy + tools: one cached prefix for both modes
    instruction = DEFAULT_TEMPLATE.instruction
    assert on[tools_end:].startswith(f"\n\n{instruction}<|im_end|>")
    assert off[tools_end:].startswith("<|im_end|>")


def test_a_marker_inside_a_paragraph_is_not_moved() -> None:
    policy = f"Quote: {REPAIR_MARKER} is what the proxy writes."
    prompt = render_prompt([{"role": "system", "content": policy}], [TOOL])
    assert prompt.startswith(f"<|im_start|>system\n{policy}\n\n# Tools")
