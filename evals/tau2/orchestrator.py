"""The half-duplex agent / user / environment loop with τ²-bench v1.0.1's termination rules.

The agent opens with a fixed greeting; each step routes one message: agent or user text to the other
side, their tool calls to the environment, results back to the caller. Every failed tool call (by
agent or user) spends one unit of the episode's error budget, which is never reset; the episode ends
``too_many_errors`` once errors >= ``max_errors``, or ``max_steps`` after that many steps (both
checked only when no tool call is awaiting its result, as τ²-bench does).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from evals.tau2.domains.base import Domain, DomainEnvironment, Requestor
from evals.tau2.logs import (
    AssistantMessage,
    Message,
    SimulationRun,
    TerminationReason,
    ToolCall,
    ToolMessage,
    UserMessage,
    now,
)
from evals.tau2.participants import (
    Agent,
    AgentError,
    AgentFactory,
    EpisodeContext,
    ParticipantError,
    User,
    UserError,
    UserFactory,
    is_user_stop,
)
from evals.tau2.tasks import Task, as_task

__all__ = ["GREETING", "Episode", "OrchestratorConfig", "run_episode"]

GREETING = "Hi! How can I help you today?"
DEFAULT_MAX_STEPS = 200
DEFAULT_MAX_ERRORS = 10

Role = Literal["agent", "user", "env"]


@dataclass(frozen=True)
class OrchestratorConfig:
    max_steps: int = DEFAULT_MAX_STEPS
    max_errors: int = DEFAULT_MAX_ERRORS


@dataclass
class Episode:
    """A finished episode: its log (reward not yet set) and the environment in its final state."""

    run: SimulationRun
    environment: DomainEnvironment


@dataclass
class _Tally:
    errors: Counter[str] = field(default_factory=Counter)
    malformed: Counter[str] = field(default_factory=Counter)
    empty: Counter[str] = field(default_factory=Counter)


def _execute(
    environment: DomainEnvironment, requestor: Requestor, call: ToolCall, tally: _Tally
) -> ToolMessage:
    if call.malformed:
        # Unparseable arguments are a failing call, never dropped: the caller sees why.
        tally.malformed[requestor] += 1
        content = (
            f"Error: Invalid arguments for tool '{call.name}': expected a JSON object, "
            f"got {call.raw_arguments!r}"
        )
        error = True
    else:
        result = environment.call_tool(requestor, call.name, call.arguments)
        content, error = result.content, result.error
    if error:
        tally.errors[requestor] += 1
    return ToolMessage(
        id=call.id, content=content, requestor=requestor, error=error, timestamp=now()
    )


def _with_call_ids(message: AssistantMessage | UserMessage, requestor: Requestor) -> None:
    for call in message.tool_calls or []:
        call.requestor = requestor
        if not call.id:
            call.id = f"call_{uuid.uuid4().hex[:24]}"


def _offered(tools: list[dict[str, Any]], names: list[str] | None) -> list[dict[str, Any]]:
    """The user tools a task offers: all of them, or only those it names (τ²-bench's include)."""
    if names is None:
        return tools
    return [tool for tool in tools if tool["function"]["name"] in names]


@dataclass(frozen=True)
class _Side:
    """What differs between the agent's turn and the user's: the names, and which error ends it."""

    role: Role
    requestor: Requestor
    other: Role
    error: TerminationReason
    stop: TerminationReason
    failure: type[ParticipantError]


_SIDES: dict[Role, _Side] = {
    "agent": _Side("agent", "assistant", "user", "agent_error", "agent_stop", AgentError),
    "user": _Side("user", "user", "agent", "user_error", "user_stop", UserError),
}


@dataclass
class _Speakers:
    """The agent and the user behind one call shape, so a turn is played the same for both."""

    agent: Agent
    user: User

    async def generate(
        self, side: _Side, incoming: Sequence[Message]
    ) -> AssistantMessage | UserMessage:
        if side.role == "agent":
            return await self.agent.generate(incoming)
        return await self.user.generate(incoming)

    def is_stop(self, message: AssistantMessage | UserMessage) -> bool:
        if isinstance(message, AssistantMessage):
            return self.agent.is_stop(message)
        return is_user_stop(message)


def _ending(
    message: AssistantMessage | UserMessage, side: _Side, speakers: _Speakers, tally: _Tally
) -> tuple[TerminationReason | None, str | None]:
    """Whether this turn ends the episode: an empty turn is the speaker's error, else its stop."""
    if not message.is_tool_call() and not message.has_text_content():
        message.empty_turn = True
        tally.empty[side.requestor] += 1
        return side.error, f"{side.role} sent an empty message"
    if speakers.is_stop(message):
        return side.stop, None
    return None, None


async def run_episode(
    *,
    domain: Domain,
    task: Task | Mapping[str, Any],
    make_agent: AgentFactory,
    make_user: UserFactory,
    config: OrchestratorConfig,
    trial: int = 0,
    seed: int | None = None,
    episode_id: str | None = None,
) -> Episode:
    """Play one episode of ``task`` (typed, or a raw ``tasks.json`` entry) to its end."""
    task = as_task(task)
    episode_id = episode_id or str(uuid.uuid4())
    start_time, start = now(), time.perf_counter()
    environment = domain.new_environment()
    environment.apply_initial_state(task.initial_state)
    context = EpisodeContext(
        episode_id=episode_id,
        task=task,
        policy=domain.policy,
        agent_tools=environment.agent_tools(),
        user_tools=_offered(environment.user_tools(), task.user_tools),
        trial=trial,
        seed=seed,
    )
    speakers = _Speakers(agent=make_agent(context), user=make_user(context))

    greeting = AssistantMessage(content=GREETING, timestamp=now(), cost=0.0)
    trajectory: list[Message] = [greeting]
    tally = _Tally()
    # What each side was sent since its last turn. The agent's own greeting opens its history;
    # it is also the user's first input.
    inbox: dict[Role, list[Message]] = {"agent": [greeting], "user": [greeting]}
    message: AssistantMessage | UserMessage = greeting
    side = _SIDES["agent"]
    to_role: Role = "user"
    steps = 0
    reason: TerminationReason | None = None
    error_detail: str | None = None

    while reason is None:
        if to_role == "env":
            results = [
                _execute(environment, side.requestor, call, tally)
                for call in message.tool_calls or []
            ]
            trajectory.extend(results)
            inbox[side.role].extend(results)
            to_role = side.role
        else:
            side = _SIDES[to_role]
            try:
                message = await speakers.generate(side, inbox[side.role])
            except side.failure as exc:
                reason, error_detail = side.error, str(exc)
                break
            inbox[side.role] = []
            message.timestamp = message.timestamp or now()
            _with_call_ids(message, side.requestor)
            trajectory.append(message)
            reason, error_detail = _ending(message, side, speakers, tally)
            to_role = "env" if message.is_tool_call() else side.other
            if to_role != "env":
                inbox[to_role].append(message)
        steps += 1
        if to_role != "env":
            if steps >= config.max_steps:
                reason = "max_steps"
            if sum(tally.errors.values()) >= config.max_errors:
                reason = "too_many_errors"

    for index, logged in enumerate(trajectory):
        logged.turn_idx = index
    run = SimulationRun(
        id=episode_id,
        episode_id=episode_id,
        task_id=task.id,
        start_time=start_time,
        end_time=now(),
        duration=time.perf_counter() - start,
        termination_reason=reason,
        messages=trajectory,
        trial=trial,
        seed=seed,
        num_errors=sum(tally.errors.values()),
        errors_by_requestor=dict(tally.errors),
        malformed_tool_calls=dict(tally.malformed),
        empty_turns=dict(tally.empty),
        steps=steps,
        error_detail=error_detail,
    )
    return Episode(run=run, environment=environment)
