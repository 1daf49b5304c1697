"""NL_ASSERTION: natural-language assertions graded by an LLM judge, when one is configured.

Without a judge the component is not scored: its reward is None, the episode is flagged
(``RewardInfo.nl_assertions_scored = False``) and summaries count such episodes apart. τ²-bench
would end them as infrastructure errors; scoring them as passed or failed would both be wrong.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from evals.logs import Message, NLAssertionCheck
from evals.scoring.base import Score, ScoredEpisode
from evals.tasks import RewardType

__all__ = ["NLAssertionScorer", "OpenAIJudge", "parse_judge_output"]

NOT_SCORED = "NL assertions not scored: no judge model configured"

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


class NLAssertionScorer:
    component = RewardType.NL_ASSERTION

    async def score(self, episode: ScoredEpisode) -> Score:
        assertions = list(episode.criteria.nl_assertions or [])
        key = self.component.value
        if not assertions:
            return Score(reward=1.0, breakdown={key: 1.0}, fields={"nl_assertions": []})
        if episode.judge is None:
            return Score(reward=None, note=NOT_SCORED)
        checks = await episode.judge.judge(episode.messages, assertions)
        reward = float(all(check.met for check in checks))
        return Score(
            reward=reward,
            breakdown={key: reward},
            fields={"nl_assertions": checks},
            note={"judge_model": episode.judge.model},
        )
