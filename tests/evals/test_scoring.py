"""The scorer seam: one scorer per τ²-bench reward component, composed by ``evaluate_episode``."""

from __future__ import annotations

import pytest

from evals.tau2.logs import AssistantMessage
from evals.tau2.reward import evaluate_episode
from evals.tau2.scoring import SCORERS, Score, ScoredEpisode
from evals.tau2.tasks import RewardType
from tests.evals.fakes import CounterDomain, CounterEnvironment, make_task

pytestmark = pytest.mark.anyio


def test_one_scorer_per_component() -> None:
    assert sorted(s.component.value for s in SCORERS) == sorted(t.value for t in RewardType)


class Fixed:
    def __init__(self, component: RewardType, reward: float | None) -> None:
        self.component = component
        self.reward = reward
        self.calls = 0

    async def score(self, episode: ScoredEpisode) -> Score:
        self.calls += 1
        breakdown = {} if self.reward is None else {self.component.value: self.reward}
        return Score(reward=self.reward, breakdown=breakdown)


async def test_reward_is_the_product_over_the_basis_only() -> None:
    task = make_task(reward_basis=["DB", "COMMUNICATE"])
    scorers = [
        Fixed(RewardType.DB, 1.0),
        Fixed(RewardType.COMMUNICATE, 1.0),
        Fixed(RewardType.ACTION, 0.0),  # not in the basis: runs, does not count
        Fixed(RewardType.NL_ASSERTION, 0.0),  # not in the basis: not even asked
    ]
    info = await evaluate_episode(
        domain=CounterDomain(),
        task=task,
        termination_reason="user_stop",
        messages=[AssistantMessage(content="hi")],
        final_env=CounterEnvironment(),
        judge=None,
        scorers=scorers,
    )
    assert info.reward == 1.0
    assert info.reward_breakdown == {"DB": 1.0, "COMMUNICATE": 1.0}
    assert [s.calls for s in scorers] == [1, 1, 1, 0]
    assert info.nl_assertions_scored is None
    scorers[1] = Fixed(RewardType.COMMUNICATE, 0.0)
    info = await evaluate_episode(
        domain=CounterDomain(),
        task=task,
        termination_reason="user_stop",
        messages=[],
        final_env=CounterEnvironment(),
        judge=None,
        scorers=scorers,
    )
    assert info.reward == 0.0


async def test_an_unscored_component_is_left_out_and_flagged() -> None:
    task = make_task(reward_basis=["DB", "NL_ASSERTION"], nl_assertions=["polite"])
    scorers = [Fixed(RewardType.DB, 1.0), Fixed(RewardType.NL_ASSERTION, None)]
    info = await evaluate_episode(
        domain=CounterDomain(),
        task=task,
        termination_reason="agent_stop",
        messages=[],
        final_env=CounterEnvironment(),
        judge=None,
        scorers=scorers,
    )
    assert info.reward == 1.0 and info.nl_assertions_scored is False
    assert info.reward_breakdown == {"DB": 1.0}


async def test_communicate_checks_carry_tau2s_justifications() -> None:
    task = make_task(reward_basis=["COMMUNICATE"], communicate_info=["1234.50", "refund"])
    said = "Your total is 1,234.50."
    info = await evaluate_episode(
        domain=CounterDomain(),
        task=task,
        termination_reason="user_stop",
        messages=[AssistantMessage(content=said)],
        final_env=CounterEnvironment(),
        judge=None,
    )
    assert info.communicate_checks is not None
    assert [c.justification for c in info.communicate_checks] == [
        f"Information '1234.50' communicated in the message:\n '{said}'",
        "Information 'refund' not communicated.",
    ]
    assert info.reward == 0.0
