"""``SSEParser`` against a reference split of the whole stream, for any separators and any chunking.

The parser has two paths (``bytes.find`` while no CR has been seen, the three-way pattern after),
and a CR can first appear mid-stream with a partial event buffered: both must give the events a
one-shot split of the whole stream gives, byte for byte, data fields included.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repairproxy.asgi.gate import SSEParser, StreamAssembler, ToolCallGate

# Real streams: the embedded Qwen2.5-Coder-1.5B (llama.cpp server) answering with stream_options
# include_usage, captured from `python -m repairproxy.local serve --arm q4_k_m`, 2026-12-02.
_REAL = sorted((Path(__file__).parents[1] / "data" / "sse").glob("*.sse"))

_SEPARATOR = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def _reference(stream: bytes) -> list[tuple[bytes, bytes | None]]:
    """Events as (raw, data) from the whole stream at once (the WHATWG line rules for data)."""
    events = []
    start = 0
    for match in _SEPARATOR.finditer(stream):
        raw = stream[start : match.end()]
        block = stream[start : match.start()]
        data = [
            line[5:][1:] if line[5:].startswith(b" ") else line[5:]
            for line in block.splitlines()
            if line.startswith(b"data:")
        ]
        events.append((raw, b"\n".join(data) if data else None))
        start = match.end()
    return events


_LINES = st.sampled_from(
    [b'data: {"a": 1}', b"data:x", b"data: [DONE]", b": comment", b"event: e", b"data: ", b"id: 7"]
)
_SEPARATORS = st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r"])
_LINE_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def _streams(draw: st.DrawFn, separators: st.SearchStrategy[bytes]) -> bytes:
    parts = []
    for _ in range(draw(st.integers(1, 8))):
        lines = draw(st.lists(_LINES, min_size=1, max_size=3))
        parts.append(draw(_LINE_ENDS).join(lines) + draw(separators))
    return b"".join(parts)


def _chunked(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(stream)) for cut in cuts})
    pieces, start = [], 0
    for point in [*points, len(stream)]:
        pieces.append(stream[start:point])
        start = point
    return [piece for piece in pieces if piece]


def _parsed(pieces: list[bytes]) -> list[tuple[bytes, bytes | None]]:
    parser = SSEParser()
    events = [event for piece in pieces for event in parser.feed(piece)]
    assert parser.flush() == []  # every drawn stream ends with a separator
    return [(event.raw, event.data) for event in events]


@settings(max_examples=300, deadline=None)
@given(_streams(st.just(b"\n\n")), st.lists(st.integers(0, 400), max_size=12))
def test_lf_streams_split_anywhere_match_the_reference(stream: bytes, cuts: list[int]) -> None:
    # Lines end in CR or CRLF here too: the CR that appears decides the path mid-stream.
    assert _parsed(_chunked(stream, cuts)) == _reference(stream)


@settings(max_examples=300, deadline=None)
@given(_streams(_SEPARATORS), st.lists(st.integers(0, 400), max_size=12))
def test_mixed_separators_split_anywhere_match_the_reference(
    stream: bytes, cuts: list[int]
) -> None:
    assert _parsed(_chunked(stream, cuts)) == _reference(stream)


def test_a_separator_split_across_chunks_is_found() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n") == []
    (event,) = parser.feed(b"\ndata: b")
    assert (event.raw, event.data) == (b"data: a\n\n", b"a")
    (event,) = parser.feed(b"\n\n")
    assert (event.raw, event.data) == (b"data: b\n\n", b"b")


def test_a_cr_after_a_buffered_lf_part_switches_paths_without_losing_bytes() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n") == []
    (event,) = parser.feed(b"\r\n\r\ndata: c\r\r")[:1]
    assert event.raw == b"data: a\n\r\n\r\n"  # LF CR LF CR LF: the CRLF CRLF ends it
    assert event.data == b"a"


def test_the_unterminated_rest_comes_out_of_flush() -> None:
    parser = SSEParser()
    assert [e.raw for e in parser.feed(b"data: a\n\ndata: tail")] == [b"data: a\n\n"]
    (rest,) = parser.flush()
    assert (rest.raw, rest.data) == (b"data: tail", b"tail")


@pytest.mark.parametrize("path", _REAL, ids=[p.stem for p in _REAL])
def test_real_streams_split_anywhere_give_the_same_events_and_answer(path: Path) -> None:
    stream = path.read_bytes()
    expected = _reference(stream)
    assert expected and expected[-1][1] == b"[DONE]"

    def answer(pieces: list[bytes]) -> dict[str, object]:
        parser, gate = SSEParser(), ToolCallGate(tool_names=("get_order_details",))
        for piece in pieces:
            for event in parser.feed(piece):
                gate.feed(event)
        return gate.assembler.completion()

    whole = answer([stream])
    chooser = random.Random(path.stem)
    for _ in range(50):
        cuts = sorted(chooser.sample(range(1, len(stream)), chooser.randint(1, 40)))
        pieces = _chunked(stream, cuts)
        assert _parsed(pieces) == expected
        assert answer(pieces) == whole


def _content_only(chunk: dict[str, Any]) -> bool:
    """The gate's rule, written plainly: nothing but content deltas, in every choice."""
    if chunk.get("usage"):
        return False
    choices = chunk.get("choices")
    if type(choices) is not list or not choices:
        return False
    for choice in choices:
        if type(choice) is not dict or choice.get("finish_reason"):
            return False
        delta = choice.get("delta")
        if type(delta) is not dict or delta.get("tool_calls") or delta.get("function_call"):
            return False
    return True


