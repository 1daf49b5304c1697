"""Episode reward as τ²-bench v1.0.1 computes it: a product over the task's ``reward_basis``.

Each component is one scorer of ``evals.tau2.scoring`` (DB, ENV_ASSERTION, ACTION, COMMUNICATE,
NL_ASSERTION); this module composes them, and holds success and pass^k. With no judge configured,
NL assertions are recorded as not scored (the episode is flagged) and the other components still
count. An episode that ended other than ``agent_stop`` / ``user_stop`` gets reward 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from evals.tau2.domains.base import Domain, DomainEnvironment
from evals.tau2.logs import Message, RewardInfo
from evals.tau2.scoring import SCORERS, Judge, ScoredEpisode, Scorer
from evals.tau2.tasks import RewardType, Task, as_task

__all__ = ["evaluate_episode", "is_successful", "pass_hat_k", "pass_hat_ks"]

SUCCESS_TOLERANCE = 1e-6
_STOP_REASONS = frozenset({"agent_stop", "user_stop"})


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


_INFO_KEYS = {
    RewardType.DB: "env",
    RewardType.ENV_ASSERTION: "env",
    RewardType.ACTION: "action",
    RewardType.COMMUNICATE: "communicate",
    RewardType.NL_ASSERTION: "nl",
}


async def evaluate_episode(
    *,
    domain: Domain,
    task: Task | Mapping[str, Any],
    termination_reason: str,
    messages: Sequence[Message],
    final_env: DomainEnvironment,
    judge: Judge | None,
    scorers: Sequence[Scorer] = SCORERS,
) -> RewardInfo:
    """Score one finished episode: the product of the scores of the task's basis components."""
    if termination_reason not in _STOP_REASONS:
        note = f"Simulation terminated prematurely. Termination reason: {termination_reason}"
        return RewardInfo(reward=0.0, info={"note": note})
    task = as_task(task)
    if task.evaluation_criteria is None:
        return RewardInfo(reward=1.0, info={"note": "No evaluation criteria"})
    basis = list(task.evaluation_criteria.reward_basis)
    episode = ScoredEpisode(domain, task, messages, final_env, judge)
    reward, breakdown = 1.0, {}
    fields: dict[str, Any] = {}
    info: dict[str, Any] = {}
    nl_scored: bool | None = None
    for scorer in scorers:
        component = scorer.component
        if component == RewardType.NL_ASSERTION and component not in basis:
            continue  # τ²-bench asks the judge only for tasks whose basis needs it
        score = await scorer.score(episode)
        fields.update(score.fields)
        if score.note is not None:
            info[_INFO_KEYS[component]] = score.note
        if component == RewardType.NL_ASSERTION:
            nl_scored = score.reward is not None
        if component in basis and score.reward is not None:
            reward *= score.reward
            breakdown.update(score.breakdown)
    return RewardInfo(
        reward=reward,
        **fields,
        reward_basis=[component.value for component in basis],
        reward_breakdown=breakdown,
        info=info or None,
        nl_assertions_scored=nl_scored,
    )
