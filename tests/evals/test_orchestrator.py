"""The orchestrator's rules: greeting, routing, error budget K, every termination reason."""

from __future__ import annotations

from typing import Any

import pytest

from evals.tau2.logs import AssistantMessage, ToolMessage, UserMessage
from evals.tau2.orchestrator import GREETING, Episode, OrchestratorConfig, run_episode
from evals.tau2.participants import AgentError, EpisodeContext, UserError
from tests.evals.fakes import (
    CounterDomain,
    ScriptedAgent,
    ScriptedUser,
    call,
    make_task,
    says,
    user_says,
)

pytestmark = pytest.mark.anyio


async def play(
    agent: ScriptedAgent, user: ScriptedUser, *, max_errors: int = 10, max_steps: int = 200
) -> Episode:
    return await run_episode(
        domain=CounterDomain(),
        task=make_task(),
        make_agent=lambda context: agent,
        make_user=lambda context: user,
        config=OrchestratorConfig(max_steps=max_steps, max_errors=max_errors),
    )


def tool_messages(episode: Episode) -> list[ToolMessage]:
    return [m for m in episode.run.messages if isinstance(m, ToolMessage)]


async def test_greeting_opens_and_tool_results_return_to_their_caller() -> None:
    agent = ScriptedAgent([says(None, call("add", amount=2)), says("Done, anything else?")])
    user = ScriptedUser(
        [
            user_says("Add 2 please."),
            user_says(None, call("press", button="ok")),
            user_says("###STOP###"),
        ]
    )
    episode = await play(agent, user)
    first = episode.run.messages[0]
    assert isinstance(first, AssistantMessage) and first.content == GREETING
    assert user.seen[0][0].content == GREETING
    # The agent's tool result comes back to the agent, the user's to the user.
    assert [type(m) for m in agent.seen[1]] == [ToolMessage]
    assert agent.seen[1][0].content == '{"total": 2}'
    assert isinstance(user.seen[2][0], ToolMessage) and user.seen[2][0].requestor == "user"
    assert user.seen[2][0].content == "pressed"
    assert episode.environment.presses == ["ok"]
    assert episode.run.termination_reason == "user_stop"
    assert [m.turn_idx for m in episode.run.messages] == list(range(len(episode.run.messages)))
    assert all(m.id for m in tool_messages(episode))


@pytest.mark.parametrize("budget", [1, 3, 5])
async def test_budget_ends_episode_exactly_at_k_agent_errors(budget: int) -> None:
    agent = ScriptedAgent([says(None, call("fail"))])
    episode = await play(agent, ScriptedUser([user_says("hi")]), max_errors=budget)
    assert episode.run.termination_reason == "too_many_errors"
    assert episode.run.num_errors == budget
    assert sum(m.error for m in tool_messages(episode)) == budget
    assert tool_messages(episode)[-1].content == "Error: this tool always fails"


async def test_budget_counts_agent_and_user_errors_together_never_reset() -> None:
    agent = ScriptedAgent(
        [
            says(None, call("fail")),
            says(None, call("add", amount=1)),  # a success in between resets nothing
            says("Please press a button."),
            says(None, call("fail")),
        ]
    )
    user = ScriptedUser([user_says("hi"), user_says(None, call("nosuch")), user_says("ok")])
    episode = await play(agent, user, max_errors=3)
    assert episode.run.termination_reason == "too_many_errors"
    assert episode.run.errors_by_requestor == {"assistant": 2, "user": 1}
    user_error = next(m for m in tool_messages(episode) if m.requestor == "user")
    assert user_error.content == "Error: Tool 'nosuch' not found." and user_error.error


async def test_below_budget_the_episode_continues() -> None:
    agent = ScriptedAgent([says(None, call("fail")), says(None, call("fail")), says("sorry")])
    user = ScriptedUser([user_says("hi"), user_says("###STOP###")])
    episode = await play(agent, user, max_errors=3)
    assert episode.run.termination_reason == "user_stop"
    assert episode.run.num_errors == 2


