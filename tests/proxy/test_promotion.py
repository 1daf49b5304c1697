"""Promotion of tool calls written as text, through ``repair_completion`` with a fake upstream seam.

Table-driven over every shape; undeclared names and bad arguments go to a re-ask with the right
diagnosis; prose that merely holds JSON stays text; ``tool_choice: "none"`` leaves text alone.
"""

from __future__ import annotations

import copy
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageToolCall

from repairproxy.observe.record import CaughtCall
from repairproxy.repair import RepairPolicy, repair_completion
from repairproxy.types import OnExhausted, RepairMode
from repairproxy.validation import Channel, CompiledTools, ToolsCache
from tests.proxy.conftest import StartProxy
from tests.support.proxy_server import RunningProxy
from tests.support.scripted_upstream import ScriptedUpstream, tool_call
from tests.support.scripted_upstream import completion as sse_completion
from tests.support.tools import GET_ORDER, MESSAGES
from tests.support.tools import TOOLS as PROXY_TOOLS

TOOLS = [
    GET_ORDER,
    {
        "type": "function",
        "function": {
            "name": "set_quantity",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}, "count": {"type": "integer"}},
                "required": ["item", "count"],
            },
        },
    },
]
BODY: dict[str, Any] = {
    "model": "m",
    "tools": TOOLS,
    "messages": [{"role": "user", "content": "Where is order #W1?"}],
    "temperature": 0.4,
}
DETAILS = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'


@pytest.fixture(scope="module")
def tools() -> CompiledTools:
    compiled = ToolsCache().compile(BODY)
    assert compiled is not None
    return compiled


def completion(content: str | None, *calls: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def call(name: str, arguments: dict[str, Any], call_id: str = "call_s") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }


class ScriptedSend:
    def __init__(self, *responses: dict[str, Any]) -> None:
        self.responses = list(responses)
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(copy.deepcopy(request))
        return self.responses.pop(0)


def _message(outcome: Any) -> dict[str, Any]:
    message: dict[str, Any] = outcome.response["choices"][0]["message"]
    return message


