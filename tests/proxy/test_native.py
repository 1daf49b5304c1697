"""Each open model family's native call format, read from the corpus re-authored from vLLM's tests.

Driven by ``tests/data/textcalls/native/<family>.jsonl``: per family at least 90% of the cases
with a call are read exactly (every name and argument object equal as JSON, in order, and what
stays in ``content`` once the match's wrapper is cut equals the expected prose, no wrapper marker
left), 95% overall, and no negative yields a call to a declared tool. Detection is linear in the
text: the scanner's step counter stays proportional to the text's length on adversarial inputs.
Through the proxy in process, buffered and streamed, one representative answer per recogniser
comes back as a structured call with no wrapper in ``content``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client import CollectorRegistry

from repairproxy.asgi.exchange import Exchange
from repairproxy.native import (
    FAMILIES,
    RECOGNISERS,
    NativeMatch,
    Scanner,
    find_native_calls,
    opening_markers,
    promoted_format,
)
from repairproxy.native.registry import GATES, VARIANT_OF
from repairproxy.observe.metrics import Metrics
from repairproxy.observe.record import RequestRecord
from repairproxy.settings import Settings
from repairproxy.textcalls import promote_calls, read_text_calls
from tests.support.in_process import in_process_proxy
from tests.support.mock_transport import MockTransport
from tests.support.scripted_upstream import completion

CORPUS = Path(__file__).resolve().parent.parent / "data" / "textcalls" / "native"
HOSTILE = CORPUS.parent / "hostile.jsonl"


@cache
def _corpus() -> dict[str, tuple[dict[str, Any], ...]]:
    families = {}
    for path in sorted(CORPUS.glob("*.jsonl")):
        with path.open(encoding="utf-8") as handle:
            families[path.stem] = tuple(json.loads(line) for line in handle if line.strip())
    return families


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _rest(text: str, matches: list[NativeMatch]) -> str | None:
    """What stays in ``content``: the text less every match's cuts, pieces trimmed."""
    pieces = []
    position = 0
    for start, end in sorted(cut for match in matches for cut in match.cuts):
        pieces.append(text[position:start])
        position = max(position, end)
    pieces.append(text[position:])
    return "\n".join(piece.strip() for piece in pieces if piece.strip()) or None


def _normalised(text: str | None) -> str:
    return " ".join((text or "").split())


def _exact(case: dict[str, Any]) -> bool:
    matches = find_native_calls(case["text"], case["tools"])
    got = [_canonical((c.name, c.arguments)) for m in matches for c in m.calls]
    expected = [_canonical((c["name"], c["arguments"])) for c in case["expected_calls"]]
    if got != expected:
        return False
    rest = _rest(case["text"], matches)
    expected_text = case["expected_content"] or ""
    if any(m in (rest or "") and m not in expected_text for m in case.get("wrapper_markers", ())):
        return False
    return _normalised(rest) == _normalised(case["expected_content"])


def _positives(family: str) -> list[dict[str, Any]]:
    return [case for case in _corpus()[family] if case["expected_calls"]]


@pytest.mark.parametrize("family", [f for f in sorted(_corpus()) if _positives(f)])
def test_each_family_is_read_exactly(family: str) -> None:
    cases = _positives(family)
    missed = [case["id"] for case in cases if not _exact(case)]
    assert (len(cases) - len(missed)) / len(cases) >= 0.9, missed


def test_the_whole_corpus_is_read_exactly() -> None:
    cases = [case for family in _corpus() for case in _positives(family)]
    exact = sum(_exact(case) for case in cases)
    assert len(cases) > 400
    assert exact / len(cases) >= 0.95, f"{exact}/{len(cases)}"


def test_no_negative_yields_a_call_to_a_declared_tool() -> None:
    negatives = [
        case for cases in _corpus().values() for case in cases if not case["expected_calls"]
    ]
    assert len(negatives) > 50
    false = []
    for case in negatives:
        declared = {tool["function"]["name"] for tool in case["tools"]}
        calls = [c.name for m in find_native_calls(case["text"], case["tools"]) for c in m.calls]
        if any(name in declared for name in calls):
            false.append((case["id"], calls))
    assert false == []


def test_marker_stripped_variants_are_read() -> None:
    stripped = [c for cases in _corpus().values() for c in cases if c.get("marker_stripped")]
    assert len(stripped) > 100
    assert sum(_exact(case) for case in stripped) / len(stripped) >= 0.95


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "hourly": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
                },
            },
        },
    }
]


