"""Tests of the repair builders and the bounded loop, with a scripted fake ``send`` at the seam."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from repairproxy.errors import RepairExhaustedError, UpstreamTimeoutError, UpstreamUnavailableError
from repairproxy.repair import (
    DEFAULT_TEMPLATE,
    MAX_NAME_EDITS,
    RepairPolicy,
    RepairTemplate,
    build_repair_turn,
    edit_distance,
    repair_completion,
    with_repair_instruction,
)
from repairproxy.types import OnExhausted, RepairMode
from repairproxy.validation import Channel, CompiledTools, ToolsCache
from tests.support.tools import CANCEL_ORDER, GET_ORDER

TOOLS = [GET_ORDER, CANCEL_ORDER]

BODY: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "stream_options": {"include_usage": True},
    "tools": TOOLS,
    "messages": [
        {"role": "system", "content": "You are a retail agent."},
        {"role": "user", "content": "Where is order #W1?"},
    ],
    "temperature": 0.0,
}


@pytest.fixture(scope="module")
def tools() -> CompiledTools:
    compiled = ToolsCache().compile(BODY)
    assert compiled is not None
    return compiled


def call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def completion(
    *calls: dict[str, Any], content: str | None = None, prompt: int = 10, completion: int = 5
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "completion_tokens_details": {"reasoning_tokens": 1},
        },
    }


class ScriptedSend:
    """The upstream seam: returns scripted completions in order and records every request."""

    def __init__(self, *responses: dict[str, Any]) -> None:
        self.responses = list(responses)
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(copy.deepcopy(request))
        return self.responses.pop(0)


VALID = call("get_order_details", '{"order_id": "#W1"}', "call_ok")
HALLUCINATED = call("get_order_status", '{"order_id": "#W1"}', "call_bad")
# Within MAX_NAME_EDITS of a declared tool: a misspelling constrained may force.
MISSPELLED = call("get_order_detail", '{"order_id": "#W1"}', "call_typo")
REPAIRED = call("get_order_details", '{"order_id": "#W1"}', "call_new")


# --- the system instruction ----------------------------------------------------------------------


def test_instruction_is_appended_to_the_system_prompt() -> None:
    before = copy.deepcopy(BODY)
    result = with_repair_instruction(BODY, DEFAULT_TEMPLATE)
    assert before == BODY
    system = result["messages"][0]["content"]
    assert system.startswith("You are a retail agent.")
    assert system.endswith(DEFAULT_TEMPLATE.instruction)
    assert "re-issue a valid call to a listed tool" in system
    assert result["messages"][1:] == BODY["messages"][1:]
    # Idempotent: an agent resending the instructed prompt does not get it twice.
    assert with_repair_instruction(result, DEFAULT_TEMPLATE) == result


def test_instruction_inserts_a_system_message_when_there_is_none() -> None:
    body: dict[str, Any] = {"tools": TOOLS, "messages": [{"role": "user", "content": "hi"}]}
    result = with_repair_instruction(body, DEFAULT_TEMPLATE)
    assert result["messages"][0] == {"role": "system", "content": DEFAULT_TEMPLATE.instruction}
    assert len(body["messages"]) == 1


def test_instruction_extends_content_parts() -> None:
    body = {
        "functions": [],
        "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}]}],
    }
    result = with_repair_instruction(body, DEFAULT_TEMPLATE)
    assert result["messages"][0]["content"][-1]["text"] == DEFAULT_TEMPLATE.instruction
    assert len(body["messages"][0]["content"]) == 1


def test_no_instruction_without_tools() -> None:
    body = {"messages": [{"role": "system", "content": "simulate a user"}]}
    assert with_repair_instruction(body, DEFAULT_TEMPLATE) == body


def test_malformed_messages_are_left_alone() -> None:
    body = {"tools": TOOLS, "messages": "not a list"}
    assert with_repair_instruction(body, DEFAULT_TEMPLATE) == body


# --- the repair turn -----------------------------------------------------------------------------


def test_repair_turn_answers_every_call_with_its_id(tools: CompiledTools) -> None:
    wrong_enum = call("cancel_pending_order", '{"order_id": "#W1", "reason": "bored"}', "c3")
    message = completion(VALID, HALLUCINATED, wrong_enum)["choices"][0]["message"]
    verdict = tools.check_message(message)
    turn, kept = build_repair_turn(message, verdict, tools, DEFAULT_TEMPLATE)
    assert turn[0]["role"] == "assistant"
    assert [c["id"] for c in turn[0]["tool_calls"]] == ["call_ok", "call_bad", "c3"]
    replies = turn[1:]
    assert [r["role"] for r in replies] == ["tool"] * 3
    assert [r["tool_call_id"] for r in replies] == ["call_ok", "call_bad", "c3"]
    assert kept == [VALID]
    assert not replies[0]["content"].startswith("Error")
    unknown = replies[1]["content"]
    # get_order_status is no misspelling of a listed tool: no "closest tool" is suggested, and
    # the model is told it may answer in text.
    assert "get_order_status" in unknown and "not a misspelling of a listed tool" in unknown
    assert "closest" not in unknown and "plain text" in unknown
    assert "cancel_pending_order" in unknown  # the declared names are listed
    schema = replies[2]["content"]
    assert "$.reason" in schema and "ordered by mistake" in schema
    assert "order_id (string, required)" in schema
    assert DEFAULT_TEMPLATE.version in schema


def test_repair_turn_fills_missing_call_ids(tools: CompiledTools) -> None:
    no_id = {"type": "function", "function": {"name": "nope", "arguments": "{}"}}
    message = {"role": "assistant", "content": None, "tool_calls": [no_id]}
    turn, _ = build_repair_turn(message, tools.check_message(message), tools, DEFAULT_TEMPLATE)
    assert turn[0]["tool_calls"][0]["id"] == turn[1]["tool_call_id"]
    assert "id" not in no_id


@pytest.mark.parametrize(
    ("content", "roles", "fragment"),
    [
        (
            '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}',
            ["assistant", "user"],
            "tool-calling interface",
        ),
        ("", ["user"], "was empty"),
    ],
)
def test_silent_failure_repairs(
    tools: CompiledTools, content: str, roles: list[str], fragment: str
) -> None:
    message = {"role": "assistant", "content": content}
    turn, kept = build_repair_turn(message, tools.check_message(message), tools, DEFAULT_TEMPLATE)
    assert [m["role"] for m in turn] == roles
    assert fragment in turn[-1]["content"]
    assert kept == []


# --- the loop ------------------------------------------------------------------------------------


async def _repair(
    tools: CompiledTools, first: dict[str, Any], send: ScriptedSend, **policy: Any
) -> Any:
    return await repair_completion(BODY, first, tools, RepairPolicy(**policy), send)


@pytest.mark.anyio
async def test_hallucinated_name_repaired_on_first_attempt(tools: CompiledTools) -> None:
    first = completion(HALLUCINATED, prompt=100, completion=7)
    send = ScriptedSend(completion(REPAIRED, prompt=130, completion=9))
    outcome = await _repair(tools, first, send)
    assert outcome.attempts == 1
    assert not outcome.exhausted
    assert outcome.caught_channels == (Channel.UNKNOWN_TOOL,)
    assert outcome.first_verdict.error_channels == (Channel.UNKNOWN_TOOL,)
    assert outcome.response["choices"][0]["message"]["tool_calls"] == [REPAIRED]
    usage = outcome.response["usage"]
    assert usage["prompt_tokens"] == 230
    assert usage["completion_tokens"] == 16
    assert usage["total_tokens"] == 246
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 2}
    (request,) = send.requests
    assert request["stream"] is False and "stream_options" not in request
    assert "tool_choice" not in request
    assert request["messages"][:2] == BODY["messages"]
    assistant, tool_reply = request["messages"][2:]
    assert assistant["tool_calls"] == [HALLUCINATED]
    assert tool_reply["tool_call_id"] == "call_bad"
    assert "get_order_details" in tool_reply["content"]


@pytest.mark.anyio
async def test_schema_violation_repaired(tools: CompiledTools) -> None:
    broken = call("cancel_pending_order", '{"order_id": 1}', "c1")
    fixed = call("cancel_pending_order", '{"order_id": "1", "reason": "no longer needed"}', "c2")
    send = ScriptedSend(completion(fixed))
    outcome = await _repair(tools, completion(broken), send)
    assert outcome.caught_channels == (Channel.SCHEMA_VIOLATION,)
    assert outcome.response["choices"][0]["message"]["tool_calls"] == [fixed]
    reply = send.requests[0]["messages"][-1]["content"]
    assert "$.order_id" in reply and '"reason" is a required property' in reply


@pytest.mark.anyio
async def test_valid_sibling_calls_are_kept(tools: CompiledTools) -> None:
    # The model re-sends the kept valid call too: the duplicate is dropped.
    other = call("get_order_details", '{"order_id": "#W2"}', "call_other")
    send = ScriptedSend(completion(call("get_order_details", '{ "order_id":"#W1" }', "dup"), other))
    outcome = await _repair(tools, completion(VALID, HALLUCINATED), send)
    choice = outcome.response["choices"][0]
    assert [c["id"] for c in choice["message"]["tool_calls"]] == ["call_ok", "call_other"]
    assert choice["finish_reason"] == "tool_calls"


@pytest.mark.anyio
async def test_kept_call_survives_a_text_answer(tools: CompiledTools) -> None:
    send = ScriptedSend(completion(content="Let me check that order."))
    outcome = await _repair(tools, completion(VALID, HALLUCINATED), send)
    message = outcome.response["choices"][0]["message"]
    assert message["tool_calls"] == [VALID]
    assert message["content"] is None  # text answering a hidden repair turn is dropped
    assert outcome.response["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.anyio
async def test_silent_failures_are_repaired(tools: CompiledTools) -> None:
    in_text = completion(
        content='<tool_call>{"name": "get_order_details", "arguments": {}}</tool_call>'
    )
    send = ScriptedSend(completion(content=""), completion(VALID))
    outcome = await _repair(tools, in_text, send)
    assert outcome.attempts == 2
    assert outcome.caught_channels == (Channel.TOOL_CALL_IN_CONTENT, Channel.EMPTY_OUTPUT)
    assert outcome.response["choices"][0]["message"]["tool_calls"] == [VALID]
    # Attempt 2 carries attempt 1's turn too, and its own diagnosis: every attempt changes.
    first, second = send.requests
    assert second["messages"][: len(first["messages"])] == first["messages"]
    assert second["messages"][-1]["role"] == "user"
    assert "empty" in second["messages"][-1]["content"]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", [RepairMode.OFF, RepairMode.PROMPT])
async def test_observing_modes_never_re_ask(tools: CompiledTools, mode: RepairMode) -> None:
    send = ScriptedSend()
    first = completion(HALLUCINATED)
    outcome = await _repair(tools, first, send, mode=mode)
    assert send.requests == []
    assert outcome.attempts == 0 and not outcome.exhausted
    assert outcome.caught_channels == (Channel.UNKNOWN_TOOL,)
    assert outcome.response == first


@pytest.mark.anyio
async def test_valid_first_answer_is_returned_unchanged(tools: CompiledTools) -> None:
    first = completion(VALID)
    send = ScriptedSend()
    outcome = await _repair(tools, first, send)
    assert outcome.response == first and outcome.attempts == 0 and outcome.caught_channels == ()
    assert send.requests == []


@pytest.mark.anyio
async def test_exhaustion_pass_returns_last_answer(tools: CompiledTools) -> None:
    again = call("get_order_info", "{}", "c9")
    send = ScriptedSend(completion(HALLUCINATED), completion(again))
    outcome = await _repair(tools, completion(HALLUCINATED), send, on_exhausted=OnExhausted.PASS)
    assert outcome.exhausted and outcome.attempts == 2 and len(send.requests) == 2
    assert outcome.caught_channels == (Channel.UNKNOWN_TOOL,) * 3
    assert outcome.response["choices"][0]["message"]["tool_calls"] == [again]
    assert outcome.response["usage"]["total_tokens"] == 45


@pytest.mark.anyio
async def test_exhaustion_strip_drops_invalid_calls(tools: CompiledTools) -> None:
    send = ScriptedSend(completion(HALLUCINATED, content="checking"))
    outcome = await _repair(
        tools, completion(VALID, HALLUCINATED), send, max_repairs=1, on_exhausted=OnExhausted.STRIP
    )
    assert outcome.exhausted
    choice = outcome.response["choices"][0]
    assert choice["message"]["tool_calls"] == [VALID]  # the kept valid call survives
    send = ScriptedSend(completion(HALLUCINATED, content="checking"))
    outcome = await _repair(
        tools, completion(HALLUCINATED), send, max_repairs=1, on_exhausted=OnExhausted.STRIP
    )
    choice = outcome.response["choices"][0]
    assert "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == "checking"
    assert choice["finish_reason"] == "stop"


@pytest.mark.anyio
async def test_exhaustion_error_raises(tools: CompiledTools) -> None:
    send = ScriptedSend(completion(call("get_order_details", "{", "x")))
    with pytest.raises(RepairExhaustedError) as caught:
        await _repair(tools, completion(HALLUCINATED), send, max_repairs=1, on_exhausted="error")
    assert caught.value.attempts == 1
    assert caught.value.channels == ("unknown_tool", "invalid_json")
    assert caught.value.status_code == 502


@pytest.mark.anyio
async def test_zero_repairs_means_exhausted_at_once(tools: CompiledTools) -> None:
    send = ScriptedSend()
    outcome = await _repair(tools, completion(HALLUCINATED), send, max_repairs=0)
    assert outcome.exhausted and outcome.attempts == 0 and send.requests == []


@pytest.mark.anyio
async def test_constrained_escalation_forces_the_closest_tool(tools: CompiledTools) -> None:
    send = ScriptedSend(completion(MISSPELLED), completion(REPAIRED))
    outcome = await _repair(
        tools, completion(MISSPELLED), send, mode=RepairMode.CONSTRAINED, max_repairs=3
    )
    assert outcome.attempts == 2 and not outcome.exhausted
    first, second = send.requests
    assert "tool_choice" not in first
    assert second["tool_choice"] == {"type": "function", "function": {"name": "get_order_details"}}


@pytest.mark.anyio
async def test_constrained_never_forces_a_tool_the_model_did_not_name(
    tools: CompiledTools,
) -> None:
    # get_order_status is 5 edits from get_order_details: another tool, not a misspelling. The
    # model may rightly decline in text (no declared tool fits), so nothing is forced.
    assert edit_distance("getorderstatus", "getorderdetails") > MAX_NAME_EDITS
    send = ScriptedSend(completion(HALLUCINATED), completion(HALLUCINATED), completion(REPAIRED))
    await _repair(tools, completion(HALLUCINATED), send, mode=RepairMode.CONSTRAINED, max_repairs=3)
    assert all("tool_choice" not in request for request in send.requests)


@pytest.mark.anyio
async def test_constrained_escalation_requires_a_call_when_targets_differ(
    tools: CompiledTools,
) -> None:
    two = (MISSPELLED, call("cancel_pending_ordr", "{}", "c2"))
    send = ScriptedSend(completion(*two), completion(REPAIRED))
    await _repair(tools, completion(*two), send, mode=RepairMode.CONSTRAINED)
    assert send.requests[1]["tool_choice"] == "required"


@pytest.mark.anyio
async def test_reflexive_mode_never_forces(tools: CompiledTools) -> None:
    send = ScriptedSend(completion(HALLUCINATED), completion(REPAIRED))
    await _repair(tools, completion(HALLUCINATED), send, mode=RepairMode.REFLEXIVE)
    assert all("tool_choice" not in request for request in send.requests)
    # Each attempt differs: the second carries a second diagnosis with its attempt number.
    assert (
        send.requests[0]["messages"][-1]["content"] != send.requests[1]["messages"][-1]["content"]
    )


@pytest.mark.anyio
async def test_legacy_function_call_repair(tools: CompiledTools) -> None:
    legacy = {
        "model": "m",
        "functions": [t["function"] for t in TOOLS],
        "messages": BODY["messages"],
    }
    compiled = ToolsCache().compile(legacy)
    assert compiled is not None

    def answer(name: str, arguments: str) -> dict[str, Any]:
        message = {
            "role": "assistant",
            "content": None,
            "function_call": {"name": name, "arguments": arguments},
        }
        return {"choices": [{"index": 0, "message": message, "finish_reason": "function_call"}]}

    send = ScriptedSend(
        answer("get_order_detail", "{}"), answer("get_order_details", '{"order_id": "1"}')
    )
    policy = RepairPolicy(mode=RepairMode.CONSTRAINED)
    first = answer("get_order_detail", "{}")
    outcome = await repair_completion(legacy, first, compiled, policy, send)
    assert outcome.attempts == 2 and not outcome.exhausted
    assert "usage" not in outcome.response
    reply = send.requests[0]["messages"][-1]
    assert reply["role"] == "function" and reply["name"] == "get_order_detail"
    assert send.requests[1]["function_call"] == {"name": "get_order_details"}
    assert "tool_choice" not in send.requests[1]


@pytest.mark.anyio
async def test_inputs_are_never_mutated(tools: CompiledTools) -> None:
    body_before = copy.deepcopy(BODY)
    first = completion(VALID, HALLUCINATED)
    first_before = copy.deepcopy(first)
    send = ScriptedSend(completion(REPAIRED))
    outcome = await repair_completion(BODY, first, tools, RepairPolicy(), send)
    assert body_before == BODY
    assert first == first_before
    outcome.response["choices"][0]["message"]["tool_calls"][0]["id"] = "changed"
    assert first == first_before


# --- the template --------------------------------------------------------------------------------


def test_template_loads_from_a_file(tmp_path: Path) -> None:
    text = Path(__file__).parents[2].joinpath("repairproxy/templates/repair_v1.txt").read_text()
    custom = tmp_path / "mine.txt"
    custom.write_text(text.replace("version = repair-v1", "version = mine-7"))
    template = RepairTemplate.from_file(custom)
    assert template.version == "mine-7"
    assert "mine-7" in template.render("empty_output", declared="a", attempt=1, max_repairs=2)


@pytest.mark.parametrize(
    "text",
    [
        "=== instruction ===\nno version\n",
        "version = v\n=== instruction ===\nonly one section\n",
        "version = v\n"
        + "".join(
            f"=== {s} ===\nuses {{unknown_placeholder}}\n"
            for s in json.loads(
                '["instruction", "unknown_tool", "invalid_json", "schema_violation", '
                '"valid_sibling", "tool_call_in_content", "empty_output"]'
            )
        ),
    ],
)
def test_bad_templates_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="repair template"):
        RepairTemplate.parse(text)


def test_policy_rejects_negative_repairs() -> None:
    with pytest.raises(ValueError):
        RepairPolicy(max_repairs=-1)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("policy", "delivered"),
    [
        ({"mode": RepairMode.OFF}, ("call_bad",)),
        ({"on_exhausted": OnExhausted.PASS, "max_repairs": 1}, ("again",)),
        ({"on_exhausted": OnExhausted.STRIP, "max_repairs": 1}, ()),
        ({"max_repairs": 1, "mode": RepairMode.CONSTRAINED}, ("again",)),
    ],
)
async def test_outcome_names_the_invalid_calls_the_client_receives(
    tools: CompiledTools, policy: dict[str, Any], delivered: tuple[str, ...]
) -> None:
    send = ScriptedSend(completion(call("get_order_info", "{}", "again")))
    outcome = await _repair(tools, completion(VALID, HALLUCINATED), send, **policy)
    assert tuple(c.call_id for c in outcome.delivered_invalid) == delivered
    assert [c.call_id for c in outcome.first_verdict.calls if c.channel is not Channel.VALID] == [
        "call_bad"
    ]
    ids = {c["id"] for c in outcome.response["choices"][0]["message"].get("tool_calls", [])}
    assert set(delivered) <= ids


@pytest.mark.anyio
async def test_repaired_outcome_delivers_no_invalid_call(tools: CompiledTools) -> None:
    outcome = await _repair(tools, completion(HALLUCINATED), ScriptedSend(completion(REPAIRED)))
    assert outcome.delivered_invalid == ()


# --- re-asks that change something ---------------------------------------------------------------


@pytest.mark.anyio
async def test_a_repeated_answer_is_quoted_back_with_the_correction_at_a_lower_temperature(
    tools: CompiledTools,
) -> None:
    body = {**BODY, "temperature": 0.8}
    send = ScriptedSend(completion(HALLUCINATED), completion(REPAIRED))
    outcome = await repair_completion(body, completion(HALLUCINATED), tools, RepairPolicy(), send)
    assert outcome.attempts == 2 and not outcome.exhausted
    first, second = send.requests
    assert first["temperature"] == 0.8
    assert second["temperature"] == pytest.approx(0.4)
    diagnosis = second["messages"][-1]["content"]
    assert "repeated the same invalid answer" in diagnosis
    assert '{"name":"get_order_status","arguments":"{\\"order_id\\": \\"#W1\\"}"}' in diagnosis
    # The exact correction: the intended tool with the model's own (valid) arguments.
    assert '{"name":"get_order_details","arguments":{"order_id":"#W1"}}' in diagnosis
    # The mistake is shown once, not once per attempt.
    assistant_turns = [m for m in second["messages"] if m["role"] == "assistant"]
    assert len(assistant_turns) == 1


@pytest.mark.anyio
async def test_a_repeated_text_call_is_quoted_verbatim(tools: CompiledTools) -> None:
    text = 'Calling now: {"name": "get_order_status", "arguments": {"order_id": "#W1"}}'
    send = ScriptedSend(completion(content=text), completion(REPAIRED))
    await repair_completion(BODY, completion(content=text), tools, RepairPolicy(), send)
    diagnosis = send.requests[1]["messages"][-1]["content"]
    assert '{"name": "get_order_status", "arguments": {"order_id": "#W1"}}' in diagnosis
    assert "get_order_details" in diagnosis
    assert "temperature" in send.requests[1] and send.requests[1]["temperature"] == 0.0


@pytest.mark.anyio
async def test_a_different_invalid_answer_is_not_treated_as_repeated(tools: CompiledTools) -> None:
    other = call("get_order_info", "{}", "c2")
    send = ScriptedSend(completion(other), completion(REPAIRED))
    await repair_completion(BODY, completion(HALLUCINATED), tools, RepairPolicy(), send)
    second = send.requests[1]
    assert "repeated" not in second["messages"][-1]["content"]
    assert second["temperature"] == BODY["temperature"]


@pytest.mark.anyio
async def test_constrained_forces_the_declared_tool_the_model_named(tools: CompiledTools) -> None:
    # The call's name is invented, but the answer names a declared tool: force that one, not
    # the closest by spelling (get_order_details).
    named = completion(
        call("get_order_status", "{}", "c1"), content="I will use cancel_pending_order."
    )
    send = ScriptedSend(copy.deepcopy(named), completion(REPAIRED))
    await repair_completion(BODY, named, tools, RepairPolicy(mode=RepairMode.CONSTRAINED), send)
    assert send.requests[1]["tool_choice"] == {
        "type": "function",
        "function": {"name": "cancel_pending_order"},
    }


@pytest.mark.anyio
async def test_constrained_forces_a_declared_name_with_bad_arguments(tools: CompiledTools) -> None:
    broken = completion(content='{"name": "cancel_pending_order", "arguments": {"order_id": 1}}')
    send = ScriptedSend(copy.deepcopy(broken), completion(REPAIRED))
    await repair_completion(BODY, broken, tools, RepairPolicy(mode=RepairMode.CONSTRAINED), send)
    assert send.requests[1]["tool_choice"]["function"]["name"] == "cancel_pending_order"


# --- failed re-asks keep the answer held so far --------------------------------------------------


def _status_error(status: int) -> Exception:
    from repairproxy.upstream.client import UpstreamReply, UpstreamStatusError

    return UpstreamStatusError(UpstreamReply(status, [], b'{"error": {"message": "too long"}}'))


class FailingSend(ScriptedSend):
    """Answers from the script, then raises ``error`` on the next call."""

    def __init__(self, error: Exception, *responses: dict[str, Any]) -> None:
        super().__init__(*responses)
        self.error = error

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(copy.deepcopy(request))
        if not self.responses:
            raise self.error
        return self.responses.pop(0)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (_status_error(400), "400"),
        (_status_error(503), "503"),
        (UpstreamTimeoutError("slow"), "timeout"),
        (UpstreamUnavailableError("refused"), "unavailable"),
    ],
)
async def test_a_failed_re_ask_delivers_the_first_answer(
    tools: CompiledTools, error: Exception, reason: str
) -> None:
    first = completion(VALID, HALLUCINATED)
    outcome = await _repair(tools, first, FailingSend(error))
    assert outcome.repair_failed == reason
    assert outcome.exhausted and outcome.attempts == 0
    assert outcome.response["choices"] == first["choices"]
    assert [c.call_id for c in outcome.delivered_invalid] == ["call_bad"]


@pytest.mark.anyio
async def test_a_failed_second_re_ask_keeps_the_first_re_ask_and_the_policy(
    tools: CompiledTools,
) -> None:
    again = call("get_order_info", "{}", "c9")
    send = FailingSend(_status_error(400), completion(again))
    outcome = await _repair(
        tools, completion(VALID, HALLUCINATED), send, on_exhausted=OnExhausted.STRIP
    )
    assert outcome.repair_failed == "400" and outcome.attempts == 1
    assert outcome.response["choices"][0]["message"]["tool_calls"] == [VALID]
    assert outcome.delivered_invalid == ()


@pytest.mark.anyio
async def test_a_failed_re_ask_with_the_error_policy_raises(tools: CompiledTools) -> None:
    with pytest.raises(RepairExhaustedError, match="re-ask failed"):
        await _repair(
            tools, completion(HALLUCINATED), FailingSend(_status_error(500)), on_exhausted="error"
        )


@pytest.mark.anyio
async def test_a_re_ask_answer_that_is_no_completion_is_a_failed_repair(
    tools: CompiledTools,
) -> None:
    send = ScriptedSend({"error": {"message": "overloaded"}})
    outcome = await _repair(tools, completion(HALLUCINATED), send)
    assert outcome.repair_failed == "bad_answer"
    assert outcome.response["choices"][0]["message"]["tool_calls"] == [HALLUCINATED]


# --- n > 1, ids, usage, nesting ------------------------------------------------------------------


@pytest.mark.anyio
async def test_every_choice_is_repaired_and_choice_zero_is_the_verdict(
    tools: CompiledTools,
) -> None:
    first = completion(VALID)
    second_choice = copy.deepcopy(completion(HALLUCINATED)["choices"][0])
    second_choice["index"] = 1
    first["choices"].append(second_choice)
    send = ScriptedSend(completion(REPAIRED, prompt=7, completion=3))
    outcome = await repair_completion({**BODY, "n": 2}, first, tools, RepairPolicy(), send)
    assert send.requests[0]["n"] == 1
    choices = outcome.response["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert choices[0]["message"]["tool_calls"] == [VALID]
    assert choices[1]["message"]["tool_calls"] == [REPAIRED]
    assert outcome.first_verdict.ok and outcome.caught_channels == () and outcome.attempts == 1
    assert outcome.response["usage"]["total_tokens"] == 25
    assert (outcome.repair_prompt_tokens, outcome.repair_completion_tokens) == (7, 3)


@pytest.mark.anyio
async def test_merged_calls_never_repeat_an_id(tools: CompiledTools) -> None:
    kept = call("get_order_details", '{"order_id": "#W1"}', "0")
    bad = call("nope", "{}", "1")
    repaired = call("get_order_details", '{"order_id": "#W2"}', "0")  # the upstream reuses "0"
    outcome = await _repair(tools, completion(kept, bad), ScriptedSend(completion(repaired)))
    ids = [c["id"] for c in outcome.response["choices"][0]["message"]["tool_calls"]]
    assert ids[0] == "0" and len(set(ids)) == 2


@pytest.mark.anyio
async def test_deeply_nested_arguments_never_crash(tools: CompiledTools) -> None:
    deep: Any = "x"
    for _ in range(900):
        deep = {"a": deep}
    structured = {"id": "d", "type": "function", "function": {"name": "nope", "arguments": deep}}
    text = '{"name": "get_order_status", "arguments": ' + "[" * 1000 + "]" * 1000 + "}"
    for first in (completion(structured), completion(content=text)):
        outcome = await _repair(tools, first, ScriptedSend(completion(REPAIRED)))
        assert outcome.response["choices"][0]["message"]["tool_calls"] == [REPAIRED]
    # Deeper than any JSON parser here reads: prose, delivered as it came.
    too_deep = completion(
        content=text.replace("[" * 1000, "[" * 5000).replace("]" * 1000, "]" * 5000)
    )
    outcome = await _repair(tools, too_deep, ScriptedSend())
    assert outcome.response == too_deep


@pytest.mark.anyio
async def test_a_repair_v1_template_still_repairs_text_calls_and_repeats(
    tools: CompiledTools,
) -> None:
    v1 = RepairTemplate.from_file(
        Path(__file__).parents[2].joinpath("repairproxy/templates/repair_v1.txt")
    )
    assert v1.version == "repair-v1" and DEFAULT_TEMPLATE.version == "repair-v3"
    text = '{"name": "get_order_status", "arguments": {"order_id": "#W1"}}'
    send = ScriptedSend(completion(content=text), completion(REPAIRED))
    outcome = await _repair(tools, completion(content=text), send, template=v1)
    assert outcome.attempts == 2 and not outcome.exhausted
    for request in send.requests:
        diagnosis = request["messages"][-1]["content"]
        assert "wrote a tool call as text" in diagnosis and "repair-v1" in diagnosis


# --- declining a re-ask --------------------------------------------------------------------------


def test_the_default_texts_let_a_re_ask_be_declined_in_plain_text() -> None:
    assert DEFAULT_TEMPLATE.version == "repair-v3"
    assert "answer the user in plain text" in DEFAULT_TEMPLATE.instruction
    for section in (
        "unknown_tool",
        "text_unknown_tool",
        "unrelated_tool",
        "tool_call_in_content",
        "invalid_json",
        "schema_violation",
        "text_invalid_arguments",
        "conflict",
        "repeated",
    ):
        assert "plain text" in DEFAULT_TEMPLATE.sections[section], section


@pytest.mark.anyio
@pytest.mark.parametrize("mode", [RepairMode.REFLEXIVE, RepairMode.CONSTRAINED])
@pytest.mark.parametrize("on_exhausted", list(OnExhausted))
async def test_a_declined_re_ask_is_delivered_as_text(
    tools: CompiledTools, mode: RepairMode, on_exhausted: OnExhausted
) -> None:
    """The model re-asked about an undeclared tool answers in text: that text is the answer,
    not an error, whatever on_exhausted says (it is a valid answer)."""
    declined = completion(content="I can't send emails: none of my tools does that.")
    send = ScriptedSend(declined)
    first = completion(call("send_email", '{"to": "bob@example.com"}', "call_mail"))
    outcome = await repair_completion(
        BODY, first, tools, RepairPolicy(mode=mode, on_exhausted=on_exhausted), send
    )
    assert outcome.attempts == 1 and not outcome.exhausted
    message = outcome.response["choices"][0]["message"]
    assert message["content"] == "I can't send emails: none of my tools does that."
    assert not message.get("tool_calls")
    assert "tool_choice" not in send.requests[0]


def test_a_misspelled_tool_still_gets_the_closest_listed_tool(tools: CompiledTools) -> None:
    verdict = tools.check_message(completion(MISSPELLED)["choices"][0]["message"])
    turn, _ = build_repair_turn(
        completion(MISSPELLED)["choices"][0]["message"], verdict, tools, DEFAULT_TEMPLATE
    )
    assert "closest listed tool is 'get_order_details'" in turn[-1]["content"]
