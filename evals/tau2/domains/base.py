"""The contract between the orchestrator and a τ²-bench domain (Retail, Telecom).

A domain is loaded once from the τ²-bench data folder; each episode gets a fresh
``DomainEnvironment`` whose state the agent's and the user's tool calls mutate.
Tool results and error texts follow τ²-bench v1.0.1 exactly: a failing call yields
``ToolResult(content="Error: <message>", error=True)``; an unknown tool name yields
``Error: Tool '<name>' not found.``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from evals.tau2.tasks import EnvAssertion, InitialState, Task

Requestor = Literal["assistant", "user"]


@dataclass(frozen=True)
class ToolResult:
    """What one tool call returned, as the caller will see it in a ``role: tool`` message."""

    content: str
    error: bool


class DomainEnvironment(Protocol):
    """One episode's mutable world (agent DB, and for Telecom the user's device)."""

    def agent_tools(self) -> list[dict[str, Any]]:
        """The agent's tools in OpenAI ``tools`` format (``{"type": "function", ...}``)."""
        ...

    def user_tools(self) -> list[dict[str, Any]]:
        """The simulated user's tools in OpenAI format; empty in single-control domains."""
        ...

    def call_tool(self, requestor: Requestor, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one call for ``requestor``; a bad call returns an error result, never raises."""
        ...

    def apply_initial_state(self, initial_state: InitialState | Mapping[str, Any] | None) -> None:
        """Apply a task's ``initial_state`` (initialization data and actions); raw dicts too."""
        ...

    def run_env_assertion(self, assertion: EnvAssertion | Mapping[str, Any]) -> bool:
        """Evaluate one ``evaluation_criteria.env_assertions`` entry against the current state."""
        ...

    def db_hash(self) -> str:
        """A stable hash of the full state (agent DB and, where there is one, user DB)."""
        ...


class Domain(Protocol):
    """A loaded domain: its policy, its typed tasks and an environment factory."""

    name: str
    policy: str

    def tasks(self, split: str | None = "base") -> list[Task]:
        """The tasks of ``tasks.json``, optionally filtered by ``split_tasks.json``."""
        ...

    def new_environment(self) -> DomainEnvironment:
        """A fresh environment in the database's initial state."""
        ...


def domain_dir(data_dir: Path, name: str) -> Path:
    """Where a domain's files live inside a τ²-bench ``data/`` folder."""
    return data_dir / "tau2" / "domains" / name
