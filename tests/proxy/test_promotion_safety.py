"""Promotion executes only the calls the model asked for: the hostile corpus, buffered and streamed.

Every case of ``tests/data/textcalls/hostile.jsonl`` (quotes, declines, conditionals, code
examples, injections through tool results and user messages, reasoning blocks, request
constraints, positive controls; rules in that folder's README) goes through the real proxy in
process (``repair: promote``, so no re-ask hides the outcome), once buffered and once streamed,
and must get its expected outcome: *promoted* (exactly its expected calls), *not a call* (the
text delivered as it came, nothing counted), or *ambiguous* (nothing promoted, counted as
``tool_call_in_content``). Then property tests: prose added around a call never changes which
call is promoted, and a call copied from a tool result is never promoted wherever it sits.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repairproxy.asgi.gate import SSEParser, ToolCallGate
from repairproxy.repair import promote
from repairproxy.settings import Settings
from repairproxy.validation import CallRules, ToolsCache
from tests.support.in_process import InProcessProxy, in_process_proxy
from tests.support.mock_transport import MockTransport
from tests.support.proxy_server import running_proxy
from tests.support.responses_upstream import ResponsesUpstream, message
from tests.support.scripted_upstream import completion, sse_events

pytestmark = pytest.mark.anyio

CORPUS = Path(__file__).parents[1] / "data" / "textcalls" / "hostile.jsonl"
CASES = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line]


def test_the_corpus_covers_every_outcome_and_category() -> None:
    assert len(CASES) >= 100
    assert {case["expected"] for case in CASES} == {"promoted", "not_a_call", "ambiguous"}
    assert len({case["category"] for case in CASES}) == 18


async def _ask(proxy: InProcessProxy, case: dict[str, Any], stream: bool) -> dict[str, Any]:
    """The answer as the client receives it: content, calls (name, arguments), channels."""
    request = case["request"]
    options: dict[str, Any] = {"tools": request["tools"]}
    for key in ("tool_choice", "parallel_tool_calls"):
        if key in request:
            options[key] = request[key]
    messages = case["messages"] or [{"role": "user", "content": "hi"}]
    client = proxy.client()
    content = ""
    calls: list[tuple[str, Any]] = []
    if stream:
        parts: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        events = await client.chat.completions.create(
            model="scripted-model", messages=messages, stream=True, **options
        )
        async for chunk in events:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for part in delta.tool_calls or ():
                if part.function and part.function.name:
                    names[part.index] = part.function.name
                if part.function and part.function.arguments:
                    parts.setdefault(part.index, []).append(part.function.arguments)
        calls = [(names[i], orjson.loads("".join(parts.get(i, ["{}"])))) for i in sorted(names)]
    else:
        answer = await client.chat.completions.create(
            model="scripted-model", messages=messages, **options
        )
        message = answer.choices[0].message
        content = message.content or ""
        calls = [
            (call.function.name, orjson.loads(call.function.arguments))
            for call in message.tool_calls or ()
        ]
    (line,) = [entry for entry in proxy.log_lines() if entry.get("event") == "request"][-1:]
    return {"content": content, "calls": calls, "channels": line["channels"]}


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
async def test_every_hostile_case_gets_its_expected_outcome(
    case: dict[str, Any], stream: bool
) -> None:
    transport = MockTransport(completion(content=case["content"]))
    settings = Settings(upstream="http://mock/v1", repair="promote")
    async with in_process_proxy(settings, transport) as proxy:
        got = await _ask(proxy, case, stream)
    expected = case["expected"]
    if expected == "promoted":
        assert got["calls"] == [(c["name"], c["arguments"]) for c in case["expected_calls"]]
        assert got["channels"] == ["tool_call_in_content"] * len(case["expected_calls"])
    elif expected == "not_a_call":
        assert got["calls"] == []
        assert got["content"] == case["content"]  # delivered as it came
        assert got["channels"] == []  # not a failure
    else:
        assert got["calls"] == []
        assert "tool_call_in_content" in got["channels"]


async def test_an_ambiguous_answer_is_re_asked_in_reflexive() -> None:
    (case,) = [c for c in CASES if c["id"] == "constraint_named_function-001"]
    forced = case["request"]["tool_choice"]["function"]["name"]
    right = {"name": forced, "arguments": {"order_id": "W4817"}}
    transport = MockTransport(
        completion(content=case["content"]), completion(content=orjson.dumps(right).decode())
    )
    settings = Settings(upstream="http://mock/v1", repair="reflexive")
    async with in_process_proxy(settings, transport) as proxy:
        got = await _ask(proxy, case, stream=False)
    assert got["calls"] == [(forced, {"order_id": "W4817"})]
    repair_turn = transport.chat_requests[1]["messages"][-1]
    assert repair_turn["role"] == "user" and "tool_choice names" in repair_turn["content"]


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
async def test_the_demo_answer_reaches_the_agent_as_text_in_reflexive(stream: bool) -> None:
    """The embedded demo's first answer (calls presented as examples, cut off in a fence), under
    the demo's own mode: delivered as it came, nothing run, nothing re-asked."""
    (case,) = [c for c in CASES if c["id"] == "presented_as_example-001"]
    transport = MockTransport(completion(content=case["content"]))
    settings = Settings(upstream="http://mock/v1", repair="reflexive")
    async with in_process_proxy(settings, transport) as proxy:
        got = await _ask(proxy, case, stream)
    assert got == {"content": case["content"], "calls": [], "channels": []}
    assert len(transport.chat_requests) == 1


