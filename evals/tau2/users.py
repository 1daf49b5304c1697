"""User simulators: an LLM following the task's scenario, and a scripted gold user.

``LLMUserSimulator`` follows τ²-bench's: its system prompt is the global simulation guidelines from
the data folder (the ``_tools`` variant when the domain gives the user tools) followed by the task's
scenario; it sees the conversation with roles flipped and may call the user-device tools (Telecom).
``GoldUser`` opens the conversation, performs one block of the task's gold ``user`` actions each
time the agent asks, and answers anything else with ``###STOP###``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evals.tau2.agents import ModelConfig, action_blocks
from evals.tau2.chat import complete_turn, to_openai_messages
from evals.tau2.logs import Message, ToolCall, ToolMessage, UserMessage
from evals.tau2.participants import STOP, EpisodeContext, UserError
from evals.tau2.tasks import Action, UserScenario

__all__ = [
    "GoldUser",
    "LLMUserSimulator",
    "load_guidelines",
    "render_scenario",
    "user_system_prompt",
]


def load_guidelines(data_dir: Path, *, with_tools: bool) -> str:
    """τ²-bench's global user-simulation guidelines, read from the data folder."""
    name = "simulation_guidelines_tools.md" if with_tools else "simulation_guidelines.md"
    return (data_dir / "tau2" / "user_simulator" / name).read_text(encoding="utf-8")


def render_scenario(scenario: UserScenario | Mapping[str, Any]) -> str:
    """A task's ``user_scenario`` as text, exactly τ²-bench's ``UserScenario.__str__`` (tabs)."""
    typed = (
        scenario if isinstance(scenario, UserScenario) else UserScenario.model_validate(scenario)
    )
    return str(typed)


def user_system_prompt(guidelines: str, scenario: UserScenario | Mapping[str, Any]) -> str:
    """τ²-bench's user system prompt (no runtime persona config: the placeholder goes empty)."""
    guidelines = guidelines.replace("<PERSONA_GUIDELINES>", "")
    return f"{guidelines}\n\n<scenario>\n{render_scenario(scenario)}\n</scenario>"


class LLMUserSimulator:
    """The simulated customer, an LLM behind an OpenAI-compatible URL."""

    def __init__(
        self, client: Any, model: ModelConfig, guidelines: str, context: EpisodeContext
    ) -> None:
        self._client = client
        self._model = model
        self._context = context
        self._system_prompt = user_system_prompt(guidelines, context.task.user_scenario)
        self._history: list[Message] = []

    async def generate(self, incoming: Sequence[Message]) -> UserMessage:
        self._history.extend(incoming)
        try:
            content, calls, usage, _ = await complete_turn(
                self._client,
                model=self._model.model,
                messages=to_openai_messages(self._system_prompt, self._history, speaker="user"),
                headers=self._model.headers(f"{self._context.episode_id}:user"),
                tools=self._context.user_tools,
                sampling=self._model.sampling(self._context.seed),
            )
        except Exception as exc:  # any failure to get a turn ends the episode as user_error
            raise UserError(f"{type(exc).__name__}: {exc}") from exc
        message = UserMessage(content=content, tool_calls=calls, usage=usage or None)
        self._history.append(message)
        return message


class GoldUser:
    """A scripted user for checks: performs the gold user actions block by block, then stops."""

    OPENING = "Hi, I need some help, please."
    DONE = "Done. What next?"

    def __init__(self, context: EpisodeContext) -> None:
        self._blocks = [a for r, a in action_blocks(context.task.gold_actions) if r == "user"]
        self._opened = False
        self._queue: list[Action] = []
        self._count = 0

    async def generate(self, incoming: Sequence[Message]) -> UserMessage:
        if not self._opened:
            self._opened = True
            return UserMessage(content=self.OPENING)
        replying_to_tools = bool(incoming) and all(isinstance(m, ToolMessage) for m in incoming)
        if not replying_to_tools and not self._queue:
            if not self._blocks:
                return UserMessage(content=STOP)
            self._queue = list(self._blocks.pop(0))
        if self._queue:
            action = self._queue.pop(0)
            self._count += 1
            call = ToolCall(
                id=f"user_gold_{self._count}",
                name=action.name,
                arguments=dict(action.arguments),
                requestor="user",
            )
            return UserMessage(tool_calls=[call])
        return UserMessage(content=self.DONE)
