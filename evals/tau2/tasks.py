"""τ²-bench tasks as typed models, parsed once from ``tasks.json``.

Field names, defaults and the text rendering of the user scenario follow τ²-bench v1.0.1's
``tau2/data_model/tasks.py``: ``str(task.user_scenario)`` is, byte for byte, the text τ²-bench puts
inside ``<scenario>`` in the user simulator's system prompt (tabs, not spaces;
``tests/evals/test_golden.py`` checks it against digests of τ²-bench's own prompts). Unknown
fields are kept (``extra="allow"``), so a task dumps back to what was read.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Action",
    "Description",
    "EnvAssertion",
    "EnvFunctionCall",
    "EvaluationCriteria",
    "InitialState",
    "InitializationData",
    "RewardType",
    "StructuredUserInstructions",
    "Task",
    "UserScenario",
    "as_env_assertion",
    "as_initial_state",
    "as_task",
]

Requestor = Literal["assistant", "user"]
_TAB = "\t"


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class StructuredUserInstructions(_Model):
    """The user's situation, in fields (Telecom); Retail gives a plain string instead."""

    domain: str
    reason_for_call: str
    known_info: str | None = None
    unknown_info: str | None = None
    task_instructions: str

    def __str__(self) -> str:
        lines = [
            f"Domain: {self.domain}",
            f"Reason for call:\n{textwrap.indent(self.reason_for_call, _TAB)}",
        ]
        if self.known_info is not None:
            lines.append(f"Known info:\n{textwrap.indent(self.known_info, _TAB)}")
        if self.unknown_info is not None:
            lines.append(f"Unknown info:\n{textwrap.indent(self.unknown_info, _TAB)}")
        lines.append(f"Task instructions:\n{textwrap.indent(self.task_instructions, _TAB)}")
        return "\n".join(lines)


class UserScenario(_Model):
    """Everything the user simulator is told about who it is and what it wants."""

    persona: str | None = None
    instructions: StructuredUserInstructions | str

    def __str__(self) -> str:
        lines = []
        if self.persona is not None:
            lines += ["Persona:", textwrap.indent(self.persona, _TAB)]
        lines += ["Instructions:", textwrap.indent(str(self.instructions), _TAB)]
        return "\n".join(lines)


class Description(_Model):
    purpose: str | None = None
    relevant_policies: str | None = None
    notes: str | None = None


class Action(_Model):
    """One gold tool call, by the agent (``assistant``) or the user."""

    action_id: str
    requestor: Requestor = "assistant"
    name: str
    arguments: dict[str, Any]
    info: str | None = None
    compare_args: list[str] | None = None

    def describe(self) -> str:
        """``name({...})`` with the arguments as sorted JSON, for messages and logs."""
        return f"{self.name}({json.dumps(self.arguments, sort_keys=True)})"


class EnvFunctionCall(_Model):
    """A call on the agent's (``assistant``) or the user's environment."""

    env_type: Requestor
    func_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class EnvAssertion(EnvFunctionCall):
    assert_value: bool = True
    message: str | None = None


class RewardType(StrEnum):
    """The components a task's reward can be the product of."""

    DB = "DB"
    ENV_ASSERTION = "ENV_ASSERTION"
    NL_ASSERTION = "NL_ASSERTION"
    ACTION = "ACTION"
    COMMUNICATE = "COMMUNICATE"


def _default_basis() -> list[RewardType]:
    return [RewardType.DB, RewardType.COMMUNICATE]


class EvaluationCriteria(_Model):
    actions: list[Action] | None = None
    env_assertions: list[EnvAssertion] | None = None
    communicate_info: list[str] | None = None
    nl_assertions: list[str] | None = None
    reward_basis: list[RewardType] = Field(default_factory=_default_basis)


class InitializationData(_Model):
    agent_data: dict[str, Any] | None = None
    user_data: dict[str, Any] | None = None


class InitialState(_Model):
    initialization_data: InitializationData | None = None
    initialization_actions: list[EnvFunctionCall] | None = None
    # τ²-bench messages; kept as dicts (no base task of Retail or Telecom has any).
    message_history: list[dict[str, Any]] | None = None


class Task(_Model):
    id: str
    description: Description | None = None
    user_scenario: UserScenario
    ticket: str | None = None
    initial_state: InitialState | None = None
    evaluation_criteria: EvaluationCriteria | None = None
    issues: list[dict[str, Any]] | None = None
    required_documents: list[str] | None = None
    # None: every user tool of the domain; a list: only those names (τ²-bench's ``user_tools``).
    user_tools: list[str] | None = None

    @property
    def gold_actions(self) -> list[Action]:
        criteria = self.evaluation_criteria
        return list(criteria.actions or []) if criteria is not None else []

    def raw(self) -> dict[str, Any]:
        """The task as τ²-bench's ``tasks.json`` holds it (``None`` fields left out)."""
        return self.model_dump(mode="json", exclude_none=True)


def as_task(task: Task | Mapping[str, Any]) -> Task:
    """A typed task, from a typed one (returned as is) or a raw ``tasks.json`` entry."""
    return task if isinstance(task, Task) else Task.model_validate(task)


def as_initial_state(state: InitialState | Mapping[str, Any] | None) -> InitialState | None:
    """A typed initial state (None stays None), from a typed one or a raw dict."""
    if state is None or isinstance(state, InitialState):
        return state
    return InitialState.model_validate(state)


def as_env_assertion(assertion: EnvAssertion | Mapping[str, Any]) -> EnvAssertion:
    """A typed env assertion, from a typed one or a raw dict."""
    return (
        assertion if isinstance(assertion, EnvAssertion) else EnvAssertion.model_validate(assertion)
    )