def _calls(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (c["function"]["name"], orjson.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or ()
    ]


W1 = {"order_id": "#W1"}
# (case id, content, calls expected after promotion, prose expected to remain)
PROMOTED: list[tuple[str, str, list[tuple[str, dict[str, Any]]], str | None]] = [
    ("bare json", DETAILS, [("get_order_details", W1)], None),
    (
        "parameters key",
        DETAILS.replace("arguments", "parameters"),
        [("get_order_details", W1)],
        None,
    ),
    ("tool_call tag", f"<tool_call>\n{DETAILS}\n</tool_call>", [("get_order_details", W1)], None),
    ("fenced json", f"```json\n{DETAILS}\n```", [("get_order_details", W1)], None),
    (
        "function xml, typed parameter",
        "<function=set_quantity>\n<parameter=item>\nmug\n</parameter>\n"
        "<parameter=count>\n3\n</parameter>\n</function>",
        [("set_quantity", {"item": "mug", "count": 3})],
        None,
    ),
    (
        "legacy function_call",
        '{"function_call": {"name": "get_order_details", '
        '"arguments": "{\\"order_id\\": \\"#W1\\"}"}}',
        [("get_order_details", W1)],
        None,
    ),
    (
        "parallel list",
        f'[{DETAILS}, {{"name": "set_quantity", "arguments": {{"item": "mug", "count": 2}}}}]',
        [("get_order_details", W1), ("set_quantity", {"item": "mug", "count": 2})],
        None,
    ),
    (
        "parallel tags",
        f"<tool_call>{DETAILS}</tool_call>\n<tool_call>{DETAILS.replace('#W1', '#W2')}</tool_call>",
        [("get_order_details", W1), ("get_order_details", {"order_id": "#W2"})],
        None,
    ),
    (
        "prose around",
        f"Let me look that up.\n{DETAILS}\nOne moment please.",
        [("get_order_details", W1)],
        "Let me look that up.\nOne moment please.",
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "expected", "prose"), [c[1:] for c in PROMOTED], ids=[c[0] for c in PROMOTED]
)
@pytest.mark.parametrize("mode", [RepairMode.PROMOTE, RepairMode.REFLEXIVE, RepairMode.CONSTRAINED])
async def test_text_calls_are_promoted_without_an_upstream_call(
    tools: CompiledTools,
    mode: RepairMode,
    content: str,
    expected: list[tuple[str, dict[str, Any]]],
    prose: str | None,
) -> None:
    first = completion(content)
    before = copy.deepcopy(first)
    send = ScriptedSend()
    outcome = await repair_completion(BODY, first, tools, RepairPolicy(mode=mode), send)
    assert send.requests == []
    assert first == before
    message = _message(outcome)
    assert _calls(message) == expected
    assert message["content"] == prose
    assert outcome.response["choices"][0]["finish_reason"] == "tool_calls"
    ids = [c["id"] for c in message["tool_calls"]]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == len(ids)
    assert outcome.promoted == len(expected) and outcome.attempts == 0
    assert not outcome.exhausted and outcome.delivered_invalid == ()
    # Promotion hides nothing: each text call is still counted once, as tool_call_in_content.
    assert outcome.caught_channels == (Channel.TOOL_CALL_IN_CONTENT,) * len(expected)
    assert outcome.caught_calls == (CaughtCall("tool_call_in_content", "text"),) * len(expected)
    assert outcome.response["usage"] == first["usage"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "content",
    [
        "Your order #W1 shipped yesterday.",
        'The API answered {"status": "shipped", "name": "box"} for #W1.',
        '{"order_id": "#W1", "status": "shipped"}',
        "```python\nget_order_details(order_id='#W1')\n```",
    ],
)
async def test_prose_holding_json_is_not_a_call(tools: CompiledTools, content: str) -> None:
    first = completion(content)
    send = ScriptedSend()
    policy = RepairPolicy(mode=RepairMode.REFLEXIVE)
    outcome = await repair_completion(BODY, first, tools, policy, send)
    assert outcome.response == first and outcome.caught_channels == () and send.requests == []


@pytest.mark.anyio
async def test_undeclared_name_is_not_promoted_and_counts_as_invented(
    tools: CompiledTools,
) -> None:
    first = completion('{"name": "track_package", "arguments": {"order_id": "#W1"}}')
    outcome = await repair_completion(
        BODY, first, tools, RepairPolicy(mode=RepairMode.PROMOTE), ScriptedSend()
    )
    assert outcome.response == first  # pass: delivered as it came
    assert outcome.promoted == 0 and outcome.exhausted
    assert outcome.caught_calls == (
        CaughtCall("tool_call_in_content", "text", "track_package", "unknown_tool"),
    )
    (delivered,) = outcome.delivered_invalid
    assert delivered.inner is Channel.UNKNOWN_TOOL


@pytest.mark.anyio
async def test_undeclared_name_is_re_asked_with_the_unknown_tool_diagnosis(
    tools: CompiledTools,
) -> None:
    first = completion('{"name": "track_package", "arguments": {"order_id": "#W1"}}')
    send = ScriptedSend(completion(None, call("get_order_details", W1, "call_new")))
    outcome = await repair_completion(BODY, first, tools, RepairPolicy(), send)
    (request,) = send.requests
    assistant, user = request["messages"][-2:]
    assert assistant == {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    assert user["role"] == "user"
    assert "'track_package' does not exist" in user["content"]
    assert "as text" in user["content"] and "get_order_details" in user["content"]
    assert _calls(_message(outcome)) == [("get_order_details", W1)]
    assert outcome.attempts == 1 and not outcome.exhausted and outcome.promoted == 0


@pytest.mark.anyio
async def test_bad_arguments_are_re_asked_with_the_schema_diagnosis(tools: CompiledTools) -> None:
    first = completion('{"name": "set_quantity", "arguments": {"item": "mug", "count": "two"}}')
    send = ScriptedSend(
        completion('{"name": "set_quantity", "arguments": {"item": "mug", "count": 2}}')
    )
    outcome = await repair_completion(BODY, first, tools, RepairPolicy(), send)
    diagnosis = send.requests[0]["messages"][-1]["content"]
    assert "$.count" in diagnosis and "count (integer, required)" in diagnosis
    # The re-ask's answer was written as text again, validly: promoted, no third call.
    assert _calls(_message(outcome)) == [("set_quantity", {"item": "mug", "count": 2})]
    assert outcome.attempts == 1 and outcome.promoted == 1
    assert outcome.caught_calls == (CaughtCall("tool_call_in_content", "text", None, "schema"),)


@pytest.mark.anyio
async def test_a_valid_text_call_is_kept_while_its_invalid_sibling_is_re_asked(
    tools: CompiledTools,
) -> None:
    invented = '{"name": "track_package", "arguments": {"order_id": "#W1"}}'
    first = completion(f"{DETAILS}\n{invented}")
    send = ScriptedSend(completion(None, call("set_quantity", {"item": "a", "count": 1}, "call_x")))
    outcome = await repair_completion(BODY, first, tools, RepairPolicy(), send)
    messages = send.requests[0]["messages"]
    assistant, kept_reply, user = messages[-3:]
    assert assistant["content"] == invented  # the promoted call's text left the content
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["get_order_details"]
    assert kept_reply["role"] == "tool" and "kept" in kept_reply["content"]
    assert user["role"] == "user" and "track_package" in user["content"]
    assert [n for n, _ in _calls(_message(outcome))] == ["get_order_details", "set_quantity"]
    assert _message(outcome)["content"] is None
    assert outcome.promoted == 1 and outcome.attempts == 1


@pytest.mark.anyio
async def test_calls_written_together_are_promoted_together_or_not_at_all(
    tools: CompiledTools,
) -> None:
    first = completion(f'[{DETAILS}, {{"name": "track_package", "arguments": {{}}}}]')
    outcome = await repair_completion(
        BODY, first, tools, RepairPolicy(mode=RepairMode.PROMOTE), ScriptedSend()
    )
    assert outcome.promoted == 0 and outcome.response == first
    assert [c.channel for c in outcome.first_verdict.calls] == [Channel.TOOL_CALL_IN_CONTENT] * 2
    assert [c.inner for c in outcome.first_verdict.calls] == [
        Channel.VALID,
        Channel.UNKNOWN_TOOL,
    ]


@pytest.mark.anyio
async def test_tool_choice_none_leaves_text_alone(tools: CompiledTools) -> None:
    body = {**BODY, "tool_choice": "none"}
    first = completion(DETAILS)
    send = ScriptedSend()
    outcome = await repair_completion(body, first, tools, RepairPolicy(), send)
    assert outcome.response == first and outcome.first_verdict.ok and outcome.caught_channels == ()
    assert send.requests == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", [RepairMode.OFF, RepairMode.PROMPT])
async def test_observing_modes_never_promote(tools: CompiledTools, mode: RepairMode) -> None:
    first = completion(DETAILS)
    outcome = await repair_completion(BODY, first, tools, RepairPolicy(mode=mode), ScriptedSend())
    assert outcome.response == first and outcome.promoted == 0
    assert outcome.caught_channels == (Channel.TOOL_CALL_IN_CONTENT,)


@pytest.mark.anyio
async def test_strip_after_promotion_keeps_prose_and_valid_calls(tools: CompiledTools) -> None:
    first = completion(None, call("nope", {}, "call_bad"))
    send = ScriptedSend(completion(f"Sure. {DETAILS}"))
    policy = RepairPolicy(max_repairs=1, on_exhausted=OnExhausted.STRIP)
    outcome = await repair_completion(BODY, first, tools, policy, send)
    assert not outcome.exhausted and outcome.promoted == 1
    assert _message(outcome)["content"] == "Sure."
    assert _calls(_message(outcome)) == [("get_order_details", W1)]


# --- through a real proxy, with the official openai client ---------------------------------------

ORDER_CALL = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'


def _client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="sk-client", max_retries=0)


@pytest.mark.parametrize(
    "content",
    [
        ORDER_CALL,
        f"<tool_call>\n{ORDER_CALL}\n</tool_call>",
        f"```json\n{ORDER_CALL}\n```",
        "<function=get_order_details>\n<parameter=order_id>\n#W1\n</parameter>\n</function>",
    ],
    ids=["bare", "tagged", "fenced", "xml"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_openai_client_receives_a_normal_tool_call(
    upstream: ScriptedUpstream, start_proxy: StartProxy, content: str, stream: bool
) -> None:
    proxy = start_proxy(repair="promote")
    upstream.push(sse_completion(content=content))
    with _client(proxy) as client:
        if stream:
            raw_stream = client.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES, tools=PROXY_TOOLS, stream=True
            )
            headers = raw_stream.headers
            calls: dict[int, dict[str, str]] = {}
            text = ""
            finish = None
            for chunk in raw_stream.parse():
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    finish = choice.finish_reason or finish
                    for part in choice.delta.tool_calls or ():
                        entry = calls.setdefault(part.index, {"id": "", "name": "", "args": ""})
                        entry["id"] += part.id or ""
                        if part.function is not None:
                            entry["name"] += part.function.name or ""
                            entry["args"] += part.function.arguments or ""
            assert text == "" and finish == "tool_calls"
            ((name, arguments, call_id),) = [
                (c["name"], c["args"], c["id"]) for c in calls.values()
            ]
        else:
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES, tools=PROXY_TOOLS
            )
            headers = raw.headers
            reply = raw.parse()
            message = reply.choices[0].message
            assert message.content is None and reply.choices[0].finish_reason == "tool_calls"
            assert message.tool_calls is not None
            (tool,) = message.tool_calls
            assert isinstance(tool, ChatCompletionMessageToolCall)
            name, arguments, call_id = tool.function.name, tool.function.arguments, tool.id
    assert name == "get_order_details" and orjson.loads(arguments) == {"order_id": "#W1"}
    assert call_id.startswith("call_")
    assert headers["x-repairproxy-promoted"] == "1"
    assert headers["x-repairproxy-tool-errors"] == "tool_call_in_content"
    assert headers["x-repairproxy-repairs"] == "0"
    assert len(upstream.chat_requests) == 1  # promotion never asks the upstream again


def test_parallel_text_calls_with_prose_reach_the_client_as_calls(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="promote")
    second = ORDER_CALL.replace("#W1", "#W2")
    text = f"I will check both orders.\n<tool_call>{ORDER_CALL}</tool_call>\n<tool_call>{second}"
    upstream.push(sse_completion(content=text + "</tool_call>"))
    with _client(proxy) as client:
        reply = client.chat.completions.create(model="m", messages=MESSAGES, tools=PROXY_TOOLS)
    message = reply.choices[0].message
    assert message.content == "I will check both orders."
    calls = [c for c in message.tool_calls or () if isinstance(c, ChatCompletionMessageToolCall)]
    assert [orjson.loads(c.function.arguments)["order_id"] for c in calls] == ["#W1", "#W2"]
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_an_invented_name_in_text_is_re_asked(
    upstream: ScriptedUpstream, start_proxy: StartProxy, stream: bool
) -> None:
    proxy = start_proxy(repair="reflexive")
    upstream.push(
        sse_completion(content='{"name": "track_package", "arguments": {"order_id": "#W1"}}'),
        sse_completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"})]),
    )
    body = {"model": "m", "messages": MESSAGES, "tools": PROXY_TOOLS, "stream": stream}
    response = httpx.post(proxy.base_url + "/chat/completions", json=body, timeout=30)
    assert response.status_code == 200
    assert response.headers["x-repairproxy-repairs"] == "1"
    assert "x-repairproxy-promoted" not in response.headers
    _, repair = upstream.chat_requests
    assert repair["stream"] is False
    assert "'track_package' does not exist" in repair["messages"][-1]["content"]
    if stream:
        assert b"get_order_details" in response.content and response.content.endswith(
            b"data: [DONE]\n\n"
        )
    else:
        (call,) = response.json()["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_order_details"


@pytest.mark.anyio
async def test_promote_mode_leaves_an_answer_with_nothing_to_promote_as_it_came(
    tools: CompiledTools,
) -> None:
    first = completion(None, call("track_package", W1, "call_bad"))
    del first["choices"][0]["index"]
    outcome = await repair_completion(
        BODY, first, tools, RepairPolicy(mode=RepairMode.PROMOTE), ScriptedSend()
    )
    assert outcome.response == first and outcome.exhausted and outcome.attempts == 0
    assert [c.call_id for c in outcome.delivered_invalid] == ["call_bad"]
    assert outcome.caught_calls == (CaughtCall("unknown_tool", "structured", "track_package"),)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "formats"),
    [
        (DETAILS, ("json",)),
        (f"<tool_call>{DETAILS}</tool_call>", ("hermes",)),
        ('<|tool_call>call:get_order_details{order_id:<|"|>#W1<|"|>}<tool_call|>', ("gemma4",)),
        (f"[TOOL_CALLS][{DETAILS}, {DETAILS.replace('#W1', '#W2')}]", ("mistral", "mistral")),
        ("get_order_details(order_id='#W1')", ("granite_pythonic",)),
        ("I will not run it.", ()),
    ],
    ids=["json", "hermes", "gemma4", "mistral list", "granite bare line", "nothing promoted"],
)
async def test_each_promoted_call_carries_its_format_label(
    tools: CompiledTools, content: str, formats: tuple[str, ...]
) -> None:
    outcome = await repair_completion(
        BODY, completion(content), tools, RepairPolicy(mode=RepairMode.PROMOTE), ScriptedSend()
    )
    assert outcome.promoted == len(formats)
    assert outcome.promoted_formats == formats