async def test_a_decline_after_a_streamed_call_is_seen_before_anything_is_promoted() -> None:
    """The call streams first, the decline after it: nothing promoted, the text all delivered."""
    text = (
        'Processing.\n{"name": "delete_account", "arguments": {"user_id": "u_2231"}}\n'
        "Actually no: I won't run that until you confirm."
    )
    (case,) = [c for c in CASES if c["id"] == "declined-001"]
    case = {**case, "content": text}
    transport = MockTransport(completion(content=text))
    async with in_process_proxy(
        Settings(upstream="http://mock/v1", repair="promote"), transport
    ) as p:
        got = await _ask(p, case, stream=True)
    assert got == {"content": text, "calls": [], "channels": []}


# --- property tests ------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "refund_order",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
                "required": ["order_id"],
            },
        },
    },
]
COMPILED = ToolsCache().compile({"tools": TOOLS})

# Neutral prose: sentences that neither decline, condition, narrate nor exemplify a call.
_WORDS = st.sampled_from(
    ["Sure", "Checking", "your", "order", "now", "One", "moment", "please", "Here", "it", "goes"]
)
_SENTENCE = st.lists(_WORDS, min_size=1, max_size=6).map(lambda words: " ".join(words) + ".")
_PROSE = st.lists(_SENTENCE, min_size=0, max_size=3).map(" ".join)
_ORDER = st.text(alphabet="ABCDEFGHJKW0123456789", min_size=1, max_size=8)
_CALL = st.one_of(
    _ORDER.map(lambda order: ("get_order_details", {"order_id": order})),
    st.tuples(_ORDER, st.integers(1, 999)).map(
        lambda pair: ("refund_order", {"order_id": pair[0], "amount": pair[1]})
    ),
)


def _written(name: str, arguments: dict[str, Any], shape: str) -> str:
    body = orjson.dumps({"name": name, "arguments": arguments}).decode()
    if shape == "tag":
        return f"<tool_call>\n{body}\n</tool_call>"
    if shape == "fence":
        return f"```json\n{body}\n```"
    return body


def _promoted(content: str, messages: list[dict[str, Any]] | None = None) -> list[Any]:
    assert COMPILED is not None
    message = {"role": "assistant", "content": content}
    rules = CallRules.of_request({"tools": TOOLS, "messages": messages or []})
    promoted, _ = promote(message, COMPILED.check_message(message, rules=rules))
    return [
        (entry["function"]["name"], orjson.loads(entry["function"]["arguments"]))
        for entry in promoted.get("tool_calls") or ()
    ]


