"""What every reward component shares: the scored episode, a component's score, the protocol.

A scorer looks at one finished episode and returns its component's ``Score``; ``evals.tau2.reward``
multiplies the scores of the components the task's ``reward_basis`` names, as τ²-bench's
``evaluate_simulation`` does. Scorers run for every component, basis or not (diagnostics).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from evals.tau2.domains.base import Domain, DomainEnvironment
from evals.tau2.logs import Message, NLAssertionCheck
from evals.tau2.tasks import EvaluationCriteria, RewardType, Task

__all__ = ["Judge", "Score", "ScoredEpisode", "Scorer", "replay_gold"]


class Judge(Protocol):
    """Grades natural-language assertions against a conversation."""

    model: str

    async def judge(
        self, messages: Sequence[Message], assertions: list[str]
    ) -> list[NLAssertionCheck]: ...


@dataclass(frozen=True)
class ScoredEpisode:
    """One finished episode as the scorers see it."""

    domain: Domain
    task: Task
    messages: Sequence[Message]
    final_env: DomainEnvironment
    judge: Judge | None = None

    @property
    def criteria(self) -> EvaluationCriteria:
        return self.task.evaluation_criteria or EvaluationCriteria()

    @cached_property
    def gold_environment(self) -> DomainEnvironment:
        return replay_gold(self.domain, self.task)


def replay_gold(domain: Domain, task: Task) -> DomainEnvironment:
    """A fresh environment with the task's initial state and every gold action replayed."""
    environment = domain.new_environment()
    environment.apply_initial_state(task.initial_state)
    criteria = task.evaluation_criteria
    for action in (criteria.actions if criteria is not None else None) or []:
        # A failing gold call leaves the state as it was, as τ²-bench (it logs and continues).
        environment.call_tool(action.requestor, action.name, dict(action.arguments))
    return environment


@dataclass
class Score:
    """One component's verdict.

    ``reward`` is None when the component could not be scored (NL assertions without a judge):
    the composition leaves it out of the product and flags the episode. ``breakdown`` is what the
    component adds to ``RewardInfo.reward_breakdown`` when it is in the basis; ``fields`` the
    ``RewardInfo`` fields it fills (its checks), whether in the basis or not.
    """

    reward: float | None
    breakdown: dict[str, float] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)
    note: str | dict[str, Any] | None = None  # for ``RewardInfo.info``


class Scorer(Protocol):
    """One reward component (``RewardType``) of τ²-bench."""

    component: RewardType

    async def score(self, episode: ScoredEpisode) -> Score: ...
