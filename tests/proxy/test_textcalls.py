"""Every text-call shape, found and parsed; prose that merely holds JSON stays prose."""

from __future__ import annotations

import itertools
import time
from typing import Any

import orjson
import pytest

from repairproxy.textcalls import (
    Shape,
    find_call_in_text,
    find_text_calls,
    json_value_end,
    promote_calls,
)
from repairproxy.validation import Channel, ToolsCache
from repairproxy.wire.openai import message_text

# (case id, text, [(name, arguments, shape)] expected in order)
SHAPES: list[tuple[str, str, list[tuple[str | None, Any, Shape]]]] = [
    (
        "bare object",
        '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}',
        [("get_order_details", {"order_id": "#W1"}, Shape.JSON)],
    ),
    (
        "bare object, parameters key",
        '{"name": "get_order_details", "parameters": {"order_id": "#W1"}}',
        [("get_order_details", {"order_id": "#W1"}, Shape.JSON)],
    ),
    (
        "arguments as a JSON string",
        '{"name": "f", "arguments": "{\\"a\\": 1}"}',
        [("f", {"a": 1}, Shape.JSON)],
    ),
    (
        "list of calls (parallel)",
        '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]',
        [("a", {}, Shape.JSON), ("b", {"x": 1}, Shape.JSON)],
    ),
    (
        "two objects on two lines (parallel)",
        '{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {}}',
        [("a", {}, Shape.JSON), ("b", {}, Shape.JSON)],
    ),
    (
        "openai tool_calls entry",
        '{"type": "function", "function": {"name": "f", "arguments": "{}"}}',
        [("f", {}, Shape.JSON)],
    ),
    (
        "legacy function_call shape",
        '{"function_call": {"name": "f", "arguments": "{\\"q\\": \\"x\\"}"}}',
        [("f", {"q": "x"}, Shape.JSON)],
    ),
    (
        "tool_calls wrapper",
        '{"tool_calls": [{"function": {"name": "f", "arguments": {}}}]}',
        [("f", {}, Shape.JSON)],
    ),
    (
        "tool_call tags, two blocks",
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"k": "v"}}\n</tool_call>',
        [("a", {}, Shape.TAGGED), ("b", {"k": "v"}, Shape.TAGGED)],
    ),
    (
        "unclosed tag, broken JSON keeps the name",
        '<tool_call>{"name": "modify_address", "arguments": {',
        [("modify_address", None, Shape.TAGGED)],
    ),
    ("tag with garbage", "<tool_call>garbage</tool_call>", [(None, None, Shape.TAGGED)]),
    (
        "fenced json",
        'Here:\n```json\n{"name": "f", "arguments": {"a": [1, 2]}}\n```\nDone.',
        [("f", {"a": [1, 2]}, Shape.FENCED)],
    ),
    (
        "fence without language",
        '```\n{"name": "f", "arguments": {}}\n```',
        [("f", {}, Shape.FENCED)],
    ),
    (
        "function XML with parameters",
        "<function=get_order_details>\n<parameter=order_id>\n#W1\n</parameter>\n</function>",
        [("get_order_details", {"order_id": "#W1"}, Shape.XML)],
    ),
    (
        "function XML inside a tool_call tag (Qwen3-Coder)",
        "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n<parameter=b>\n2\n"
        "</parameter>\n</function>\n</tool_call>",
        [("f", {"a": "x", "b": "2"}, Shape.XML)],
    ),
    (
        "function tag with a JSON body (llama 3.1)",
        '<function=f>{"a": 1}</function>',
        [("f", {"a": 1}, Shape.XML)],
    ),
    ("function tag, empty body", "<function=f></function>", [("f", {}, Shape.XML)]),
    (
        "prose around a call",
        'Let me check that. {"name": "f", "arguments": {"a": 1}} One moment.',
        [("f", {"a": 1}, Shape.JSON)],
    ),
    (
        "invented name is still a call shape",
        '{"name": "cancel_order", "arguments": {"order_id": "#W1"}}',
        [("cancel_order", {"order_id": "#W1"}, Shape.JSON)],
    ),
    (
        "arguments that are not JSON stay raw",
        '{"name": "f", "arguments": "{oops"}',
        [("f", "{oops", Shape.JSON)],
    ),
    # A template's Jinja-escaped example (``{{"name": <function-name>, ...}}``, in the Qwen2.5
    # GGUFs' chat template) teaches the model a doubled brace pair around its call.
    (
        "doubled braces (a template's escaped example)",
        '{{"name": "get_weather", "arguments": {"city": "Paris"}}}',
        [("get_weather", {"city": "Paris"}, Shape.JSON)],
    ),
    (
        "doubled braces inside tool_call tags",
        '<tool_call>\n{{"name": "f", "arguments": {"a": 1}}}\n</tool_call>',
        [("f", {"a": 1}, Shape.TAGGED)],
    ),
    (
        "doubled braces, spaced, in a fence",
        '```json\n{ {"name": "f", "arguments": {}} }\n```',
        [("f", {}, Shape.FENCED)],
    ),
    (
        "doubled braces after prose",
        'Checking. {{"name": "f", "arguments": {"a": 1}}}',
        [("f", {"a": 1}, Shape.JSON)],
    ),
    ("doubled braces around data", '{{"retries": 3}}', []),
    ("template placeholders", "Write {{name}} and {{ arguments }} in the template.", []),
    # Prose that merely holds JSON, or brackets, is never a call.
    ("plain prose", "Your order shipped yesterday.", []),
    ("json config, no arguments key", 'Config: {"retries": 3, "name": "x"}', []),
    ("two unrelated objects", '{"a": 1} and {"b": 2}', []),
    ("broken brace", "{ not json", []),
    ("markdown link", "[see the docs](http://x) {and braces}", []),
    ("list mixing a call and data", '[{"name": "f", "arguments": {}}, 3]', []),
    (
        "any fence holding a call",
        '```python\n{"name": "f", "arguments": {}}\n```',
        [("f", {}, Shape.FENCED)],
    ),
    ("python fence holding code", '```python\nf(a={"b": 1})\n```', []),
    ("html-ish text", "<b>bold</b> <function>no name</function>", []),
    ("empty list", "[]", []),
    (
        "call nested inside other data is data",
        '{"example": {"name": "f", "arguments": {}}}',
        [],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in SHAPES], ids=[c[0] for c in SHAPES])