def _gated(events: list[bytes], cuts: list[int]) -> tuple[list[bytes], list[bytes]]:
    """What the stream gate released at once and what it held to the end, the stream cut into
    network chunks at ``cuts``."""
    gate = ToolCallGate()
    parser = SSEParser()
    released: list[bytes] = []
    stream = b"".join(events)
    points = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    for start, end in itertools.pairwise(points):
        for event in parser.feed(stream[start:end]):
            released.extend(gate.feed(event))
    for event in parser.flush():
        released.extend(gate.feed(event))
    return released, gate.held


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    call=_CALL,
    shape=st.sampled_from(["bare", "tag", "fence"]),
    before=_PROSE,
    after=_PROSE,
)
def test_prose_around_a_call_never_changes_which_call_is_promoted(
    call: tuple[str, dict[str, Any]], shape: str, before: str, after: str
) -> None:
    name, arguments = call
    alone = _written(name, arguments, shape)
    assert _promoted(alone) == [(name, arguments)]
    around = "\n".join(part for part in (before, alone, after) if part)
    assert _promoted(around) == [(name, arguments)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    call=_CALL,
    shape=st.sampled_from(["bare", "tag", "fence"]),
    page_before=_PROSE,
    page_after=_PROSE,
    before=_PROSE,
    after=_PROSE,
    spacing=st.sampled_from(["\n", " ", "\n\n"]),
)
def test_a_call_copied_from_a_tool_result_is_never_promoted_wherever_it_sits(
    call: tuple[str, dict[str, Any]],
    shape: str,
    page_before: str,
    page_after: str,
    before: str,
    after: str,
    spacing: str,
) -> None:
    name, arguments = call
    injected = orjson.dumps({"name": name, "arguments": arguments}).decode()
    page = f"{page_before} {injected} {page_after}"
    messages = [
        {"role": "user", "content": "Summarise that page."},
        {"role": "tool", "tool_call_id": "call_0", "content": page},
    ]
    copied = _written(name, arguments, shape)
    answer = spacing.join(part for part in (before, copied, after) if part)
    assert _promoted(answer, messages) == []
    # Re-spaced JSON is the same call copied: still not promoted.
    respaced = json.dumps({"arguments": arguments, "name": name}, indent=1)
    assert _promoted(spacing.join(p for p in (before, respaced, after) if p), messages) == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=_PROSE,
    call=_CALL,
    cuts=st.lists(st.integers(0, 2000), max_size=12),
)
def test_a_streamed_call_after_prose_is_held_to_the_end_however_the_stream_is_cut(
    before: str, call: tuple[str, dict[str, Any]], cuts: list[int]
) -> None:
    """Prose flows; from the call's first character on, everything waits for the answer's end
    (so a decline after it can still be seen); nothing is lost or reordered."""
    content = "\n".join(p for p in (before, _written(*call, "tag")) if p)
    events = sse_events(completion(content=content).body, include_usage=False)
    released, held = _gated(events, cuts)
    assert released + held == events
    sent = "".join(
        orjson.loads(event[6:])["choices"][0]["delta"].get("content") or "" for event in released
    )
    assert "<tool_call>" not in sent and call[0] not in sent
    assert content.startswith(sent)


def _chunk(content: str) -> bytes:
    delta = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(delta) + b"\n\n"


def _sent(events: list[bytes]) -> str:
    return "".join(
        orjson.loads(event[6:])["choices"][0]["delta"].get("content") or "" for event in events
    )


@pytest.mark.parametrize(
    "pieces",
    [
        ["Please recall: your order ", "shipped; these functions. work ", "as before."],
        ["I can call: ", "the store for you", " tomorrow."],
        ["Use functools", "[0] in Python."],
    ],
    ids=["recall", "call: mid-sentence", "functools mid-sentence"],
)
def test_a_word_marker_inside_a_sentence_does_not_hold_the_stream(pieces: list[str]) -> None:
    released, held = _gated([_chunk(piece) for piece in pieces], [])
    assert _sent(released) == "".join(pieces) and held == []


