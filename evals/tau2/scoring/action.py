"""ACTION: every gold action appears among the trajectory's tool calls (agent's or user's)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from evals.tau2.logs import ActionCheck, AssistantMessage, ToolCall, UserMessage
from evals.tau2.scoring.base import Score, ScoredEpisode
from evals.tau2.tasks import Action, RewardType

__all__ = ["ActionScorer", "action_matches"]


def action_matches(action: Action | Mapping[str, Any], call: ToolCall) -> bool:
    """τ²-bench's ``Action.compare_with_tool_call``: same name, equal values on ``compare_args``
    (all of the call's own argument names when ``compare_args`` is null)."""
    if isinstance(action, Action):
        name, arguments, compare_args = action.name, action.arguments, action.compare_args
    else:
        name, arguments = action["name"], action.get("arguments", {})
        compare_args = action.get("compare_args")
    if name != call.name:
        return False
    keys: Iterable[str] = call.arguments.keys() if compare_args is None else compare_args
    keys = list(keys)
    if not keys:
        return True
    expected = {k: v for k, v in arguments.items() if k in keys}
    actual = {k: v for k, v in call.arguments.items() if k in keys}
    return expected == actual


class ActionScorer:
    component = RewardType.ACTION

    async def score(self, episode: ScoredEpisode) -> Score:
        calls = [
            call
            for message in episode.messages
            if isinstance(message, AssistantMessage | UserMessage)
            for call in message.tool_calls or []
        ]
        checks = []
        for action in episode.criteria.actions or []:
            found = any(action_matches(action, call) for call in calls)
            checks.append(
                ActionCheck(
                    action=action.model_dump(mode="json"),
                    action_match=found,
                    action_reward=float(found),
                )
            )
        reward = float(all(check.action_match for check in checks))
        return Score(
            reward=reward,
            breakdown={self.component.value: reward},
            fields={"action_checks": checks},
        )