@pytest.mark.parametrize(
    "text",
    [
        '<minimax:tool_call><invoke name="get_weather"><parameter name="city">7</parameter>'
        '<parameter name="days">5</parameter><parameter name="hourly">true</parameter>'
        "</invoke></minimax:tool_call>",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>7</arg_value>"
        "<arg_key>days</arg_key><arg_value>5</arg_value>"
        "<arg_key>hourly</arg_key><arg_value>true</arg_value></tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n7\n</parameter>\n"
        "<parameter=days>\n5\n</parameter>\n<parameter=hourly>\ntrue\n</parameter>\n</function>\n"
        "</tool_call>",
    ],
    ids=["minimax", "glm", "qwen3_xml"],
)
def test_values_written_as_text_are_typed_by_the_schema(text: str) -> None:
    (match,) = find_native_calls(text, WEATHER_TOOLS)
    (call,) = match.calls
    assert call.arguments == {"city": "7", "days": 5, "hourly": True}
    assert not call.string_values
    untyped = find_native_calls(text)[0].calls[0]
    assert untyped.string_values
    assert untyped.arguments["days"] == "5"


def test_registry_labels_are_bounded_and_markers_known() -> None:
    assert "other" in FAMILIES
    assert {VARIANT_OF.get(family, family) for family in RECOGNISERS} <= set(FAMILIES)
    assert not set(VARIANT_OF) & set(FAMILIES)
    markers = opening_markers()
    for marker in ("[TOOL_CALLS]", "<|tool_call>", "<minimax:tool_call>", "<|python_start|>"):
        assert marker in markers
    assert len(markers) == len(set(markers))


def test_each_gate_holds_wherever_its_recogniser_reads_a_call() -> None:
    """The gates only skip work: a recogniser run without its gate finds nothing it filters."""
    assert set(GATES) == set(RECOGNISERS)
    texts = [case for cases in _corpus().values() for case in cases]
    read = 0
    for case in texts:
        schemas = {
            t["function"]["name"]: t["function"].get("parameters", {}) for t in case["tools"]
        }
        for family, recognise in RECOGNISERS.items():
            for tools in (schemas, None):
                if any(m.calls for m in recognise(Scanner(case["text"]), tools)):
                    read += 1
                    assert GATES[family](case["text"], tools), (family, case["id"])
    assert read >= 465


def _every_recogniser(text: str, schemas: dict[str, Any] | None) -> list[NativeMatch]:
    """``find_native_calls`` with no gate, sweep or skip: every recogniser runs on the text."""
    scanner = Scanner(text)
    taken: list[NativeMatch] = []
    for recognise in RECOGNISERS.values():
        for match in recognise(scanner, schemas):
            if match.calls and not any(match.start < m.end and m.start < match.end for m in taken):
                taken.append(match)
    return sorted(taken, key=lambda match: match.start)[:32]