_VALUES: st.SearchStrategy[Any] = st.sampled_from(
    [None, "", "x", 0, 1, [], [{}], {}, {"name": "f"}, "stop"]
)
_DELTAS = st.one_of(
    _VALUES,
    st.fixed_dictionaries(
        {},
        optional={
            "content": _VALUES,
            "tool_calls": st.sampled_from([None, [], [{"index": 0, "function": {"name": "f"}}]]),
            "function_call": _VALUES,
        },
    ),
)
_CHOICES = st.one_of(
    _VALUES,
    st.fixed_dictionaries(
        {},
        optional={
            "index": st.sampled_from([0, 1]),
            "delta": _DELTAS,
            "finish_reason": st.sampled_from([None, "", "stop", "tool_calls"]),
        },
    ),
)
_CHUNKS = st.fixed_dictionaries(
    {},
    optional={
        "usage": st.sampled_from([None, {}, {"total_tokens": 3}, 0]),
        "choices": st.one_of(_VALUES, st.lists(_CHOICES, max_size=3)),
    },
)


@settings(max_examples=500, deadline=None)
@given(_CHUNKS)
def test_the_assembler_tells_content_only_chunks_as_the_plain_rule_does(
    chunk: dict[str, Any],
) -> None:
    assembler = StreamAssembler()
    assembler.add(chunk)
    assert assembler.content_only is _content_only(chunk)


def test_a_call_part_without_an_integer_index_is_skipped_not_sorted() -> None:
    """An upstream's part indexed by a string beside a well-indexed call: the completion holds the
    well-indexed call (sorting mixed int and str indexes was a TypeError, a 500)."""
    assembler = StreamAssembler()
    good = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{}"}}
    for part in (good, {"index": "x", "function": {"name": "g"}}, {"index": None}):
        assembler.add({"choices": [{"index": 0, "delta": {"tool_calls": [part]}}]})
    calls = assembler.completion()["choices"][0]["message"]["tool_calls"]
    assert [call["function"]["name"] for call in calls] == ["f"]


_NATIVE = Path(__file__).resolve().parents[1] / "data" / "textcalls" / "native"
_REAL_CALLS = [
    case["expected_calls"]
    for path in sorted(_NATIVE.glob("*.jsonl"))
    for case in map(orjson.loads, path.read_bytes().splitlines())
    if case["expected_calls"]
]


@pytest.mark.parametrize("malformed", [False, True])
def test_the_assembler_rebuilds_every_corpus_call_from_structured_deltas(malformed: bool) -> None:
    """The calls vLLM's tool-parser tests extract (tests/data/textcalls/native, every family),
    streamed as a server sends them: an opening part with the name, then the arguments in three
    pieces. With a malformed part (a string index) after each opening one, the same calls."""
    assert len(_REAL_CALLS) > 400
    for calls in _REAL_CALLS:
        assembler = StreamAssembler()
        for index, call in enumerate(calls):
            arguments = orjson.dumps(call["arguments"]).decode()
            step = max(1, len(arguments) // 3)
            parts: list[dict[str, Any]] = [
                {"index": index, "id": f"call_{index}", "function": {"name": call["name"]}}
            ]
            if malformed:
                parts.append({"index": "x", "function": {"arguments": "{junk"}})
            parts += [
                {"index": index, "function": {"arguments": arguments[at : at + step]}}
                for at in range(0, len(arguments), step)
            ]
            for part in parts:
                assembler.add({"choices": [{"index": 0, "delta": {"tool_calls": [part]}}]})
        built = assembler.completion()["choices"][0]["message"]["tool_calls"]
        got = [(c["function"]["name"], orjson.loads(c["function"]["arguments"])) for c in built]
        assert got == [(call["name"], call["arguments"]) for call in calls]
