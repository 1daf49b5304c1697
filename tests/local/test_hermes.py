"""The hermes parser against the behaviours of vLLM's parser that the proxy relies on."""

from __future__ import annotations

import json

import pytest

from repairproxy.local.hermes import HermesStreamSplitter, parse_hermes


def test_plain_text_is_content() -> None:
    parsed = parse_hermes("Sure, what is your email?")
    assert parsed.content == "Sure, what is your email?"
    assert not parsed.tools_called


def test_one_call_with_leading_text() -> None:
    call = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    text = f"Let me look.\n<tool_call>\n{call}\n</tool_call>"
    parsed = parse_hermes(text)
    assert parsed.content == "Let me look.\n"
    [call] = parsed.tool_calls
    assert call.name == "get_order_details"
    assert json.loads(call.arguments) == {"order_id": "#W1"}
    assert call.id.startswith("chatcmpl-tool-")


def test_parallel_calls_keep_order_and_distinct_ids() -> None:
    text = "".join(
        f'<tool_call>\n{{"name": "t{i}", "arguments": {{"i": {i}}}}}\n</tool_call>\n'
        for i in range(3)
    )
    parsed = parse_hermes(text)
    assert parsed.content is None
    assert [c.name for c in parsed.tool_calls] == ["t0", "t1", "t2"]
    assert len({c.id for c in parsed.tool_calls}) == 3


def test_invented_name_passes_through() -> None:
    parsed = parse_hermes(
        '<tool_call>{"name": "transfer_to_human_agent", "arguments": {}}</tool_call>'
    )
    assert [c.name for c in parsed.tool_calls] == ["transfer_to_human_agent"]
    assert parsed.tool_calls[0].arguments == "{}"


def test_unclosed_block_cut_by_length_still_parses_if_json_complete() -> None:
    parsed = parse_hermes('<tool_call>\n{"name": "a", "arguments": {"x": 1}}')
    assert [c.name for c in parsed.tool_calls] == ["a"]


@pytest.mark.parametrize(
    "block",
    [
        '{"name": "a", "arguments": {"x": 1}',  # broken JSON
        '{"name": "a"}',  # no arguments
        '{"arguments": {}}',  # no name
        '["a", {}]',  # not an object
        '{"name": 3, "arguments": {}}',  # name not a string
    ],
)
def test_any_bad_block_turns_the_whole_answer_into_content(block: str) -> None:
    good = '<tool_call>{"name": "good", "arguments": {}}</tool_call>'
    text = f"ok {good}<tool_call>{block}</tool_call>"
    parsed = parse_hermes(text)
    assert parsed.content == text
    assert not parsed.tools_called


def test_untagged_json_call_stays_in_content() -> None:
    text = '```json\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n```'
    parsed = parse_hermes(text)
    assert parsed.content == text
    assert not parsed.tools_called


def test_string_arguments_are_reserialised_as_a_json_string() -> None:
    parsed = parse_hermes('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert json.loads(parsed.tool_calls[0].arguments) == '{"x": 1}'


def _stream(pieces: list[str]) -> tuple[str, HermesStreamSplitter]:
    splitter = HermesStreamSplitter()
    sent = "".join(splitter.feed(p) for p in pieces)
    return sent, splitter


def test_stream_holds_back_a_split_start_tag() -> None:
    pieces = ["Hi", " <tool", "_ca", "ll>\n", '{"name": "a", "arguments": {}}', "\n</tool_call>"]
    sent, splitter = _stream(pieces)
    rest, parsed = splitter.finish()
    assert sent == "Hi "
    assert rest == ""
    assert [c.name for c in parsed.tool_calls] == ["a"]


def test_stream_releases_a_false_alarm_prefix() -> None:
    sent, splitter = _stream(["a <to", "y> b"])
    rest, parsed = splitter.finish()
    assert sent + rest == "a <toy> b"
    assert not parsed.tools_called


def test_stream_broken_call_ends_as_content() -> None:
    pieces = ["x ", "<tool_call>", '{"name": "a", "arguments": {']
    sent, splitter = _stream(pieces)
    rest, parsed = splitter.finish()
    assert sent == "x "
    assert sent + rest == "".join(pieces)
    assert parsed.content == "".join(pieces)