def test_shapes(text: str, expected: list[tuple[str | None, Any, Shape]]) -> None:
    calls = find_text_calls(text)
    assert [(c.name, c.arguments, c.shape) for c in calls] == expected
    for call in calls:
        assert text[call.start : call.end] == call.source
    assert find_call_in_text(text) == ((expected[0][0],) if expected else None)


def test_json_value_end_ignores_brackets_in_strings_and_handles_depth() -> None:
    text = 'x {"a": "}{]", "b": [1, {"c": "\\""}]} y'
    end = json_value_end(text, 2)
    assert end is not None and orjson.loads(text[2:end])["a"] == "}{]"
    deep = "[" * 100_000 + "]" * 100_000
    assert json_value_end(deep, 0) == len(deep)  # iterative: no RecursionError
    assert json_value_end('{"a": "unterminated', 0) is None
    assert json_value_end("{[}", 0) is None


@pytest.mark.parametrize(
    "text",
    [
        "[" * 5000 + "]" * 5000,
        '{"name": "f", "arguments": ' + "[" * 3000 + "]" * 3000 + "}",
        "<tool_call>" + "{" * 3000 + "</tool_call>",
        "```json\n" + "[" * 3000 + "]" * 3000 + "\n```",
    ],
    ids=["deep list", "deep arguments", "deep tag", "deep fence"],
)
def test_deeply_nested_text_never_raises(text: str) -> None:
    calls = find_text_calls(text)
    assert all(call.name in (None, "f") for call in calls)


def test_scanning_is_bounded_on_hostile_text() -> None:
    text = "{" * 200_000 + '"name": "f"'
    started = time.perf_counter()
    assert find_text_calls(text) == ()
    assert time.perf_counter() - started < 5.0


