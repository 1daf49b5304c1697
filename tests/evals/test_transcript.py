"""The demo's transcript: turns, what the proxy did, what reached the agent, counts, verdict."""

from __future__ import annotations

from typing import Any

from evals.demo.transcript import (
    episode_counts,
    first_divergence,
    render_transcript,
    turn_views,
    verdict,
)
from evals.tau2.logs import AssistantMessage, RewardInfo, SimulationRun, ToolCall, ToolMessage
from evals.tau2.logs import UserMessage as User
from repairproxy.validation import ToolsCache

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "find_user_id_by_email",
            "parameters": {
                "type": "object",
                "properties": {"email": {"type": "string"}},
                "required": ["email"],
            },
        },
    }
]
TEXT_CALL = '{"name": "find_user_id_by_email", "arguments": {"email": "a@b.c"}}'


def _episode(reward: float, *, repaired: bool) -> SimulationRun:
    call = ToolCall(id="call_1", name="find_user_id_by_email", arguments={"email": "a@b.c"})
    first: dict[str, Any] = {
        "tool_errors": ["tool_call_in_content"],
        "repairs": 0,
        "upstream_calls": 1,
        "budget_remaining": 10,
    }
    if repaired:
        first["promoted"] = 1
        agent_first = AssistantMessage(content="", tool_calls=[call], repairproxy=first)
    else:
        agent_first = AssistantMessage(content=TEXT_CALL, repairproxy=first)
    messages: list[Any] = [
        AssistantMessage(content="Hi! How can I help you today?"),  # the fixed greeting
        User(content="I want to cancel an order."),
        agent_first,
    ]
    if repaired:
        messages.append(ToolMessage(id="call_1", content="noah_brown_6181"))
    messages += [
        AssistantMessage(
            content="Done. Anything else?",
            repairproxy={"tool_errors": [], "repairs": 0, "upstream_calls": 1},
        ),
        User(content="No, thanks. ###STOP###"),
    ]
    return SimulationRun(
        id="s",
        task_id="88",
        start_time="t0",
        end_time="t1",
        duration=1.0,
        termination_reason="user_stop",
        reward_info=RewardInfo(reward=reward),
        messages=messages,
    )


def _compiled() -> Any:
    return ToolsCache().compile({"tools": TOOLS})


RAW = [
    {"text": TEXT_CALL, "prefill_seconds": 2.0, "decode_seconds": 1.5},
    {"text": "Done. Anything else?", "prefill_seconds": 0.5, "decode_seconds": 0.5},
]


def test_a_promoted_text_call_is_told_and_counted_as_fixed() -> None:
    run = _episode(1.0, repaired=True)
    views = turn_views(run, _compiled(), RAW)
    assert [v.index for v in views] == [1, 2]  # the greeting is not a model turn
    assert views[0].raw_answers[0]["text"] == TEXT_CALL and views[0].seconds == 3.5
    counts = episode_counts(views)
    assert (counts.invalid_delivered, counts.promoted, counts.tool_calls) == (0, 1, 1)
    assert counts.caught["tool_call_in_content"] == 1 and counts.budget_remaining == 10
    text = "\n".join(render_transcript(views, repair="reflexive", budget=10))
    assert 'wrote   a call as text: {"name": "find_user_id_by_email"' in text
    assert "the model wrote its tool call as text" in text
    assert "promoted 1 text call(s) to real tool calls" in text
    assert 'ran     find_user_id_by_email(email="a@b.c") -> noah_brown_6181' in text
    assert "budget  10 of 10 left" in text and "user: No, thanks." in text
    line = verdict(run, counts, repair="reflexive")
    assert line.startswith("SOLVED (reward 1)")
    assert "the agent never saw one" in line and "1 tool call(s) ran, 0 failed" in line


def test_with_repair_off_the_text_call_reaches_the_agent() -> None:
    run = _episode(0.0, repaired=False)
    views = turn_views(run, _compiled(), RAW)
    counts = episode_counts(views)
    assert views[0].delivered == ["tool_call_in_content"]
    assert (counts.invalid_delivered, counts.tool_calls) == (1, 0)
    text = "\n".join(render_transcript(views, repair="off", budget=10))
    assert "repair is off: forwarded as it was" in text
    assert "the agent still got an invalid answer (tool_call_in_content)" in text
    line = verdict(run, counts, repair="off")
    assert line.startswith("NOT SOLVED (reward 0)")
    assert "with repair off, 1 invalid answer(s) reached the agent" in line


def test_a_call_shape_in_an_answer_cut_off_by_the_token_limit_is_not_counted_delivered() -> None:
    # As the proxy judges it: a cut-off answer promotes nothing and holds no text call.
    run = _episode(0.0, repaired=False)
    cut = [{**RAW[0], "finish_reason": "length"}, RAW[1]]
    views = turn_views(run, _compiled(), cut)
    assert views[0].delivered == [] and episode_counts(views).invalid_delivered == 0
    whole = [{**RAW[0], "finish_reason": "stop"}, RAW[1]]
    assert turn_views(run, _compiled(), whole)[0].delivered == ["tool_call_in_content"]


def test_a_promoted_call_that_fails_is_told_as_failed_and_its_charge_follows_the_result() -> None:
    run = _episode(0.0, repaired=True)
    run.messages[3] = ToolMessage(id="call_1", content="Error: user not found", error=True)
    later = run.messages[4]
    assert isinstance(later, AssistantMessage) and later.repairproxy is not None
    later.repairproxy["budget_remaining"] = 9  # the next request carried the failed result
    views = turn_views(run, _compiled(), RAW)
    lines = render_transcript(views, repair="reflexive", budget=10)
    text = "\n".join(lines)
    assert "valid answer" not in text
    assert "it ran and failed ('Error: user not found')" in text
    ran = next(i for i, line in enumerate(lines) if line.startswith("    ran "))
    assert lines[ran + 1] == "    budget  9 of 10 left"  # right after the result that charged it
    assert "10 of 10" not in text
    assert "###STOP###" not in text and "user: No, thanks. (and ends the conversation)" in text


def test_a_long_answer_is_shown_whole() -> None:
    """The reader must see why nothing was caught: no cut at ~100 characters."""
    long = "I can help with that. " + "Please tell me your order id and your email. " * 6
    run = _episode(1.0, repaired=True)
    run.messages[-2] = AssistantMessage(
        content=long, repairproxy={"tool_errors": [], "repairs": 0, "upstream_calls": 1}
    )
    views = turn_views(run, _compiled(), RAW)
    text = "\n".join(render_transcript(views, repair="reflexive", budget=10))
    assert " ".join(long.split()) in text and "…" not in text


def test_the_first_divergence_of_the_two_modes_names_the_turn_and_both_sides() -> None:
    off = turn_views(_episode(0.0, repaired=False), _compiled(), RAW)
    on = turn_views(_episode(1.0, repaired=True), _compiled(), RAW)
    lines = first_divergence(off, on, labels=("repair off", "reflexive"))
    assert lines[0] == "first divergence: agent turn 1"
    assert "repair off: the agent got" in lines[1] and "find_user_id_by_email" in lines[1]
    assert "(the proxy caught tool_call_in_content)" in lines[1]
    assert 'reflexive: the agent got find_user_id_by_email(email="a@b.c")' in lines[2]
    same = first_divergence(on, on, labels=("a", "b"))
    assert same == [
        "the two runs never diverged: the agent received the same answers in every turn"
    ]
