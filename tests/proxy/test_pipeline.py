"""The module that decides the answer, driven directly: parse -> admit -> forward -> judge, with a
scripted fake ``send`` for the re-asks (as ``test_repair.py`` drives the loop) and a memory store.

No route, no transport: what these pin is the decision itself (which mode, what goes upstream,
what the client gets back, what the episode is charged and what the record says)."""

from __future__ import annotations

import copy
from typing import Any, cast

import orjson
import pytest

from repairproxy.episodes.budget import ErrorBudget
from repairproxy.episodes.memory_store import MemoryEpisodeStore
from repairproxy.errors import BadRequestError, BudgetExhaustedError, RepairExhaustedError
from repairproxy.observe.record import RepairResultKind, RequestRecord
from repairproxy.pipeline import ChatPipeline, ChatRequest, Decision
from repairproxy.repair import DEFAULT_TEMPLATE, RepairPolicy
from repairproxy.settings import Settings
from repairproxy.types import BudgetPolicy, OnExhausted, Outcome, RepairMode
from repairproxy.validation import ToolsCache
from repairproxy.wire.openai import ChatCompletion
from tests.support.tools import CANCEL_ORDER, GET_ORDER

pytestmark = pytest.mark.anyio

EPISODE = {"x-episode-id": "ep-1"}
BODY: dict[str, Any] = {
    "model": "m",
    "tools": [GET_ORDER, CANCEL_ORDER],
    "messages": [
        {"role": "system", "content": "You are a retail agent."},
        {"role": "user", "content": "Where is order #W1?"},
    ],
}


