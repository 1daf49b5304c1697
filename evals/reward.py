"""Episode reward as τ²-bench v1.0.1 computes it: a product over the task's ``reward_basis``.

Components: DB (final state hash vs the state reached by replaying the gold actions on a fresh
environment), ENV_ASSERTION, ACTION (each gold action appears among the trajectory's tool calls),
COMMUNICATE (each required string appears in an agent message), NL_ASSERTION (an LLM judge). With no
judge configured, NL assertions are recorded as not scored and the other components still count.
An episode that ended other than ``agent_stop`` / ``user_stop`` gets reward 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from evals.domains.base import Domain, DomainEnvironment
from evals.logs import (
    ActionCheck,
    AssistantMessage,
    CommunicateCheck,
    DBCheck,
    EnvAssertionCheck,
    Message,
    NLAssertionCheck,
    RewardInfo,
    ToolCall,
    UserMessage,
)

__all__ = [
    "Judge",
    "OpenAIJudge",
    "action_matches",
    "evaluate_episode",
    "gold_environment",
    "is_successful",
    "pass_hat_k",
    "pass_hat_ks",
]

SUCCESS_TOLERANCE = 1e-6
_STOP_REASONS = frozenset({"agent_stop", "user_stop"})
_ENV_BASES = frozenset({"DB", "ENV_ASSERTION"})


def is_successful(reward: float) -> bool:
    """Success is reward 1 within 1e-6, as τ²-bench's ``is_successful``."""
    return (1 - SUCCESS_TOLERANCE) <= reward <= (1 + SUCCESS_TOLERANCE)


def pass_hat_k(num_trials: int, success_count: int, k: int) -> float:
    """pass^k for one task: C(successes, k) / C(trials, k) (Yao et al., 2024)."""
    if num_trials < k:
        raise ValueError(f"Number of trials {num_trials} is less than k {k}.")
    return math.comb(success_count, k) / math.comb(num_trials, k)


def pass_hat_ks(rewards_by_task: dict[str, list[float]], num_trials: int) -> dict[int, float]:
    """pass^k for k = 1..max_k, averaged over tasks.

    max_k = min(num_trials, the fewest trials any task has), as τ²-bench's ``get_metrics_df``.
    """
    if not rewards_by_task:
        return {}
    max_k = min(num_trials, *(len(r) for r in rewards_by_task.values()))
    result: dict[int, float] = {}
    for k in range(1, max_k + 1):
        per_task = [
            pass_hat_k(len(r), sum(is_successful(x) for x in r), k)
            for r in rewards_by_task.values()
        ]
        result[k] = sum(per_task) / len(per_task)
    return result


class Judge(Protocol):
    """Grades natural-language assertions against a conversation."""

    model: str

    async def judge(
        self, messages: Sequence[Message], assertions: list[str]
    ) -> list[NLAssertionCheck]: ...


_JUDGE_SYSTEM_PROMPT = """You grade a customer-service conversation against expected outcomes.
Judge each expected outcome on its own: is it satisfied by what the agent said and did?
Answer with one JSON object only:
{"results": [{"expectedOutcome": "<the outcome, repeated>", "reasoning": "<short>",
"metExpectation": true or false}]}
with one entry per expected outcome, in the order given."""


class OpenAIJudge:
    """An NL-assertion judge behind any OpenAI-compatible endpoint."""

    def __init__(self, client: Any, model: str, temperature: float = 0.0) -> None:
        self.client = client
        self.model = model
        self.temperature = temperature

    async def judge(
        self, messages: Sequence[Message], assertions: list[str]
    ) -> list[NLAssertionCheck]:
        conversation = "\n".join(f"{m.role}: {m.content}" for m in messages)
        prompt = f"conversation:\n{conversation}\n\nexpectedOutcomes:\n{assertions}"
        response = await self.client.chat.completions.create(
            model=self.model,
            temperature=self.temperature,
            messages=[
                {"role": "system", "content": _JUDGE_SYSTEM_PROMPT},
                {"role": "user", "content": prompt},
            ],
        )
        return parse_judge_output(response.choices[0].message.content or "", assertions)


def parse_judge_output(text: str, assertions: list[str]) -> list[NLAssertionCheck]:
    """Map the judge's JSON to one check per assertion; anything unreadable counts as not met."""
    try:
        start, end = text.index("{"), text.rindex("}") + 1
        results = json.loads(text[start:end]).get("results", [])
    except (ValueError, AttributeError):
        results = []
    checks = []
    for index, assertion in enumerate(assertions):
        entry = results[index] if index < len(results) and isinstance(results[index], dict) else {}
        checks.append(
            NLAssertionCheck(
                nl_assertion=assertion,
                met=entry.get("metExpectation") is True,
                justification=str(entry.get("reasoning", "judge gave no verdict for this outcome")),
            )
        )
    return checks


def gold_environment(domain: Domain, task: dict[str, Any]) -> DomainEnvironment:
    """A fresh environment with the task's initial state and every gold action replayed."""
    environment = domain.new_environment()
    environment.apply_initial_state(task.get("initial_state"))
    for action in _criteria(task).get("actions") or []:
        # A failing gold call leaves the state as it was, as τ²-bench (it logs and continues).
        environment.call_tool(
            action.get("requestor", "assistant"), action["name"], action.get("arguments", {})
        )
    return environment


