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

from evals.domains.base import Domain, DomainEnvironment, Requestor
from evals.logs import (
    AssistantMessage,
    Message,
    SimulationRun,
    TerminationReason,
    ToolCall,
    ToolMessage,
    UserMessage,
    now,
)
from evals.participants import (
    AgentError,
    AgentFactory,
    EpisodeContext,
    UserError,
    UserFactory,
    is_user_stop,
)
from evals.tasks import Task, as_task

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
    agent, user = make_agent(context), make_user(context)

    greeting = AssistantMessage(content=GREETING, timestamp=now(), cost=0.0)
    trajectory: list[Message] = [greeting]
    tally = _Tally()
    # The agent's own greeting opens its history; it is also the user's first input.
    agent_inbox: list[Message] = [greeting]
    pending: Sequence[Message] = [greeting]
    from_role: Role = "agent"
    to_role: Role = "user"
    steps = 0
    reason: TerminationReason | None = None
    error_detail: str | None = None

    while reason is None:
        if to_role == "user":
            try:
                user_message = await user.generate(pending)
            except UserError as exc:
                reason, error_detail = "user_error", str(exc)
                break
            user_message.timestamp = user_message.timestamp or now()
            _with_call_ids(user_message, "user")
            trajectory.append(user_message)
            if not user_message.is_tool_call() and not user_message.has_text_content():
                user_message.empty_turn = True
                tally.empty["user"] += 1
                reason, error_detail = "user_error", "user sent an empty message"
            elif is_user_stop(user_message):
                reason = "user_stop"
            from_role, pending = "user", [user_message]
            to_role = "env" if user_message.is_tool_call() else "agent"
            if to_role == "agent":
                agent_inbox.append(user_message)
        elif to_role == "agent":
            try:
                agent_message = await agent.generate(agent_inbox)
            except AgentError as exc:
                reason, error_detail = "agent_error", str(exc)
                break
            agent_inbox = []
            agent_message.timestamp = agent_message.timestamp or now()
            _with_call_ids(agent_message, "assistant")
            trajectory.append(agent_message)
            if not agent_message.is_tool_call() and not agent_message.has_text_content():
                agent_message.empty_turn = True
                tally.empty["assistant"] += 1
                reason, error_detail = "agent_error", "agent sent an empty message"
            elif agent.is_stop(agent_message):
                reason = "agent_stop"
            from_role, pending = "agent", [agent_message]
            to_role = "env" if agent_message.is_tool_call() else "user"
        else:
            caller = pending[0]
            assert isinstance(caller, AssistantMessage | UserMessage)
            requestor: Requestor = "assistant" if from_role == "agent" else "user"
            results = [
                _execute(environment, requestor, call, tally) for call in caller.tool_calls or []
            ]
            trajectory.extend(results)
            pending = results
            if from_role == "agent":
                agent_inbox.extend(results)
            to_role, from_role = from_role, "env"
        steps += 1
        if to_role != "env":
            if steps >= config.max_steps:
                reason = "max_steps"
            if sum(tally.errors.values()) >= config.max_errors:
                reason = "too_many_errors"

    for index, message in enumerate(trajectory):
        message.turn_idx = index
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