def test_the_marker_sweep_changes_no_reading() -> None:
    """Gates, the marker sweep and the taken-marker rule only skip work: on every corpus text
    (native and hostile), with and without the tools, the matches are those of running every
    recogniser."""
    texts = [(c["text"], c["tools"]) for cases in _corpus().values() for c in cases]
    for folder in ("templates", "outside"):  # what the families' templates and other suites write
        for path in sorted((CORPUS.parent / folder).glob("*.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                case = json.loads(line)
                texts.append((case["text"], case["tools"]))
    with HOSTILE.open(encoding="utf-8") as handle:
        hostile = [json.loads(line) for line in handle if line.strip()]
    texts += [(c["content"], c["request"].get("tools", [])) for c in hostile]
    for text, tools in texts:
        schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
        for declared in (schemas, None):
            assert find_native_calls(text, declared) == _every_recogniser(text, declared), text


# --- linear detection ----------------------------------------------------------------------------

ADVERSARIAL = {
    "unclosed tags": '<tool_call><|tool_call>call:f{a:<|"|>x <minimax:tool_call><invoke name="f">',
    "openers only": "<|tool_calls_section_begin|><|tool_call_begin|>[TOOL_CALLS]<function=f>",
    "nested brackets": "[[[[{{{{((((",
    "pythonic lists": "[f(a=1), g(b='x')] [h(",
    "quotes in prose": "it's [a(b='c) don't {\"x\": [\"",
    "deepseek": "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{",
    "invokes": '<steptml:invoke name="f"><steptml:parameter name="k">v',
    "gemma bare": 'call:f{a:<|"|>',
    "kimi stripped": 'functions.f:0 {"a": ',
    "gemma unclosed": "call:f{a:[b:{c:",
    "mistral markers": "[TOOL_CALLS]x ",
    "harmony": "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{",
    "minicpm": '<function name="f"><param name="k">v <function name="g">{',
    "functionary": '>>>f\n{"a": >>>all\nx ',
    "python tag": "<|python_tag|>f.call(a='x <|python_tag|>{",
    "gigachat": "<|function_call|>{ function call<|role_sep|>[",
    "wrappers": "<tool>{<json>[<response>{",
    "solar": "<|tool_call:begin|>1<|tool_call:name|>f<|tool_call:args|>{",
    "kimi k3": (
        '<|open|>tools<|sep|><|open|>call tool="f"<|sep|><|open|>argument key="k" type="string"'
        "<|sep|>"
    ),
    "tool_call pythonic": "<tool_call>f(a='x</tool_call><tool_call>to=functions.f json {",
    "lfm2 unopened": "[f(a='x)]<|tool_call_end|>",
    "nemotron": "<TOOLCALL>[{",
}


def _steps(text: str) -> int:
    scanner = Scanner(text)
    find_native_calls(text, WEATHER_TOOLS, scanner=scanner)
    return scanner.steps


@pytest.mark.parametrize("unit", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_detection_is_linear_in_the_text(unit: str) -> None:
    small, large = unit * 200, unit * 1600
    small_steps, large_steps = _steps(small), _steps(large)
    assert large_steps <= 80 * len(large)  # a bounded number of passes over the text
    assert large_steps <= 10 * small_steps  # 8x the text, not 64x the steps


def test_a_text_with_no_marker_costs_a_few_passes() -> None:
    prose = "The weather in Paris is mild today, with light rain expected later. " * 500
    # One sweep for every gate's markers (a search per first character, then per marker of the
    # characters found), not one search per recogniser, and no recogniser runs.
    assert _steps(prose) <= 16 * len(prose) < len(RECOGNISERS) * len(prose)
    assert find_native_calls(prose, WEATHER_TOOLS) == []


def test_only_the_recognisers_whose_markers_occur_run() -> None:
    text = 'I will look that up.\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
    scanner = Scanner(text)
    (match,) = find_native_calls(text, WEATHER_TOOLS, scanner=scanner)
    assert match.family == "json"
    skipped = Scanner(text)
    assert find_native_calls(text, WEATHER_TOOLS, scanner=skipped, skip={"json"}) == []
    # With the one recogniser whose marker is there skipped, only the sweep is left.
    assert skipped.steps <= 16 * len(text)
    assert skipped.steps < scanner.steps


def test_a_marker_inside_a_match_taken_already_is_not_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    once = Scanner(text)
    (match,) = find_native_calls(text, WEATHER_TOOLS, scanner=once)
    assert (match.family, match.calls[0].arguments) == ("qwen3_xml", {"city": "Paris"})
    monkeypatch.setattr("repairproxy.native.registry._STARTS_AT", {})
    twice = Scanner(text)
    assert find_native_calls(text, WEATHER_TOOLS, scanner=twice) == [match]
    assert once.steps < twice.steps  # the bare ``<function=`` reader did not run


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        # harmony's final message after the call is the answer's prose
        (
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            '{"city": "Paris"}<|call|><|start|>assistant<|channel|>final<|message|>'
            "Checking Paris now.<|end|>",
            "Checking Paris now.",
        ),
        # what a Mistral model writes between ``[TOOL_CALLS]`` and its list stays
        (
            '[TOOL_CALLS] Sure, checking: [{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}]',
            "Sure, checking:",
        ),
    ],
    ids=["harmony final message", "mistral text after the marker"],
)
def test_prose_inside_a_match_stays_when_the_call_is_promoted(text: str, kept: str) -> None:
    schemas = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}}}
    reading = read_text_calls(text, tools=schemas)
    assert [(c.name, c.arguments) for c in reading.calls] == [("get_weather", {"city": "Paris"})]
    promoted = promote_calls({"role": "assistant", "content": text}, reading.calls)
    assert promoted["content"] == kept
    assert [e["function"]["name"] for e in promoted["tool_calls"]] == ["get_weather"]


# --- through the proxy, buffered and streamed ----------------------------------------------------


def _representatives() -> Iterator[Any]:
    """One clean case per recogniser: exact, no stripped marker, preferably opening with its
    marker (a stream that opens with prose sends the prose before the gate sees a call) and
    ending with its call (prose after a call makes it not a call, by the promotion rules)."""
    chosen: dict[str, dict[str, Any]] = {}
    markers = opening_markers()
    for cases in _corpus().values():
        for case in cases:
            if not case["expected_calls"] or case.get("marker_stripped") or not _exact(case):
                continue
            matches = find_native_calls(case["text"], case["tools"])
            label = matches[0].family
            rank = (
                case["text"].lstrip().startswith(markers),
                not case["text"][matches[-1].end :].strip(),
            )
            if label not in chosen or rank > chosen[label]["rank"]:
                chosen[label] = {"case": case, "rank": rank}
    for label, choice in sorted(chosen.items()):
        yield pytest.param(choice["case"], id=f"{label}:{choice['case']['family']}")


def _chat_body(case: dict[str, Any], stream: bool) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "Go."}],
        "tools": case["tools"],
        "stream": stream,
    }