async def test_all_calls_of_a_turn_run_before_the_budget_is_checked() -> None:
    agent = ScriptedAgent([says(None, call("fail"), call("fail"), call("add", amount=1))])
    episode = await play(agent, ScriptedUser([user_says("hi")]), max_errors=2)
    assert episode.run.termination_reason == "too_many_errors"
    assert len(tool_messages(episode)) == 3
    assert episode.run.num_errors == 2
    assert episode.environment.total == 1


async def test_malformed_arguments_are_a_counted_failing_call() -> None:
    bad = call("add", raw='{"amount": 2')
    agent = ScriptedAgent([says(None, bad), says("sorry")])
    user = ScriptedUser([user_says("hi"), user_says("###STOP###")])
    episode = await play(agent, user)
    [result] = tool_messages(episode)
    assert result.error and result.content is not None
    assert result.content.startswith("Error: Invalid arguments for tool 'add'")
    assert episode.run.malformed_tool_calls == {"assistant": 1}
    assert episode.run.num_errors == 1
    logged = episode.run.messages[2]
    assert isinstance(logged, AssistantMessage) and logged.tool_calls is not None
    assert logged.tool_calls[0].raw_arguments == '{"amount": 2'
    assert episode.environment.total == 0


@pytest.mark.parametrize("token", ["###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"])
async def test_user_stop_tokens(token: str) -> None:
    episode = await play(ScriptedAgent([says("ok")]), ScriptedUser([user_says(f"bye {token}")]))
    assert episode.run.termination_reason == "user_stop"
    assert episode.run.steps == 1


async def test_agent_stop() -> None:
    agent = ScriptedAgent([says("###STOP###")])
    episode = await play(agent, ScriptedUser([user_says("hi")]))
    assert episode.run.termination_reason == "agent_stop"


async def test_max_steps_counts_every_routed_message() -> None:
    agent = ScriptedAgent([says(None, call("add", amount=1)), says("more?")])
    episode = await play(agent, ScriptedUser([user_says("again")]), max_steps=7)
    assert episode.run.termination_reason == "max_steps"
    assert episode.run.steps == 7
    # user, agent call, tool result, agent text, user, agent call, tool result
    assert len(episode.run.messages) == 1 + 7


@pytest.mark.parametrize(
    ("agent_turns", "user_turns", "reason"),
    [
        ([AgentError("upstream 500")], [user_says("hi")], "agent_error"),
        ([says("hello")], [UserError("user model down")], "user_error"),
        ([says("")], [user_says("hi")], "agent_error"),
        ([says("ok")], [user_says("hi"), user_says("  ")], "user_error"),
    ],
)
async def test_participant_failures_and_empty_turns(
    agent_turns: list[Any], user_turns: list[Any], reason: str
) -> None:
    episode = await play(ScriptedAgent(agent_turns), ScriptedUser(user_turns))
    assert episode.run.termination_reason == reason
    empties = [
        m
        for m in episode.run.messages
        if isinstance(m, AssistantMessage | UserMessage) and m.empty_turn
    ]
    if "empty" in (episode.run.error_detail or ""):
        assert len(empties) == 1
        side = "assistant" if reason == "agent_error" else "user"
        assert episode.run.empty_turns == {side: 1}
    else:
        assert episode.run.error_detail in {"upstream 500", "user model down"}
        assert empties == []


async def test_a_task_can_narrow_the_user_tools_it_offers() -> None:
    seen: list[list[str]] = []

    def make_user(context: EpisodeContext) -> ScriptedUser:
        seen.append([t["function"]["name"] for t in context.user_tools])
        return ScriptedUser([user_says("###STOP###")])

    for names, expected in ((None, ["press"]), ([], []), (["press"], ["press"])):
        task = make_task()
        task["user_tools"] = names
        await run_episode(
            domain=CounterDomain(),
            task=task,
            make_agent=lambda ctx: ScriptedAgent([says("hi")]),
            make_user=make_user,
            config=OrchestratorConfig(),
        )
        assert seen[-1] == expected
