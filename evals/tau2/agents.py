"""Agents: an LLM agent behind any OpenAI-compatible URL (the proxy), and the gold-action replayer.

``LLMAgent`` follows τ²-bench's LLM agent: the domain policy in the system prompt, the domain's
tools, one message (text or tool calls) per turn, and it never ends the episode itself (the user
does). Every request carries ``X-Episode-ID`` so the proxy can keep one error budget per episode.
``GoldAgent`` replays the task's gold actions, asks the user to do the user-side ones, then stops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evals.tau2.chat import complete_turn, to_openai_messages
from evals.tau2.logs import AssistantMessage, Message, ToolCall
from evals.tau2.participants import STOP, AgentError, EpisodeContext
from evals.tau2.tasks import Action

__all__ = [
    "AGENT_INSTRUCTION",
    "EPISODE_HEADER",
    "GoldAgent",
    "LLMAgent",
    "ModelConfig",
    "action_blocks",
    "agent_system_prompt",
]

EPISODE_HEADER = "X-Episode-ID"

AGENT_INSTRUCTION = """\
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."""


def agent_system_prompt(policy: str) -> str:
    """The LLM agent's system prompt, laid out as τ²-bench's (instructions, then policy)."""
    return f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{policy}\n</policy>"


@dataclass(frozen=True)
class ModelConfig:
    """One model behind one OpenAI-compatible endpoint, with its sampling settings."""

    model: str
    base_url: str
    api_key: str = "EMPTY"
    temperature: float = 0.0
    seed: int | None = None
    timeout_s: float = 600.0
    max_retries: int = 2
    max_tokens: int | None = None  # a bound on each answer; None leaves it to the server
    # Sent with every request of this model, e.g. ``X-Repairproxy-Repair: reflexive``.
    extra_headers: Mapping[str, str] = field(default_factory=dict)

    def client(self) -> Any:
        """An ``openai.AsyncOpenAI`` for this endpoint (imported here: ``openai`` is heavy)."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            timeout=self.timeout_s,
            max_retries=self.max_retries,
        )

    def headers(self, episode_header: str) -> dict[str, str]:
        """Request headers: the configured extras, then the episode's id (which wins)."""
        return {**self.extra_headers, EPISODE_HEADER: episode_header}

    def sampling(self, seed: int | None) -> dict[str, Any]:
        """Sampling arguments for one request; the episode's seed wins over the configured one."""
        args: dict[str, Any] = {"temperature": self.temperature}
        chosen = seed if seed is not None else self.seed
        if chosen is not None:
            args["seed"] = chosen
        if self.max_tokens is not None:
            args["max_tokens"] = self.max_tokens
        return args


class LLMAgent:
    """A τ²-bench-style LLM agent talking to ``client`` (an ``openai.AsyncOpenAI``)."""

    def __init__(self, client: Any, model: ModelConfig, context: EpisodeContext) -> None:
        self._client = client
        self._model = model
        self._context = context
        self._system_prompt = agent_system_prompt(context.policy)
        self._history: list[Message] = []

    async def generate(self, incoming: Sequence[Message]) -> AssistantMessage:
        self._history.extend(incoming)
        try:
            content, calls, usage, proxy = await complete_turn(
                self._client,
                model=self._model.model,
                messages=to_openai_messages(
                    self._system_prompt, self._history, speaker="assistant"
                ),
                headers=self._model.headers(self._context.episode_id),
                tools=self._context.agent_tools,
                sampling=self._model.sampling(self._context.seed),
            )
        except Exception as exc:  # any failure to get a turn ends the episode as agent_error
            raise AgentError(f"{type(exc).__name__}: {exc}") from exc
        message = AssistantMessage(
            content=content, tool_calls=calls, usage=usage or None, repairproxy=proxy or None
        )
        self._history.append(message)
        return message

    def is_stop(self, message: AssistantMessage) -> bool:
        # τ²-bench's conversational LLM agent never stops the episode; the user does.
        return False


def action_blocks(
    actions: Sequence[Action | Mapping[str, Any]],
) -> list[tuple[str, list[Action]]]:
    """Gold actions grouped into maximal runs with the same requestor, in order."""
    blocks: list[tuple[str, list[Action]]] = []
    for raw in actions:
        action = raw if isinstance(raw, Action) else Action.model_validate(raw)
        if blocks and blocks[-1][0] == action.requestor:
            blocks[-1][1].append(action)
        else:
            blocks.append((action.requestor, [action]))
    return blocks


class GoldAgent:
    """Replays the gold ``assistant`` actions one tool call per turn.

    When the next gold actions belong to the user, it asks the user (one text turn per block of
    consecutive user actions; the gold user performs exactly one block per such request). After the
    last action it sends a closing line, and if it is spoken to again it stops with ``###STOP###``.
    """

    CLOSING = "Your request has been handled. Is there anything else I can help you with?"

    def __init__(self, context: EpisodeContext) -> None:
        self._blocks = action_blocks(context.task.gold_actions)
        self._block = 0
        self._within = 0
        self._closed = False

    async def generate(self, incoming: Sequence[Message]) -> AssistantMessage:
        if self._block < len(self._blocks):
            requestor, actions = self._blocks[self._block]
            if requestor == "user":
                self._block += 1
                steps = "; ".join(a.describe() for a in actions)
                return AssistantMessage(content=f"Please perform these steps on your side: {steps}")
            action = actions[self._within]
            self._within += 1
            if self._within == len(actions):
                self._block, self._within = self._block + 1, 0
            call = ToolCall(
                id=f"gold_{self._block}_{self._within}_{action.action_id}",
                name=action.name,
                arguments=dict(action.arguments),
            )
            return AssistantMessage(tool_calls=[call])
        if not self._closed:
            self._closed = True
            return AssistantMessage(content=self.CLOSING)
        return AssistantMessage(content=STOP)

    def is_stop(self, message: AssistantMessage) -> bool:
        return message.content is not None and STOP in message.content
