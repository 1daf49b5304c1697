"""Decision points taken from τ²-bench itself: the gold replay, cut at every gold tool call.

τ²-bench ships gold actions, not conversations. Each task is replayed with the gold agent and the
gold user (reward 1 on every base task); the user opens with the task's own reason for calling (the
scripted user's first turn) and the identity facts its scenario states, since the gold agent
looks the user up without asking, so the model under test has what the gold call uses. At every
agent turn the gold trajectory answers with a tool call, the conversation so far (as ``LLMAgent``
would send it) is one decision point, labelled with the gold call. ``select_points`` draws ``N``
of them with a seed, spread evenly over the domains and ordered per task, so each prompt extends
the one before.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evals.tau2.agents import GoldAgent, agent_system_prompt
from evals.tau2.chat import to_openai_messages
from evals.tau2.domains import load_domain
from evals.tau2.logs import AssistantMessage, Message, UserMessage
from evals.tau2.orchestrator import OrchestratorConfig, run_episode
from evals.tau2.participants import EpisodeContext
from evals.tau2.scripted_user import extract_facts, opening_message
from evals.tau2.users import GoldUser

__all__ = ["DecisionPoint", "DomainPoints", "replay_domain", "select_points"]


@dataclass(frozen=True)
class DecisionPoint:
    """One prompt (the conversation before a gold tool call) and the call the gold agent made."""

    key: str  # "domain/task_id/turn": stable across runs and arms
    domain: str
    task_id: str
    turn: int  # the agent turn within the task (0 = its first answer after the greeting)
    messages: tuple[dict[str, Any], ...]
    gold_name: str
    gold_arguments: dict[str, Any]

    @property
    def digest(self) -> str:
        """sha256 of the prompt: a resumed screen checks it asks the same question."""
        return hashlib.sha256(orjson.dumps(list(self.messages))).hexdigest()

    def label(self) -> dict[str, Any]:
        """What the points file keeps: everything but the (re-derivable) prompt."""
        return {
            "key": self.key,
            "domain": self.domain,
            "task_id": self.task_id,
            "turn": self.turn,
            "gold_name": self.gold_name,
            "gold_arguments": self.gold_arguments,
            "messages": len(self.messages),
            "digest": self.digest,
        }


@dataclass(frozen=True)
class DomainPoints:
    """Every decision point of one domain, in task order, and the agent's tools there."""

    domain: str
    tools: list[dict[str, Any]]
    points: tuple[DecisionPoint, ...]


def _identity(scenario: dict[str, Any]) -> str:
    facts = extract_facts(scenario)
    said = []
    if facts.name:
        said.append(f"My name is {facts.name}.")
    if facts.zip_code:
        said.append(f"My zip code is {facts.zip_code}.")
    if facts.emails:
        said.append(f"My email is {' or '.join(facts.emails)}.")
    if facts.user_id:
        said.append(f"My user id is {facts.user_id}.")
    if facts.phone:
        said.append(f"My phone number is {facts.phone}.")
    return " ".join(said)


class _OpeningGoldUser:
    """The gold user, except that it opens with the task's reason for calling and who it is."""

    def __init__(self, context: EpisodeContext) -> None:
        self._gold = GoldUser(context)
        scenario = context.task.raw().get("user_scenario") or {}
        opening = " ".join(p for p in (opening_message(scenario), _identity(scenario)) if p)
        self._opening = opening or GoldUser.OPENING
        self._opened = False

    async def generate(self, incoming: Sequence[Message]) -> UserMessage:
        if not self._opened:
            self._opened = True
            await self._gold.generate(incoming)  # consumes its generic opening
            return UserMessage(content=self._opening)
        return await self._gold.generate(incoming)


class _RecordingGoldAgent:
    """The gold agent; records the prompt ``LLMAgent`` would send before each gold tool call."""

    def __init__(self, context: EpisodeContext, domain: str, sink: list[DecisionPoint]) -> None:
        self._gold = GoldAgent(context)
        self._system = agent_system_prompt(context.policy)
        self._task_id = context.task.id
        self._domain = domain
        self._history: list[Message] = []
        self._turn = 0
        self._sink = sink

    async def generate(self, incoming: Sequence[Message]) -> AssistantMessage:
        self._history.extend(incoming)
        message = await self._gold.generate(incoming)
        if message.tool_calls:
            call = message.tool_calls[0]
            messages = to_openai_messages(self._system, self._history, speaker="assistant")
            self._sink.append(
                DecisionPoint(
                    key=f"{self._domain}/{self._task_id}/{self._turn}",
                    domain=self._domain,
                    task_id=self._task_id,
                    turn=self._turn,
                    messages=tuple(messages),
                    gold_name=call.name,
                    gold_arguments=dict(call.arguments),
                )
            )
        self._turn += 1
        self._history.append(message)
        return message

    def is_stop(self, message: AssistantMessage) -> bool:
        return self._gold.is_stop(message)


def replay_domain(name: str, data_dir: Path, split: str | None = "base") -> DomainPoints:
    """Replay every task of ``split`` with the gold agent; all decision points, in task order."""
    domain = load_domain(name, data_dir)
    sink: list[DecisionPoint] = []
    tools: list[dict[str, Any]] = []

    def make_agent(context: EpisodeContext) -> _RecordingGoldAgent:
        if not tools:
            tools.extend(context.agent_tools)
        return _RecordingGoldAgent(context, name, sink)

    async def replay() -> None:
        for task in domain.tasks(split):
            await run_episode(
                domain=domain,
                task=task,
                make_agent=make_agent,
                make_user=_OpeningGoldUser,
                config=OrchestratorConfig(),
                episode_id=f"screen-{name}-{task.id}",
            )

    asyncio.run(replay())
    return DomainPoints(name, tools, tuple(sink))


def select_points(domains: Sequence[DomainPoints], count: int, seed: int) -> list[DecisionPoint]:
    """``count`` points spread evenly over the domains, drawn with ``seed``, in replay order.

    The draw depends only on (domain, seed, quota), so every arm gets the same points; within a
    domain they stay in task and turn order (each prompt of a task extends the previous one).
    """
    if count < 1:
        raise ValueError("--points must be at least 1")
    chosen: list[DecisionPoint] = []
    quotas = [count // len(domains) + (i < count % len(domains)) for i in range(len(domains))]
    for domain, quota in zip(domains, quotas, strict=True):
        available = len(domain.points)
        if quota > available:
            raise ValueError(f"{domain.domain} has {available} decision points; asked for {quota}")
        rng = random.Random(f"{seed}:{domain.domain}")
        indices = sorted(rng.sample(range(available), quota))
        chosen.extend(domain.points[i] for i in indices)
    return chosen
