"""DB and ENV_ASSERTION: the final state against the gold replay, and the task's env assertions.

Both are skipped (reward 1, no breakdown entry) only when the task has neither ``actions`` nor
``env_assertions``, as τ²-bench's ``EnvironmentEvaluator``.
"""

from __future__ import annotations

import math

from evals.tau2.logs import DBCheck, EnvAssertionCheck
from evals.tau2.scoring.base import Score, ScoredEpisode
from evals.tau2.tasks import RewardType

__all__ = ["DBScorer", "EnvAssertionScorer", "nothing_to_compare"]


def nothing_to_compare(episode: ScoredEpisode) -> bool:
    criteria = episode.criteria
    return criteria.actions is None and criteria.env_assertions is None


class DBScorer:
    component = RewardType.DB

    async def score(self, episode: ScoredEpisode) -> Score:
        if nothing_to_compare(episode):
            return Score(
                reward=1.0,
                fields={"db_check": DBCheck(db_match=True, db_reward=1.0)},
                note="No expected actions or env assertions",
            )
        match = episode.gold_environment.db_hash() == episode.final_env.db_hash()
        reward = 1.0 if match else 0.0
        return Score(
            reward=reward,
            breakdown={self.component.value: reward},
            fields={"db_check": DBCheck(db_match=match, db_reward=reward)},
        )


class EnvAssertionScorer:
    component = RewardType.ENV_ASSERTION

    async def score(self, episode: ScoredEpisode) -> Score:
        if nothing_to_compare(episode):
            return Score(reward=1.0, fields={"env_assertions": []})
        checks = []
        for assertion in episode.criteria.env_assertions or []:
            met = episode.final_env.run_env_assertion(assertion)
            checks.append(
                EnvAssertionCheck(
                    env_assertion=assertion.model_dump(mode="json"), met=met, reward=float(met)
                )
            )
        reward = math.prod(check.reward for check in checks)
        return Score(
            reward=reward,
            breakdown={self.component.value: reward},
            fields={"env_assertions": checks},
        )