def test_message_text_joins_parts() -> None:
    message = {"content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"text": "b"}]}
    assert message_text(message) == "ab"
    assert message_text({"content": None}) == ""


def _ids() -> Any:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def test_promote_cuts_the_call_keeps_the_prose() -> None:
    text = 'Let me check.\n{"name": "f", "arguments": {"a": 1}}\nOne moment.'
    message = {"role": "assistant", "content": text}
    promoted = promote_calls(message, find_text_calls(text), new_id=_ids())
    assert promoted["content"] == "Let me check.\nOne moment."
    assert promoted["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    ]
    assert message == {"role": "assistant", "content": text}  # input untouched


def test_promote_parallel_calls_of_one_list_and_empty_rest() -> None:
    text = '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]'
    promoted = promote_calls({"content": text}, find_text_calls(text), new_id=_ids())
    assert promoted["content"] is None
    assert [c["function"]["name"] for c in promoted["tool_calls"]] == ["a", "b"]
    assert [c["id"] for c in promoted["tool_calls"]] == ["call_0", "call_1"]


def test_promote_skips_a_span_with_an_unreadable_call() -> None:
    text = "<tool_call>garbage</tool_call>"
    message = {"content": text}
    assert promote_calls(message, find_text_calls(text)) == message


def test_promote_appends_after_structured_calls_with_fresh_ids() -> None:
    existing = {"id": "x", "type": "function", "function": {"name": "a", "arguments": "{}"}}
    text = '{"name": "b", "arguments": {}}'
    promoted = promote_calls({"content": text, "tool_calls": [existing]}, find_text_calls(text))
    first, second = promoted["tool_calls"]
    assert first == existing
    assert second["id"].startswith("call_") and len(second["id"]) > 10


WEATHER = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    }
}


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>',
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        'get_weather(city="Paris")',
    ],
    ids=["mistral", "tool_calls tag", "granite", "phi-4-mini", "granite pythonic"],
)
def test_a_native_wrapper_is_part_of_the_call(text: str) -> None:
    (call,) = find_text_calls(text, WEATHER)
    assert (call.name, call.arguments) == ("get_weather", {"city": "Paris"})
    assert (call.start, call.end) == (0, len(text))  # the wrapper is cut with the call
    assert promote_calls({"content": text}, [call])["content"] is None


def test_a_native_reading_types_what_the_generic_one_left_as_text() -> None:
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    (typed,) = find_text_calls(text, WEATHER)
    assert typed.arguments == {"city": "Paris", "days": 3} and not typed.string_values
    (untyped,) = find_text_calls(text)
    assert untyped.shape is Shape.XML and untyped.arguments["days"] == "3"


def test_a_bare_call_line_needs_a_declared_tool() -> None:
    assert find_text_calls('get_weather(city="Paris")') == ()
    assert find_text_calls('send_email(to="bob")', WEATHER) == ()


@pytest.mark.parametrize(
    ("text", "promoted"),
    [
        ('{{"name": "f", "arguments": {"a": 1}}}', ["f"]),
        ('<tool_call>\n{{"name": "f", "arguments": {}}}\n</tool_call>', ["f"]),
        # Only one pair is unwrapped, around one object: what is left is an object glued to
        # stray braces, which the reading leaves as text.
        ('{{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}}', []),
        ('{{{"name": "f", "arguments": {}}}}', []),
        ('The template shows {{"name": "f", "arguments": {}}} as an example.', []),
    ],
)
def test_a_doubled_brace_pair_is_read_as_the_call_it_wraps(text: str, promoted: list[str]) -> None:
    tools: list[dict[str, Any]] = []
    request = {"messages": [{"role": "user", "content": "go"}], "tools": tools}
    for n in ("f", "g"):
        tools.append(
            {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        )
    compiled = ToolsCache().compile(request)
    assert compiled is not None
    verdicts = compiled.check_message({"role": "assistant", "content": text}).calls
    assert [v.name for v in verdicts if v.inner is Channel.VALID] == promoted


def test_a_closing_bracket_left_after_a_promoted_call_is_not_kept_as_prose() -> None:
    # Seen through vLLM with an INT8 W8A8 arm: the call closed with one brace too many.
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}}'
    [call] = find_text_calls(text)
    promoted = promote_calls({"role": "assistant", "content": text}, [call])
    assert promoted["content"] is None
    assert [c["function"]["name"] for c in promoted["tool_calls"]] == ["get_weather"]
    kept = promote_calls({"role": "assistant", "content": text + " Done."}, [call])
    assert kept["content"] == "} Done."
