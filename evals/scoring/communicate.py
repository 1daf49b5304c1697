"""COMMUNICATE: each required string appears in an agent text turn (case- and comma-blind)."""

from __future__ import annotations

from evals.logs import AssistantMessage, CommunicateCheck
from evals.scoring.base import Score, ScoredEpisode
from evals.tasks import RewardType

__all__ = ["CommunicateScorer"]


class CommunicateScorer:
    component = RewardType.COMMUNICATE

    async def score(self, episode: ScoredEpisode) -> Score:
        spoken = [
            m.content.lower().replace(",", "")
            for m in episode.messages
            if isinstance(m, AssistantMessage) and m.content and m.has_text_content()
        ]
        checks = []
        for info in episode.criteria.communicate_info or []:
            met = any(info.lower() in text for text in spoken)
            note = f"Information '{info}' communicated" if met else f"'{info}' not communicated"
            checks.append(CommunicateCheck(info=info, met=met, justification=note))
        reward = float(all(check.met for check in checks))
        return Score(
            reward=reward,
            breakdown={self.component.value: reward},
            fields={"communicate_checks": checks},
        )
