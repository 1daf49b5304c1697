"""NL_ASSERTION: natural-language assertions graded by an LLM judge, when one is configured.

Without a judge the component is not scored: its reward is None, the episode is flagged
(``RewardInfo.nl_assertions_scored = False``) and summaries count such episodes apart. τ²-bench
would end them as infrastructure errors; scoring them as passed or failed would both be wrong.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from evals.tau2.logs import Message, NLAssertionCheck
from evals.tau2.scoring.base import Score, ScoredEpisode
from evals.tau2.tasks import RewardType

__all__ = [
    "JUDGE_SYSTEM_PROMPT",
    "NLAssertionScorer",
    "OpenAIJudge",
    "judge_messages",
    "parse_judge_output",
]

NOT_SCORED = "NL assertions not scored: no judge model configured"

# τ²-bench v1.0.1's judge prompts, byte for byte (``evaluator_nl_assertions.py``: indented
# triple-quoted strings, so every line carries its 8 spaces; tests/evals/test_golden.py checks).
_INDENT = " " * 8
_JUDGE_SYSTEM_LINES = (
    "",
    "TASK",
    "- You will be given a list of expected outcomes and a conversation that was collected "
    "during a test case run.",
    "- The conversation is between an agent and a customer.",
    "- Your job is to evaluate whether the agent satisfies each of the expected outcomes.",
    "- Grade each expected outcome individually.",
    None,
    "FORMAT",
    "- Your response should be a JSON object with the following fields:",
    "- `reasoning`: a short explanation for your classification",
    "- `metExpectation`: `true` if the agent satisfies the expected outcomes, `false` otherwise",
    "- `expectedOutcome`: repeat the expectation from the input that you are grading",
    "",
    "Example response structure:",
    "{",
    '    "results": [',
    "        {",
    '            "expectedOutcome": "<one of the expected outcomes from the input>",',
    '            "reasoning": "<reasoning trace>",',
    '            "metExpectation": <false or true>,',
    "        }",
    "    ]",
    "}",
    "",
)
# None marks the one line of the source that is empty (no indentation).
JUDGE_SYSTEM_PROMPT = "\n" + "\n".join(
    "" if line is None else _INDENT + line for line in _JUDGE_SYSTEM_LINES[1:]
)


def judge_messages(messages: Sequence[Message], assertions: list[str]) -> list[dict[str, str]]:
    """The judge's chat messages, as τ²-bench's ``evaluate_nl_assertions`` builds them."""
    conversation = "\n".join(f"{m.role}: {m.content}" for m in messages)
    user_prompt = (
        f"\n{_INDENT}conversation:\n{_INDENT}{conversation}\n{_INDENT}\n"
        f"{_INDENT}expectedOutcomes:\n{_INDENT}{assertions}\n{_INDENT}"
    )
    return [
        {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
        {"role": "user", "content": user_prompt},
    ]


class OpenAIJudge:
    """An NL-assertion judge behind any OpenAI-compatible endpoint."""

    def __init__(self, client: Any, model: str, temperature: float = 0.0) -> None:
        self.client = client
        self.model = model
        self.temperature = temperature

    async def judge(
        self, messages: Sequence[Message], assertions: list[str]
    ) -> list[NLAssertionCheck]:
        response = await self.client.chat.completions.create(
            model=self.model,
            temperature=self.temperature,
            messages=judge_messages(messages, assertions),
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
