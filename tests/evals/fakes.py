"""A tiny domain and scripted participants for unit tests of the orchestrator, reward and runner.

The domain is a counter: agent tool ``add(amount)`` adds to it, ``fail()`` always fails, the user
tool ``press(button)`` records presses. Its state hash, env assertions and gold replay behave like
a real domain's, so the engine can be tested without τ²-bench data.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from evals.tau2.domains.base import Requestor, ToolResult
from evals.tau2.logs import AssistantMessage, Message, ToolCall, UserMessage
from evals.tau2.tasks import (
    EnvAssertion,
    InitialState,
    Task,
    as_env_assertion,
    as_initial_state,
    as_task,
)

POLICY = "Add what the customer asks for."


def _tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
            },
        },
    }


class CounterEnvironment:
    def __init__(self) -> None:
        self.total = 0
        self.presses: list[str] = []

    def agent_tools(self) -> list[dict[str, Any]]:
        return [_tool("add", {"amount": {"type": "integer"}}), _tool("fail", {})]

    def user_tools(self) -> list[dict[str, Any]]:
        return [_tool("press", {"button": {"type": "string"}})]

    def call_tool(self, requestor: Requestor, name: str, arguments: dict[str, Any]) -> ToolResult:
        if requestor == "assistant" and name == "add":
            amount = arguments.get("amount")
            if not isinstance(amount, int):
                return ToolResult("Error: amount must be an integer", True)
            self.total += amount
            return ToolResult(json.dumps({"total": self.total}), False)
        if requestor == "assistant" and name == "fail":
            return ToolResult("Error: this tool always fails", True)
        if requestor == "user" and name == "press":
            self.presses.append(str(arguments.get("button")))
            return ToolResult("pressed", False)
        return ToolResult(f"Error: Tool '{name}' not found.", True)

    def apply_initial_state(self, initial_state: InitialState | Mapping[str, Any] | None) -> None:
        state = as_initial_state(initial_state)
        for action in (state.initialization_actions if state else None) or []:
            self.call_tool(action.env_type, action.func_name, action.arguments)

    def run_env_assertion(self, assertion: EnvAssertion | Mapping[str, Any]) -> bool:
        typed = as_env_assertion(assertion)
        value = self.total == typed.arguments["value"]
        return value == typed.assert_value

    def db_hash(self) -> str:
        state = json.dumps({"total": self.total, "presses": self.presses}, sort_keys=True)
        return hashlib.sha256(state.encode()).hexdigest()


class CounterDomain:
    name = "counter"
    policy = POLICY

    def __init__(self, tasks: list[dict[str, Any]] | None = None) -> None:
        self._tasks = [as_task(task) for task in tasks or []]

    def tasks(self, split: str | None = "base") -> list[Task]:
        return [task.model_copy(deep=True) for task in self._tasks]

    def new_environment(self) -> CounterEnvironment:
        return CounterEnvironment()


def make_task(
    task_id: str = "t0",
    *,
    actions: list[dict[str, Any]] | None = None,
    reward_basis: list[str] | None = None,
    **criteria: Any,
) -> dict[str, Any]:
    return {
        "id": task_id,
        "user_scenario": {"instructions": "Ask for 2 then 1."},
        "initial_state": None,
        "evaluation_criteria": {
            "actions": actions
            if actions is not None
            else [
                {"action_id": "a0", "name": "add", "arguments": {"amount": 2}},
                {"action_id": "a1", "name": "add", "arguments": {"amount": 1}},
            ],
            "reward_basis": reward_basis or ["DB"],
            **criteria,
        },
    }


def call(name: str, call_id: str = "", raw: str | None = None, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments, raw_arguments=raw)


def says(text: str | None = None, *calls: ToolCall) -> AssistantMessage:
    return AssistantMessage(content=text, tool_calls=list(calls) or None)


def user_says(text: str | None = None, *calls: ToolCall) -> UserMessage:
    return UserMessage(content=text, tool_calls=list(calls) or None)


class ScriptedAgent:
    """Answers with the next scripted turn; records what it was given. Cycles its last turn."""

    def __init__(self, turns: Sequence[AssistantMessage | Exception], delay: float = 0.0) -> None:
        self.turns = list(turns)
        self.seen: list[list[Message]] = []
        self.delay = delay

    async def generate(self, incoming: Sequence[Message]) -> AssistantMessage:
        self.seen.append(list(incoming))
        if self.delay:
            await asyncio.sleep(self.delay)
        turn = self.turns.pop(0) if len(self.turns) > 1 else self.turns[0]
        if isinstance(turn, Exception):
            raise turn
        return turn.model_copy(deep=True)

    def is_stop(self, message: AssistantMessage) -> bool:
        return message.content is not None and "###STOP###" in message.content


class ScriptedUser:
    def __init__(self, turns: Sequence[UserMessage | Exception]) -> None:
        self.turns = list(turns)
        self.seen: list[list[Message]] = []

    async def generate(self, incoming: Sequence[Message]) -> UserMessage:
        self.seen.append(list(incoming))
        turn = self.turns.pop(0) if len(self.turns) > 1 else self.turns[0]
        if isinstance(turn, Exception):
            raise turn
        return turn.model_copy(deep=True)
