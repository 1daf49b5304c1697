"""SSE parsing, tool-call delta assembly, the hold/release gate and chunk re-emission."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from repairproxy.asgi.gate import (
    DONE_EVENT,
    SSEParser,
    StreamAssembler,
    ToolCallGate,
    completion_to_chunks,
    could_open_call,
    data_event,
)
from tests.support.scripted_upstream import completion, sse_events, tool_call


def _chunks(events: list[bytes]) -> list[dict[str, Any]]:
    out = []
    for event in events:
        payload = event.removeprefix(b"data: ").strip()
        if payload and payload != b"[DONE]" and not event.startswith(b":"):
            out.append(orjson.loads(payload))
    return out


def test_parser_splits_across_arbitrary_chunk_boundaries() -> None:
    stream = b'data: {"a":1}\n\ndata: {"b":2}\r\n\r\n: comment\n\ndata: [DONE]\n\n'
    for size in (1, 3, 7, len(stream)):
        parser = SSEParser()
        events = []
        for i in range(0, len(stream), size):
            events += parser.feed(stream[i : i + size])
        events += parser.flush()
        assert [e.data for e in events] == [b'{"a":1}', b'{"b":2}', None, b"[DONE]"]
        assert b"".join(e.raw for e in events) == stream
        assert events[-1].is_done


def test_parser_joins_multiline_data_and_flushes_unterminated_tail() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: one\ndata: two\n\ndata: tail")[0].data == b"one\ntwo"
    assert [e.data for e in parser.flush()] == [b"tail"]


def test_assembler_rebuilds_the_non_streaming_message() -> None:
    calls = [tool_call("a", {"x": 1}), tool_call("b", '{"y": [1, 2]}')]
    body = completion(content="Checking.", tool_calls=calls).body
    assembler = StreamAssembler()
    for chunk in _chunks(sse_events(body, include_usage=True)):
        assembler.add(chunk)
    rebuilt = assembler.completion()
    assert rebuilt["choices"][0]["message"]["content"] == "Checking."
    assert rebuilt["choices"][0]["message"]["tool_calls"] == calls
    assert rebuilt["choices"][0]["finish_reason"] == "tool_calls"
    assert rebuilt["usage"] == body["usage"]
    assert rebuilt["id"] == body["id"]


def _run_gate(events: list[bytes]) -> tuple[ToolCallGate, list[bytes]]:
    gate, released = ToolCallGate(), []
    parser = SSEParser()
    for event in parser.feed(b"".join(events)):
        released += gate.feed(event)
    return gate, released


def test_gate_holds_every_tool_call_delta_until_the_end() -> None:
    body = completion(tool_calls=[tool_call("a", {"x": 1})]).body
    events = sse_events(body, include_usage=False)
    gate, released = _run_gate(events)
    assert released == []
    assert gate.held == events  # released later byte for byte, in order


def test_gate_streams_prose_at_once_but_holds_call_shaped_text() -> None:
    prose = sse_events(completion(content="Your order ships tomorrow.").body, include_usage=False)
    gate, released = _run_gate(prose)
    assert released and gate.released_content
    assert released + gate.held == prose
    shaped = sse_events(
        completion(content='{"name": "a", "arguments": {}}').body, include_usage=False
    )
    gate, released = _run_gate(shaped)
    assert released == [] and not gate.released_content


@pytest.mark.parametrize("include_usage", [False, True])
def test_rendered_chunks_reassemble_into_the_completion(include_usage: bool) -> None:
    calls = [tool_call("a", {"x": 1}), tool_call("b", {"y": 2})]
    body = completion(content="Done.", tool_calls=calls).body
    meta = {"id": "chatcmpl-x", "created": 1, "model": "m"}
    events = completion_to_chunks(
        body, meta, include_content=True, include_role=True, include_usage=include_usage
    )
    assert events[-1] == DONE_EVENT
    assembler = StreamAssembler()
    for chunk in _chunks(events):
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == "chatcmpl-x"
        assembler.add(chunk)
    rebuilt = assembler.completion()
    assert rebuilt["choices"][0]["message"]["tool_calls"] == calls
    assert rebuilt["choices"][0]["message"]["content"] == "Done."
    assert rebuilt["choices"][0]["finish_reason"] == "tool_calls"
    assert ("usage" in rebuilt) is include_usage


def test_data_event_is_one_sse_event() -> None:
    assert data_event({"a": 1}) == b'data: {"a":1}\n\n'


@pytest.mark.parametrize(
    ("text", "could"),
    [
        ("", True),
        ("  ", True),
        ("{", True),
        ('{"na', True),
        ('{ "name"', True),
        ("{not json", False),
        ("{{", True),  # a doubled pair a template taught
        ('{{"name"', True),
        ('{ {"na', True),
        ("{{name}}", False),
        ("{{ name }}", False),
        ("[", True),
        ('[{"name"', True),
        ("[see the docs](http://x)", False),
        ("[1, 2]", False),
        ("`", True),
        ("``", True),
        ("```", True),
        ("```js", True),  # may still become ```json
        ("```json\n", True),
        ('```json\n{"name"', True),
        ("```\n[{", True),
        ("```python", False),
        ("```\nimport os", False),
        ("```json\nnot json", False),
        ("<", True),
        ("<tool_", True),
        ("<tool_call>\n{", True),
        ("<function=get_order", True),
        ("<b>bold</b>", False),
        ("Sure, let me check.", False),
        ("The order {#W1}", False),
    ],
)
def test_could_open_call(text: str, could: bool) -> None:
    assert could_open_call(text) is could


@pytest.mark.parametrize(
    "content",
    [
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>',
        '```json\n{"name": "a", "arguments": {}}\n```',
        "<function=a>\n<parameter=x>\n1\n</parameter>\n</function>",
        '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]',
    ],
)
def test_gate_holds_every_text_call_shape_whole(content: str) -> None:
    events = sse_events(completion(content=content).body, include_usage=False)
    gate, released = _run_gate(events)
    assert released == [] and gate.held == events


@pytest.mark.parametrize(
    "content", ["[see the docs](http://x) for more.", "```python\nprint(1)\n```", "{not json}"]
)
def test_gate_flushes_what_cannot_be_a_call_at_once(content: str) -> None:
    events = sse_events(completion(content=content).body, include_usage=False)
    gate, released = _run_gate(events)
    assert gate.released_content
    assert released + gate.held == events
    assert len(released) >= len(events) - 2  # only the finish chunk (and [DONE]) stay held


def test_gate_hold_is_bounded() -> None:
    content = '{"name": "a", "arguments": {"text": "' + "x" * 300 + '"}}'
    events = sse_events(completion(content=content).body, include_usage=False)
    gate = ToolCallGate(max_held_chars=100)
    released: list[bytes] = []
    held_at_first_release = None
    for event in SSEParser().feed(b"".join(events)):
        out = gate.feed(event)
        if out and held_at_first_release is None:
            held_at_first_release = len(gate.assembler.content or "")
        released += out
    assert gate.released_content and released + gate.held == events
    # Held up to the bound, then the whole prefix left in one go.
    assert held_at_first_release is not None and 100 < held_at_first_release < len(content)


def test_gate_without_text_hold_streams_call_shaped_text() -> None:
    events = sse_events(
        completion(content='{"name": "a", "arguments": {}}').body, include_usage=False
    )
    gate = ToolCallGate(hold_text=False)
    released = []
    for event in SSEParser().feed(b"".join(events)):
        released += gate.feed(event)
    assert released and released + gate.held == events
