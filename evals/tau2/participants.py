"""The seam between the orchestrator and whoever speaks: agent and user protocols.

An agent or user object lives for one episode. The orchestrator hands it the messages addressed to
it since its last turn (text from the other side, or results of its own tool calls) and gets back
one message: text, or tool calls. A participant that cannot answer raises ``ParticipantError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evals.tau2.logs import AssistantMessage, Message, UserMessage
from evals.tau2.tasks import Task

__all__ = [
    "OUT_OF_SCOPE",
    "STOP",
    "TRANSFER",
    "USER_STOP_TOKENS",
    "Agent",
    "AgentError",
    "AgentFactory",
    "EpisodeContext",
    "ParticipantError",
    "User",
    "UserError",
    "UserFactory",
    "is_user_stop",
]

STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
USER_STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)


class ParticipantError(Exception):
    """A participant could not produce a turn (model unreachable, bad response)."""


class AgentError(ParticipantError):
    """The agent could not produce a turn; the episode ends with ``agent_error``."""


class UserError(ParticipantError):
    """The user simulator could not produce a turn; the episode ends with ``user_error``."""


@dataclass(frozen=True)
class EpisodeContext:
    """What a participant may know about the episode it is created for."""

    episode_id: str
    task: Task
    policy: str
    agent_tools: list[dict[str, Any]]
    user_tools: list[dict[str, Any]]
    trial: int
    seed: int | None


class Agent(Protocol):
    async def generate(self, incoming: Sequence[Message]) -> AssistantMessage: ...

    def is_stop(self, message: AssistantMessage) -> bool: ...


class User(Protocol):
    async def generate(self, incoming: Sequence[Message]) -> UserMessage: ...


AgentFactory = Callable[[EpisodeContext], Agent]
UserFactory = Callable[[EpisodeContext], User]


def is_user_stop(message: UserMessage) -> bool:
    """τ²-bench's user stop: a text turn containing any of the stop tokens."""
    if message.is_tool_call() or message.content is None:
        return False
    return any(token in message.content for token in USER_STOP_TOKENS)