def action_matches(action: dict[str, Any], call: ToolCall) -> bool:
    """τ²-bench's ``Action.compare_with_tool_call``: same name, equal values on ``compare_args``
    (all of the call's own argument names when ``compare_args`` is null)."""
    if action["name"] != call.name:
        return False
    compare_args = action.get("compare_args")
    keys: Iterable[str] = call.arguments.keys() if compare_args is None else compare_args
    keys = list(keys)
    if not keys:
        return True
    expected = {k: v for k, v in action.get("arguments", {}).items() if k in keys}
    actual = {k: v for k, v in call.arguments.items() if k in keys}
    return expected == actual


def _criteria(task: dict[str, Any]) -> dict[str, Any]:
    criteria: dict[str, Any] = task.get("evaluation_criteria") or {}
    return criteria


def _environment_component(
    domain: Domain, task: dict[str, Any], final_env: DomainEnvironment, basis: set[str]
) -> tuple[float, dict[str, float], DBCheck, list[EnvAssertionCheck]]:
    criteria = _criteria(task)
    if criteria.get("actions") is None:
        return 1.0, {}, DBCheck(db_match=True, db_reward=1.0), []
    db_match = gold_environment(domain, task).db_hash() == final_env.db_hash()
    db_reward = 1.0 if db_match else 0.0
    checks = []
    for assertion in criteria.get("env_assertions") or []:
        met = final_env.run_env_assertion(assertion)
        checks.append(EnvAssertionCheck(env_assertion=assertion, met=met, reward=float(met)))
    assertion_reward = math.prod(c.reward for c in checks)
    reward, breakdown = 1.0, {}
    if "DB" in basis:
        breakdown["DB"] = db_reward
        reward *= db_reward
    if "ENV_ASSERTION" in basis:
        breakdown["ENV_ASSERTION"] = assertion_reward
        reward *= assertion_reward
    return reward, breakdown, DBCheck(db_match=db_match, db_reward=db_reward), checks


def _action_checks(task: dict[str, Any], messages: Sequence[Message]) -> list[ActionCheck]:
    calls = [
        call
        for m in messages
        if isinstance(m, AssistantMessage | UserMessage)
        for call in m.tool_calls or []
    ]
    checks = []
    for action in _criteria(task).get("actions") or []:
        found = any(action_matches(action, call) for call in calls)
        checks.append(ActionCheck(action=action, action_match=found, action_reward=float(found)))
    return checks


def _communicate_checks(
    task: dict[str, Any], messages: Sequence[Message]
) -> list[CommunicateCheck]:
    spoken = [
        m.content.lower().replace(",", "")
        for m in messages
        if isinstance(m, AssistantMessage) and m.content and m.has_text_content()
    ]
    checks = []
    for info in _criteria(task).get("communicate_info") or []:
        met = any(info.lower() in text for text in spoken)
        note = f"Information '{info}' communicated" if met else f"'{info}' not communicated"
        checks.append(CommunicateCheck(info=info, met=met, justification=note))
    return checks


async def evaluate_episode(
    *,
    domain: Domain,
    task: dict[str, Any],
    termination_reason: str,
    messages: Sequence[Message],
    final_env: DomainEnvironment,
    judge: Judge | None,
) -> RewardInfo:
    """Score one finished episode."""
    if termination_reason not in _STOP_REASONS:
        note = f"Simulation terminated prematurely. Termination reason: {termination_reason}"
        return RewardInfo(reward=0.0, info={"note": note})
    if not task.get("evaluation_criteria"):
        return RewardInfo(reward=1.0, info={"note": "No evaluation criteria"})
    basis = set(_criteria(task).get("reward_basis") or [])
    reward, breakdown = 1.0, {}
    info: dict[str, Any] = {}

    env_reward, env_breakdown, db_check, env_checks = _environment_component(
        domain, task, final_env, basis
    )
    if basis & _ENV_BASES:
        reward *= env_reward
        breakdown.update(env_breakdown)

    action_checks = _action_checks(task, messages)
    if "ACTION" in basis:
        breakdown["ACTION"] = float(all(c.action_match for c in action_checks))
        reward *= breakdown["ACTION"]

    communicate_checks = _communicate_checks(task, messages)
    if "COMMUNICATE" in basis:
        breakdown["COMMUNICATE"] = float(all(c.met for c in communicate_checks))
        reward *= breakdown["COMMUNICATE"]

    nl_checks: list[NLAssertionCheck] | None = None
    nl_scored: bool | None = None
    if "NL_ASSERTION" in basis:
        assertions = list(_criteria(task).get("nl_assertions") or [])
        if not assertions:
            nl_checks, nl_scored = [], True
            breakdown["NL_ASSERTION"] = 1.0
        elif judge is None:
            nl_scored = False
            info["nl"] = "NL assertions not scored: no judge model configured"
        else:
            nl_checks, nl_scored = await judge.judge(messages, assertions), True
            info["nl"] = {"judge_model": judge.model}
            breakdown["NL_ASSERTION"] = float(all(c.met for c in nl_checks))
            reward *= breakdown["NL_ASSERTION"]

    return RewardInfo(
        reward=reward,
        db_check=db_check,
        env_assertions=env_checks,
        action_checks=action_checks,
        nl_assertions=nl_checks,
        communicate_checks=communicate_checks,
        reward_basis=list(_criteria(task).get("reward_basis") or []),
        reward_breakdown=breakdown,
        info=info or None,
        nl_assertions_scored=nl_scored,
    )