def call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def completion(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "model": "served-m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


VALID = call("get_order_details", '{"order_id": "#W1"}', "call_ok")
HALLUCINATED = call("get_order_status", '{"order_id": "#W1"}', "call_bad")


class ScriptedSend:
    """The re-ask seam: scripted completions in order; every request it was given, kept."""

    def __init__(self, *responses: dict[str, Any]) -> None:
        self.responses = list(responses)
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(copy.deepcopy(request))
        return self.responses.pop(0)


def pipeline(**overrides: Any) -> ChatPipeline:
    settings = Settings(**{"upstream": "http://mock/v1", "repair": "reflexive", **overrides})
    policies = {
        mode: RepairPolicy(
            mode=mode,
            max_repairs=settings.max_repairs,
            on_exhausted=settings.on_exhausted,
            template=DEFAULT_TEMPLATE,
        )
        for mode in RepairMode
    }
    budget = ErrorBudget(MemoryEpisodeStore(), default_budget=settings.budget)
    return ChatPipeline(settings, ToolsCache(), budget, policies)


async def decide(
    chat: ChatPipeline,
    first: dict[str, Any],
    send: ScriptedSend,
    *,
    headers: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
) -> tuple[ChatRequest, Decision, RequestRecord]:
    """One request through every step, as the chat route calls them."""
    headers = EPISODE if headers is None else headers
    record = RequestRecord()
    request = chat.parse(orjson.dumps(body or BODY), headers, record)
    await chat.admit(request, headers, record)
    chat.prepare_forward(request)
    outcome = await chat.judge(request, cast(ChatCompletion, first), send, record)
    return request, outcome, record


async def test_a_valid_answer_passes_unchanged_and_charges_nothing() -> None:
    first = completion(VALID)
    _, outcome, record = await decide(pipeline(), first, ScriptedSend())
    assert outcome.answer == first and not outcome.changed
    assert outcome.caught_channels == () and outcome.repair_attempts == 0
    assert record.outcome is Outcome.OK and record.tool_calls == 1 and record.caught_calls == []
    assert record.model == "m" and record.served_model == "served-m"
    assert record.snapshot is not None and record.snapshot.errors == 0
    assert record.episode is not None and record.episode.explicit and record.episode.new


async def test_the_instruction_goes_upstream_in_reflexive_and_not_in_off() -> None:
    record = RequestRecord()
    for mode, instructed in ((RepairMode.REFLEXIVE, True), (RepairMode.OFF, False)):
        chat = pipeline(repair=mode.value)
        request = chat.parse(orjson.dumps(BODY), {}, record)
        chat.prepare_forward(request)
        assert request.forward is not None
        system = request.forward["messages"][0]["content"]
        assert (DEFAULT_TEMPLATE.instruction in str(system)) is instructed
        # Off forwards the client's bytes as they came.
        assert (request.forward_raw == orjson.dumps(BODY)) is not instructed


async def test_a_hallucinated_call_is_re_asked_and_the_fixed_answer_returned() -> None:
    send = ScriptedSend(completion(VALID))
    streamed = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    _, outcome, record = await decide(pipeline(), completion(HALLUCINATED), send, body=streamed)
    assert record.stream and len(send.requests) == 1
    reask = send.requests[0]
    # Re-asks are buffered, whatever the client asked.
    assert reask.get("stream") is not True and "stream_options" not in reask
    assert reask["messages"][-1]["role"] == "tool"
    assert "get_order_status" in reask["messages"][-1]["content"]
    answer = outcome.answer["choices"][0]["message"]
    assert answer["tool_calls"][0]["function"]["name"] == "get_order_details"
    assert (
        outcome.changed
        and outcome.repair_attempts == 1
        and outcome.caught_channels == ("unknown_tool",)
    )
    assert record.outcome is Outcome.REPAIRED and record.repair_attempts == 1
    assert [r.result for r in record.repair_results] == [RepairResultKind.FIXED]
    # The first answer's error is charged to the episode, even though the client never saw it.
    assert record.snapshot is not None and record.snapshot.errors == 1


async def test_a_re_ask_answered_in_prose_is_declined_not_fixed() -> None:
    """The study's vocabulary: the model was re-asked and answered the user in text; nothing
    runs, so the dashboard's "repair success" must not count it."""
    send = ScriptedSend(completion(content="I cannot do that."))
    _, outcome, record = await decide(pipeline(), completion(HALLUCINATED), send)
    assert outcome.answer["choices"][0]["message"]["content"] == "I cannot do that."
    assert record.repair_attempts == 1
    assert [r.result for r in record.repair_results] == [RepairResultKind.DECLINED]
    assert record.outcome is Outcome.DECLINED


async def test_repair_off_observes_and_forwards_the_invalid_answer() -> None:
    first = completion(HALLUCINATED)
    send = ScriptedSend()
    _, outcome, record = await decide(pipeline(repair="off"), first, send)
    assert send.requests == [] and outcome.answer == first
    assert outcome.caught_channels == ("unknown_tool",) and outcome.repair_attempts == 0
    assert record.outcome is Outcome.OK and [c.channel for c in record.caught_calls] == [
        "unknown_tool"
    ]
    assert record.snapshot is not None and record.snapshot.errors == 1


async def test_exhausted_repair_with_on_exhausted_error_raises_and_still_charges() -> None:
    chat = pipeline(max_repairs=1, on_exhausted=OnExhausted.ERROR.value)
    send = ScriptedSend(completion(HALLUCINATED))
    record = RequestRecord()
    request = chat.parse(orjson.dumps(BODY), EPISODE, record)
    await chat.admit(request, EPISODE, record)
    chat.prepare_forward(request)
    with pytest.raises(RepairExhaustedError):
        await chat.judge(request, cast(ChatCompletion, completion(HALLUCINATED)), send, record)
    assert record.outcome is Outcome.REPAIR_EXHAUSTED and record.repair_attempts == 1
    assert [r.result for r in record.repair_results] == [RepairResultKind.FAILED]
    assert record.snapshot is not None and record.snapshot.errors == 1


async def test_a_spent_budget_rejects_an_explicit_episode_before_the_upstream() -> None:
    chat = pipeline(repair="off", budget=1, on_budget_exhausted=BudgetPolicy.REJECT.value)
    await decide(chat, completion(HALLUCINATED), ScriptedSend())  # spends the one error
    record = RequestRecord()
    request = chat.parse(orjson.dumps(BODY), EPISODE, record)
    with pytest.raises(BudgetExhaustedError):
        await chat.admit(request, EPISODE, record)
    assert record.outcome is Outcome.BUDGET_REJECTED
    assert request.forward is None  # never prepared: nothing went upstream


async def test_per_request_mode_and_budget_headers_are_parsed_or_refused() -> None:
    chat = pipeline()
    record = RequestRecord()
    headers = {"x-repairproxy-repair": " Off ", "x-repairproxy-budget": "3"}
    request = chat.parse(orjson.dumps(BODY), headers, record)
    assert request.mode is RepairMode.OFF and request.budget_override == 3
    for bad in ({"x-repairproxy-repair": "fix-it"}, {"x-repairproxy-budget": "²"}):
        with pytest.raises(BadRequestError):
            chat.parse(orjson.dumps(BODY), bad, record)


async def test_tool_choice_none_leaves_text_alone() -> None:
    body = {**BODY, "tool_choice": "none"}
    first = completion(content='{"name": "get_order_details", "arguments": {"order_id": "#W1"}}')
    send = ScriptedSend()
    _, outcome, record = await decide(pipeline(), first, send, body=body)
    assert send.requests == [] and outcome.answer == first and outcome.first_verdict is None
    assert record.caught_calls == [] and record.outcome is Outcome.OK


async def test_the_record_says_the_mode_and_warns_once_about_a_missing_episode_header() -> None:
    chat = pipeline()
    records = []
    for headers in ({}, {}, EPISODE):
        _, _, record = await decide(chat, completion(VALID), ScriptedSend(), headers=headers)
        records.append(record)
    assert [r.warn_missing_header for r in records] == [True, False, False]
    assert all(r.mode is RepairMode.REFLEXIVE for r in records)
    assert records[2].episode_id == "ep-1" and records[0].episode_id not in (None, "ep-1")


async def test_judge_writes_each_choice_channels_into_the_record() -> None:
    # n > 1: choice 0 is judged (and repaired), the others checked as they came.
    first = completion(VALID)
    second = completion(HALLUCINATED)["choices"][0]
    first["choices"].append({**second, "index": 1})
    body = {**BODY, "n": 2}
    _, _, record = await decide(pipeline(repair="off"), first, ScriptedSend(), body=body)
    assert record.choice_channels == ((), ("unknown_tool",))
    _, _, single = await decide(pipeline(repair="off"), completion(VALID), ScriptedSend())
    assert single.choice_channels == ()


async def test_each_choice_is_checked_by_choice_zeros_rules() -> None:
    # n > 1: the other choices are read as choice 0 is. A choice cut off by the token limit holds
    # text, not a call; under tool_choice "none" nothing is caught in any choice.
    text_call = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    body = {**BODY, "n": 2}

    def two_choices(finish_reason: str) -> dict[str, Any]:
        answer = completion(VALID)
        other = completion(content=text_call)["choices"][0]
        answer["choices"].append({**other, "index": 1, "finish_reason": finish_reason})
        return answer

    _, _, whole = await decide(
        pipeline(repair="off"), two_choices("stop"), ScriptedSend(), body=body
    )
    assert whole.choice_channels[0] == () and whole.choice_channels[1] != ()  # a call in its text
    _, _, cut = await decide(
        pipeline(repair="off"), two_choices("length"), ScriptedSend(), body=body
    )
    assert cut.choice_channels == ((), ())

    bad = completion(VALID)
    bad["choices"].append({**completion(HALLUCINATED)["choices"][0], "index": 1})
    none = {**body, "tool_choice": "none"}
    _, _, record = await decide(pipeline(repair="off"), bad, ScriptedSend(), body=none)
    assert record.choice_channels == ((), ())
