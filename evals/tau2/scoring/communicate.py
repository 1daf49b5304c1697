"""COMMUNICATE: each required string appears in an agent text turn (case- and comma-blind)."""

from __future__ import annotations

from evals.tau2.logs import AssistantMessage, CommunicateCheck
from evals.tau2.scoring.base import Score, ScoredEpisode
from evals.tau2.tasks import RewardType

__all__ = ["CommunicateScorer"]


def _plain(text: str) -> str:
    # τ²-bench's matching: lower case, commas dropped ("1,234.50" says "1234.50").
    return text.lower().replace(",", "")


class CommunicateScorer:
    component = RewardType.COMMUNICATE

    async def score(self, episode: ScoredEpisode) -> Score:
        spoken = [
            m.content
            for m in episode.messages
            if isinstance(m, AssistantMessage) and m.content and m.has_text_content()
        ]
        checks = []
        for info in episode.criteria.communicate_info or []:
            said = next((text for text in spoken if info.lower() in _plain(text)), None)
            note = (  # τ²-bench's justification texts
                f"Information '{info}' communicated in the message:\n '{said}'"
                if said is not None
                else f"Information '{info}' not communicated."
            )
            checks.append(CommunicateCheck(info=info, met=said is not None, justification=note))
        reward = float(all(check.met for check in checks))
        return Score(
            reward=reward,
            breakdown={self.component.value: reward},
            fields={"communicate_checks": checks},
        )
