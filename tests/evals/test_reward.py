"""Each reward component, the premature-termination rule, the NL judge seam, and pass^k."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from evals.tau2.logs import AssistantMessage, Message, NLAssertionCheck, ToolMessage, UserMessage
from evals.tau2.reward import evaluate_episode, is_successful, pass_hat_k, pass_hat_ks
from evals.tau2.scoring import action_matches, parse_judge_output
from tests.evals.fakes import CounterDomain, CounterEnvironment, call, make_task

pytestmark = pytest.mark.anyio


def env_with(total: int) -> CounterEnvironment:
    env = CounterEnvironment()
    env.call_tool("assistant", "add", {"amount": total})
    return env


def conversation(*turns: Message) -> list[Message]:
    return [AssistantMessage(content="Hi! How can I help you today?"), *turns]


class FakeJudge:
    model = "fake-judge"

    def __init__(self, verdicts: list[bool]) -> None:
        self.verdicts = verdicts
        self.asked: list[list[str]] = []

    async def judge(
        self, messages: Sequence[Message], assertions: list[str]
    ) -> list[NLAssertionCheck]:
        self.asked.append(assertions)
        return [
            NLAssertionCheck(nl_assertion=a, met=v, justification="fake")
            for a, v in zip(assertions, self.verdicts, strict=True)
        ]


async def score(
    task: dict[str, Any],
    env: CounterEnvironment,
    messages: list[Message] | None = None,
    *,
    reason: str = "user_stop",
    judge: Any = None,
) -> Any:
    return await evaluate_episode(
        domain=CounterDomain(),
        task=task,
        termination_reason=reason,
        messages=messages or conversation(),
        final_env=env,
        judge=judge,
    )


@pytest.mark.parametrize(("total", "expected"), [(3, 1.0), (2, 0.0), (4, 0.0)])
async def test_db_compares_final_state_with_gold_replay(total: int, expected: float) -> None:
    info = await score(make_task(reward_basis=["DB"]), env_with(total))
    assert info.reward == expected
    assert info.db_check.db_match is (expected == 1.0)
    assert info.reward_breakdown == {"DB": expected}


async def test_db_gold_replay_starts_from_the_task_initial_state() -> None:
    task = make_task(reward_basis=["DB"])
    task["initial_state"] = {
        "initialization_actions": [
            {"env_type": "assistant", "func_name": "add", "arguments": {"amount": 10}}
        ]
    }
    assert (await score(task, env_with(13))).reward == 1.0
    assert (await score(task, env_with(3))).reward == 0.0


@pytest.mark.parametrize(("total", "expected"), [(3, 1.0), (5, 0.0)])
async def test_env_assertions(total: int, expected: float) -> None:
    assertion = {"env_type": "assistant", "func_name": "total_is", "arguments": {"value": 3}}
    negated = {**assertion, "arguments": {"value": 4}, "assert_value": False}
    task = make_task(reward_basis=["ENV_ASSERTION"], env_assertions=[assertion, negated])
    info = await score(task, env_with(total))
    assert info.reward == expected
    assert [c.met for c in info.env_assertions] == [total == 3, True]
    assert info.reward_breakdown == {"ENV_ASSERTION": expected}


async def test_action_requires_every_gold_call_with_compare_args() -> None:
    actions = [
        {
            "action_id": "a",
            "name": "add",
            "arguments": {"amount": 2, "note": "x"},
            "compare_args": ["amount"],
        },
        {"action_id": "b", "requestor": "user", "name": "press", "arguments": {"button": "ok"}},
    ]
    task = make_task(actions=actions, reward_basis=["ACTION"])
    both = conversation(
        AssistantMessage(tool_calls=[call("add", amount=2, note="other")]),
        ToolMessage(id="1", content="{}"),
        UserMessage(tool_calls=[call("press", button="ok")]),
    )
    info = await score(task, env_with(0), both)
    assert info.reward == 1.0 and [c.action_match for c in info.action_checks] == [True, True]
    wrong = conversation(
        AssistantMessage(tool_calls=[call("add", amount=3)]),
        UserMessage(tool_calls=[call("press", button="ok")]),
    )
    info = await score(task, env_with(0), wrong)
    assert info.reward == 0.0 and [c.action_match for c in info.action_checks] == [False, True]


def test_action_match_without_compare_args_uses_the_calls_own_keys() -> None:
    action = {"name": "add", "arguments": {"amount": 2, "note": "x"}}
    assert action_matches(action, call("add", amount=2))
    assert not action_matches(action, call("add", amount=2, note="y"))
    assert not action_matches(action, call("fail", amount=2))
    assert action_matches({**action, "compare_args": []}, call("add", amount=9))


async def test_communicate_info_must_appear_in_agent_text() -> None:
    task = make_task(reward_basis=["COMMUNICATE"], communicate_info=["1234.50", "refund"])
    said = conversation(AssistantMessage(content="Your REFUND of 1,234.50 is on its way."))
    assert (await score(task, env_with(0), said)).reward == 1.0
    only_user = conversation(UserMessage(content="refund 1234.50"))
    info = await score(task, env_with(0), only_user)
    assert info.reward == 0.0 and not any(c.met for c in info.communicate_checks)


async def test_nl_assertions_scored_by_the_judge() -> None:
    task = make_task(reward_basis=["DB", "NL_ASSERTION"], nl_assertions=["polite", "explains"])
    judge = FakeJudge([True, False])
    info = await score(task, env_with(3), judge=judge)
    assert judge.asked == [["polite", "explains"]]
    assert info.reward == 0.0 and info.nl_assertions_scored is True
    assert info.reward_breakdown == {"DB": 1.0, "NL_ASSERTION": 0.0}
    info = await score(task, env_with(3), judge=FakeJudge([True, True]))
    assert info.reward == 1.0


async def test_without_judge_nl_assertions_are_marked_unscored_and_the_rest_counts() -> None:
    task = make_task(reward_basis=["DB", "NL_ASSERTION"], nl_assertions=["polite"])
    info = await score(task, env_with(3))
    assert info.reward == 1.0
    assert info.nl_assertions_scored is False and info.nl_assertions is None
    assert "not scored" in info.info["nl"]
    assert "NL_ASSERTION" not in info.reward_breakdown
    assert (await score(task, env_with(2))).reward == 0.0


@pytest.mark.parametrize("reason", ["max_steps", "too_many_errors", "agent_error", "user_error"])
async def test_premature_termination_scores_zero(reason: str) -> None:
    info = await score(make_task(), env_with(3), reason=reason)
    assert info.reward == 0.0 and reason in info.info["note"]
    assert (await score(make_task(), env_with(3), reason="agent_stop")).reward == 1.0


def test_judge_output_parsing_is_strict() -> None:
    text = 'noise {"results": [{"expectedOutcome": "a", "reasoning": "r", "metExpectation": true}]}'
    checks = parse_judge_output(text, ["a", "b"])
    assert [c.met for c in checks] == [True, False]
    assert [c.met for c in parse_judge_output("not json", ["a"])] == [False]
    assert [
        c.met for c in parse_judge_output('{"results": [{"metExpectation": "yes"}]}', ["a"])
    ] == [False]


def test_success_tolerance() -> None:
    assert is_successful(1.0) and is_successful(1 - 1e-7) and is_successful(1 + 1e-7)
    assert not is_successful(1 - 1e-5) and not is_successful(0.0)


def test_pass_hat_k_matches_the_combinatorial_definition() -> None:
    rewards = {"a": [1.0, 1.0, 1.0, 1.0], "b": [1.0, 0.0, 1.0, 0.0], "c": [0.0, 0.0, 0.0, 1.0]}
    result = pass_hat_ks(rewards, num_trials=4)
    for k in range(1, 5):
        expected = (1 + math.comb(2, k) / math.comb(4, k) + math.comb(1, k) / math.comb(4, k)) / 3
        assert result[k] == pytest.approx(expected)
    assert result[1] == pytest.approx(7 / 12)
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    with pytest.raises(ValueError):
        pass_hat_k(2, 1, 3)


def test_pass_hat_k_caps_k_at_the_fewest_trials_of_any_task() -> None:
    result = pass_hat_ks({"a": [1.0, 1.0, 1.0], "b": [1.0, 0.0]}, num_trials=3)
    assert sorted(result) == [1, 2]
    assert result[2] == pytest.approx((1 + 0) / 2)


async def test_env_assertions_run_when_the_task_has_no_actions() -> None:
    # τ²-bench skips the environment components only when actions AND env_assertions are missing.
    assertion = {"env_type": "assistant", "func_name": "total_is", "arguments": {"value": 3}}
    task = make_task(reward_basis=["ENV_ASSERTION"], env_assertions=[assertion])
    task["evaluation_criteria"]["actions"] = None
    info = await score(task, env_with(5))
    assert info.reward == 0.0 and [c.met for c in info.env_assertions] == [False]
    assert (await score(task, env_with(3))).reward == 1.0
    task["evaluation_criteria"]["env_assertions"] = None
    info = await score(task, env_with(5))
    assert info.reward == 1.0 and info.reward_breakdown == {}
    assert info.db_check is not None and info.db_check.db_match


async def test_db_uses_an_empty_gold_replay_when_only_env_assertions_are_given() -> None:
    assertion = {"env_type": "assistant", "func_name": "total_is", "arguments": {"value": 0}}
    task = make_task(reward_basis=["DB"], env_assertions=[assertion])
    task["evaluation_criteria"]["actions"] = None
    assert (await score(task, env_with(0))).reward == 1.0
    assert (await score(task, env_with(2))).reward == 0.0