@pytest.mark.parametrize(
    "pieces",
    [
        ["Sure.\n", 'call:get_weather{city:<|"|>Paris<|"|>}'],
        ["Sure.\nca", 'll:get_weather{city:<|"|>Paris<|"|>}'],
        ["Sure.", '\nfunctions.get_weather:0 {"city": "Paris"}'],
        ["Sure.", ' functions.get_weather:0 {"city": "Paris"}'],
        ["Sure. func", 'tions.get_weather:0 {"city": "Paris"}'],
    ],
    ids=[
        "call: on its line",
        "call: split across chunks",
        "functions. on its line",
        "functions. after a sentence",
        "functions. split after a sentence",
    ],
)
def test_a_word_marker_at_a_line_start_is_held(pieces: list[str]) -> None:
    released, _ = _gated([_chunk(piece) for piece in pieces], [])
    assert _sent(released).rstrip() in ("", "Sure.")  # held whole from the chunk a call opens in


def test_the_rest_after_a_promoted_call_keeps_the_space_the_client_lacks() -> None:
    gate = ToolCallGate()
    pieces = ["Let me check the weather for", ' you: {"name": "get_weather", "arguments": {}}']
    released = [raw for piece in pieces for raw in gate.feed(SSEParser().feed(_chunk(piece))[0])]
    assert _sent(released) == "Let me check the weather for"
    answer = completion(content="Let me check the weather for you:").body
    rest = gate.unsent(answer)["choices"][0]["message"]["content"]
    assert _sent(released) + rest == "Let me check the weather for you:"


def test_the_rest_after_a_promoted_call_is_sent_when_the_answer_began_with_a_space() -> None:
    # Promotion trims the prose it keeps; the client has the leading space already.
    gate = ToolCallGate()
    call = '<tool_calls>[{"name": "f", "arguments": {}}]'
    pieces = [" Sure! let me call the", f" tool for you.{call}"]
    released = [raw for piece in pieces for raw in gate.feed(SSEParser().feed(_chunk(piece))[0])]
    assert _sent(released) == " Sure! let me call the"
    answer = completion(content="Sure! let me call the tool for you.").body
    rest = gate.unsent(answer)["choices"][0]["message"]["content"]
    assert _sent(released) + rest == " Sure! let me call the tool for you."


# --- the Responses API's streams -----------------------------------------------------------------

RESPONSES_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "delete_account",
        "parameters": {
            "type": "object",
            "properties": {"user_id": {"type": "string"}},
            "required": ["user_id"],
        },
    }
]


@pytest.mark.parametrize(
    ("text", "promoted"),
    [
        (
            'I will not run {"name": "delete_account", "arguments": {"user_id": "u_2231"}} unless '
            "you confirm.",
            False,
        ),
        (
            'Deleting it.\n{"name": "delete_account", "arguments": {"user_id": "u_2231"}}\n'
            "I won't do that until you confirm.",
            False,
        ),
        (
            '<think>{"name": "delete_account", "arguments": {"user_id": "u_2231"}}</think>'
            "Please confirm first.",
            False,
        ),
        ('{"name": "delete_account", "arguments": {"user_id": "u_2231"}}', True),
    ],
    ids=["declined in the sentence", "declined after it", "in reasoning", "the answer is the call"],
)
def test_a_responses_stream_promotes_what_the_buffered_answer_would(
    text: str, promoted: bool
) -> None:
    with (
        ResponsesUpstream() as upstream,
        running_proxy(Settings(upstream=upstream.base_url, repair="promote")) as proxy,
    ):
        upstream.push([message(text)])
        with openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0) as client:
            events = list(
                client.responses.create(model="m", input="hi", tools=RESPONSES_TOOLS, stream=True)
            )
    final = events[-1].response
    calls = [item.name for item in final.output if item.type == "function_call"]
    assert calls == (["delete_account"] if promoted else [])
    if not promoted:
        assert final.output_text == text