async def _through_the_proxy(
    case: dict[str, Any], stream: bool
) -> tuple[list[tuple[str, Any]], str | None]:
    """The calls and content the official client gets for ``case``'s answer (``repair=promote``)."""
    transport = MockTransport(completion(content=case["text"]))
    settings = Settings(upstream="http://mock/v1", repair="promote")
    async with in_process_proxy(settings, transport) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="k", http_client=proxy.http)
        if not stream:
            answer = await client.chat.completions.create(**_chat_body(case, False))
            message = answer.choices[0].message
            calls = [
                (call.function.name, json.loads(call.function.arguments))
                for call in message.tool_calls or ()
            ]
            return calls, message.content
        chunks = await client.chat.completions.create(**_chat_body(case, True))
        content = ""
        arguments: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        async for chunk in chunks:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for call in delta.tool_calls or ():
                if call.function and call.function.name:
                    names[call.index] = call.function.name
                if call.function and call.function.arguments:
                    arguments.setdefault(call.index, []).append(call.function.arguments)
        calls = [(names[i], json.loads("".join(arguments.get(i, ["{}"])))) for i in names]
        return calls, content or None


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("case", list(_representatives()))
async def test_through_the_proxy_the_call_is_structured_and_no_wrapper_stays(
    case: dict[str, Any], stream: bool
) -> None:
    calls, text = await _through_the_proxy(case, stream)
    expected = [(call["name"], call["arguments"]) for call in case["expected_calls"]]
    assert [_canonical(c) for c in calls] == [_canonical(c) for c in expected]
    if stream and not case["text"].lstrip().startswith(opening_markers()):
        return  # prose streamed out before the marker: the wrapper went with it, as text
    expected_text = case["expected_content"] or ""
    for marker in case.get("wrapper_markers", ()):
        assert marker not in (text or "") or marker in expected_text


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
async def test_through_the_proxy_prose_inside_a_match_reaches_the_client(stream: bool) -> None:
    case = {
        "text": "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris"}<|call|><|start|>assistant<|channel|>final<|message|>'
        "Checking Paris now.<|end|>",
        "tools": WEATHER_TOOLS,
    }
    calls, text = await _through_the_proxy(case, stream)
    assert calls == [("get_weather", {"city": "Paris"})]
    assert text == "Checking Paris now."


@pytest.mark.anyio
async def test_the_promoted_format_reaches_the_client_as_a_header() -> None:
    text = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
    case = {"tools": WEATHER_TOOLS}
    transport = MockTransport(completion(content=text))
    settings = Settings(upstream="http://mock/v1", repair="promote")
    async with in_process_proxy(settings, transport) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="k", http_client=proxy.http)
        raw = await client.chat.completions.with_raw_response.create(**_chat_body(case, False))
    assert raw.headers["x-repairproxy-promoted"] == "1"
    assert raw.headers["x-repairproxy-promoted-format"] == "gemma4"
    assert raw.parse().choices[0].message.tool_calls is not None


# --- the format label on promotions --------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "source", "label"),
    [
        ("native", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', "gemma4"),
        ("native", "[get_weather(city='Paris')]", "pythonic"),
        ("native", '[TOOL_CALLS]get_weather{"city": "Paris"}', "mistral"),
        (
            "native",
            "<function=get_weather><parameter=city>Paris</parameter></function>",
            "qwen3_xml",
        ),
        ("native", "no call here", "other"),
        ("tool_call_tag", '<tool_call>{"name": "f", "arguments": {}}</tool_call>', "hermes"),
        ("json", '{"name": "f", "arguments": {}}', "json"),
        ("something new", "...", "other"),
    ],
)
def test_a_promoted_call_gets_a_bounded_format_label(shape: str, source: str, label: str) -> None:
    assert promoted_format(shape, source) == label
    assert label in FAMILIES


def test_the_format_label_reaches_metrics_header_and_log_line() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(Settings(), registry=registry)
    record = RequestRecord(model="m", promoted=3, promoted_formats=["gemma4", "gemma4", "bogus"])
    metrics.request_finished(record)

    def value(label: str) -> float | None:
        return registry.get_sample_value(
            "repairproxy_promoted_tool_call_formats_total", {"model": "m", "format": label}
        )

    assert value("gemma4") == 2
    assert value("other") == 1  # an unknown label never becomes a series of its own
    assert value("bogus") is None
    exchange = Exchange(0.0, "POST", "/v1/chat/completions", record=record)
    headers = dict(exchange.proxy_headers())
    assert headers[b"x-repairproxy-promoted-format"] == b"gemma4,bogus"
    assert exchange.log_event(200, log_bodies=False)["promoted_format"] == "gemma4,bogus"
    assert b"promoted-format=gemma4,bogus" in exchange.trailer_comment()
    quiet = Exchange(0.0, "POST", "/v1/chat/completions", record=RequestRecord(model="m"))
    assert b"x-repairproxy-promoted-format" not in dict(quiet.proxy_headers())
