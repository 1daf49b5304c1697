"""The stream gate holds a declared tool's name where a marker-less call may start with it.

Granite's pythonic calls (``get_weather(city="LA")``) and the marker-stripped Mistral
(``NAME{...}``) and Kimi (``NAME:0 {...}``) formats open with the bare tool name, so a gate that
waits for a bracket has already sent the name to the client as text when the call turns out to
be one. With the declared names the gate holds a word that is a prefix of one, at the start of
the answer, a line or a sentence, and lets it go at the first character that says it is prose.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import orjson
import pytest

from repairproxy.asgi.gate import SSEParser, ToolCallGate, call_opening
from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.in_process import in_process_proxy
from tests.support.messages_upstream import MessagesUpstream
from tests.support.messages_upstream import text as messages_text
from tests.support.mock_transport import MockTransport
from tests.support.proxy_server import running_proxy
from tests.support.responses_upstream import ResponsesUpstream
from tests.support.responses_upstream import message as responses_message
from tests.support.scripted_upstream import completion

NAMES = ("get_weather", "get_current_weather", "add_two_strings")


def _chunk(content: str) -> bytes:
    delta = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(delta) + b"\n\n"


def _feed(gate: ToolCallGate, piece: str) -> str:
    """The content ``gate`` releases when ``piece`` arrives."""
    (event,) = SSEParser().feed(_chunk(piece))
    released = gate.feed(event)
    return "".join(
        orjson.loads(raw[6:])["choices"][0]["delta"].get("content") or "" for raw in released
    )


@pytest.mark.parametrize(
    ("text", "opening"),
    [
        ('get_weather(city="LA")', True),
        ("get_weather (", True),
        ('add_two_strings{"a": "3"}', True),
        ('get_weather:0 {"city": "NYC"}', True),
        ("get_weather", None),  # the name whole, nothing after it yet
        ("get_weather  ", None),
        ("get_weather:", None),  # waits for its digit
        ("get_w", None),
        ("get_", None),  # a prefix of two names
        ("get_weatherman", False),
        ("get_weather is sunny", False),
        ("get_weather: sunny", False),
        ("get a coat", False),
        ("getting", False),
        ("Get_weather(", False),  # names are matched exactly
        ("Sure", False),
        ("weather(", False),
    ],
)
def test_a_declared_name_opens_a_call_only_when_brackets_follow(
    text: str, opening: bool | None
) -> None:
    assert call_opening(text, tool_names=NAMES) is opening
    assert call_opening(text) is False  # without declared names a bare word is prose


@pytest.mark.parametrize(
    "text",
    [
        'get_weather(city="LA")',
        "get_weather:0 x",
        "get_weather: sunny",
        "get_current_weather{}",
        "get a coat",
        "add_two_strings  is a tool",
    ],
)
def test_a_decided_prefix_stays_decided(text: str) -> None:
    # The gate reads an undecided start again only until it decides: every longer text that
    # begins with a decided prefix must get the same answer.
    decided: bool | None = None
    for end in range(1, len(text) + 1):
        opening = call_opening(text[:end], tool_names=NAMES)
        if decided is not None:
            assert opening is decided, text[:end]
        decided = opening


# The answers of vLLM's parser tests that leaked the tool's name when streamed (re-authored
# from tests/data/textcalls/native: granite_pythonic 001/005, kimi_k2 007 stripped, mistral 018
# stripped), each with the prose the client may have before the verdict.
MARKERLESS = [
    ('get_weather(location="San Francisco", unit="celsius")', ""),
    (
        'Sure, let me check the weather.\nget_weather(location="London")',
        "Sure, let me check the weather.",
    ),
    ('No prefix. get_weather:0 {"city": "Tokyo"}', "No prefix."),
    ('add_two_strings{"a": "3", "b": "4"}', ""),
]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize(("text", "prose"), MARKERLESS)
def test_no_part_of_a_markerless_call_reaches_the_client_before_the_verdict(
    text: str, prose: str, size: int
) -> None:
    gate = ToolCallGate(tool_names=NAMES)
    sent = "".join(_feed(gate, text[i : i + size]) for i in range(0, len(text), size))
    # At most the prose (the chunk a call opens in is held whole): never a piece of the name.
    assert text.startswith(sent) and len(sent.rstrip()) <= len(prose)


@pytest.mark.parametrize(
    ("pieces", "held_until"),
    [
        (list("get a coat"), 3),  # "get" held; the space says it is prose
        (list("Getting there."), 0),  # no prefix of a name: it flows at once
        (["Sure.\n", "get", "_w", "eatherman says rain."], 3),
        (["Sure. ", "add", " salt."], 2),
        (["get_weather", " is sunny"], 1),
    ],
)
def test_prose_that_starts_like_a_tool_name_flows_once_it_is_clearly_not_one(
    pieces: list[str], held_until: int
) -> None:
    gate = ToolCallGate(tool_names=NAMES)
    sent = [_feed(gate, piece) for piece in pieces]
    # The first chunk that decides releases everything held before it; after that, each
    # chunk goes out as it comes.
    assert "".join(sent[:held_until]).rstrip() in ("", "Sure.")
    assert "".join(sent[: held_until + 1]) == "".join(pieces[: held_until + 1])
    assert "".join(sent) == "".join(pieces)
    assert gate.held == []


def test_tool_choice_none_holds_no_name() -> None:
    gate = ToolCallGate(hold_text=False, tool_names=NAMES)
    assert _feed(gate, "get_weather(") == "get_weather("


def _weather_tool(name: str, parameter: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {parameter: {"type": "string"}},
                "required": [parameter],
            },
        },
    }


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "tool", "prose", "arguments"),
    [
        (
            'get_weather(location="Berlin")',
            ("get_weather", "location"),
            None,
            {"location": "Berlin"},
        ),
        (
            'Sure, let me check the weather.\nget_weather(location="London")',
            ("get_weather", "location"),
            "Sure, let me check the weather.",
            {"location": "London"},
        ),
        (
            'No prefix. get_weather:0 {"city": "Tokyo"}',
            ("get_weather", "city"),
            "No prefix.",
            {"city": "Tokyo"},
        ),
        ('add_two_strings{"a": "3"}', ("add_two_strings", "a"), None, {"a": "3"}),
        (
            '{{"name": "get_weather", "arguments": {"city": "Paris"}}}',
            ("get_weather", "city"),
            None,
            {"city": "Paris"},
        ),
        (
            '{"name": "get_weather", "arguments": {"city": "Paris"}}}',
            ("get_weather", "city"),
            None,
            {"city": "Paris"},
        ),
    ],
    ids=[
        "granite pythonic",
        "pythonic after prose",
        "kimi stripped",
        "mistral stripped",
        "doubled braces",
        "one brace too many",
    ],
)
async def test_a_streamed_markerless_call_reaches_the_client_as_the_buffered_one(
    content: str, tool: tuple[str, str], prose: str | None, arguments: dict[str, Any]
) -> None:
    """Through the proxy and the official client (the upstream streams 3-character deltas):
    the client gets the call and only the prose around it, as a buffered answer would."""
    transport = MockTransport(completion(content=content), completion(content=content))
    settings = Settings(upstream="http://mock/v1", repair=RepairMode.PROMOTE)
    async with in_process_proxy(settings, transport) as proxy:
        client: openai.AsyncOpenAI = proxy.client()
        options: dict[str, Any] = {
            "model": "scripted-model",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [_weather_tool(*tool)],
        }
        buffered = (await client.chat.completions.create(**options)).choices[0].message
        text, names, parts = "", [], []
        async for chunk in await client.chat.completions.create(stream=True, **options):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            text += delta.content or ""
            for part in delta.tool_calls or ():
                if part.function and part.function.name:
                    names.append(part.function.name)
                if part.function and part.function.arguments:
                    parts.append(part.function.arguments)
    assert buffered.tool_calls is not None
    assert [call.function.name for call in buffered.tool_calls] == [tool[0]]
    assert orjson.loads(buffered.tool_calls[0].function.arguments) == arguments
    assert (buffered.content or None) == prose
    assert names == [tool[0]] and orjson.loads("".join(parts)) == arguments
    assert (text.strip() or None) == prose


# Cut in halves by the scripted upstreams: the first half ends inside the name ("get_or").
AFTER_PROSE = 'Let me look that up.\nget_order_details(order_id="#W1")'


def test_a_messages_stream_holds_a_markerless_call_after_prose() -> None:
    """The Messages gate (a native Messages upstream): the streamed message the SDK assembles
    is the buffered one, with no piece of the call's name in its text."""
    tools: list[Any] = [
        {
            "name": "get_order_details",
            "input_schema": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        }
    ]
    with (
        MessagesUpstream() as upstream,
        running_proxy(Settings(upstream=upstream.base_url, repair=RepairMode.PROMOTE)) as proxy,
    ):
        answer = [messages_text(AFTER_PROSE)]
        upstream.push(answer, answer)
        client = anthropic.Anthropic(base_url=proxy.root_url, api_key="x", max_retries=0)
        arguments: dict[str, Any] = {
            "model": "m",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "Where is my order #W1?"}],
            "tools": tools,
        }
        buffered: Any = client.messages.create(**arguments)
        with client.messages.stream(**arguments) as events:
            streamed: Any = events.get_final_message()
    for message in (buffered, streamed):
        calls = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
        assert calls == [("get_order_details", {"order_id": "#W1"})]
        texts = [b.text.strip() for b in message.content if b.type == "text"]
        assert texts == ["Let me look that up."]


def test_a_responses_stream_holds_a_markerless_call_after_prose() -> None:
    """The Responses gate (a native Responses upstream): no text delta carries the call."""
    tools: list[Any] = [
        {
            "type": "function",
            "name": "get_order_details",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        }
    ]
    with (
        ResponsesUpstream() as upstream,
        running_proxy(Settings(upstream=upstream.base_url, repair=RepairMode.PROMOTE)) as proxy,
    ):
        upstream.push([responses_message(AFTER_PROSE)])
        with openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0) as client:
            events: list[Any] = list(
                client.responses.create(model="m", input="hi", tools=tools, stream=True)
            )
    sent = "".join(
        getattr(event, "delta", "")
        for event in events
        if event.type == "response.output_text.delta"
    )
    assert "get_or" not in sent and sent.strip() == "Let me look that up."
    final = events[-1].response
    assert [item.name for item in final.output if item.type == "function_call"] == [
        "get_order_details"
    ]
