"""Typed episode logs in τ²-bench's ``results.json`` layout (info, tasks, simulations).

These models are the only contract between running episodes and analysing them. Field names and
shapes follow τ²-bench v1.0.1 (``tau2/data_model/{message,simulation}.py``) so its viewer and loader
open our files, and ours open its files. Our additions (error counts per requestor, malformed and
empty turn markers) are extra optional fields, which τ²-bench's pydantic models ignore on load.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

__all__ = [
    "ActionCheck",
    "AgentInfo",
    "AssistantMessage",
    "CommunicateCheck",
    "DBCheck",
    "EnvAssertionCheck",
    "EnvironmentInfo",
    "Info",
    "Message",
    "NLAssertionCheck",
    "Results",
    "ResultsWriter",
    "RewardInfo",
    "SimulationRun",
    "SystemMessage",
    "TerminationReason",
    "ToolCall",
    "ToolMessage",
    "UserInfo",
    "UserMessage",
    "count_tool_errors",
    "flatten_multi_tool",
    "load_results",
    "now",
    "resume_differences",
    "save_results",
]

Requestor = Literal["assistant", "user"]
TerminationReason = Literal[
    "user_stop", "agent_stop", "max_steps", "too_many_errors", "agent_error", "user_error"
]


def now() -> str:
    """A timestamp as τ²-bench writes them (local ISO 8601, microseconds)."""
    return datetime.now().isoformat()


class ToolCall(BaseModel):
    """One tool call. ``raw_arguments`` (ours) keeps the text when it was not a JSON object."""

    id: str = ""
    name: str
    arguments: dict[str, Any]
    requestor: Requestor = "assistant"
    raw_arguments: str | None = None

    @property
    def malformed(self) -> bool:
        """True when the model's argument text did not parse as a JSON object."""
        return self.raw_arguments is not None


class SystemMessage(BaseModel):
    role: Literal["system"] = "system"
    content: str | None = None
    turn_idx: int | None = None
    timestamp: str | None = None


class _ParticipantMessage(BaseModel):
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    turn_idx: int | None = None
    timestamp: str | None = None
    cost: float | None = None
    usage: dict[str, Any] | None = None
    raw_data: dict[str, Any] | None = None
    # Ours: the turn carried neither text nor a tool call.
    empty_turn: bool = False
    # Ours: the proxy's ``x-repairproxy-*`` response headers for this turn (see evals.tau2.chat).
    repairproxy: dict[str, Any] | None = None

    def is_tool_call(self) -> bool:
        return bool(self.tool_calls)

    def has_text_content(self) -> bool:
        return self.content is not None and self.content.strip() != ""


class AssistantMessage(_ParticipantMessage):
    role: Literal["assistant"] = "assistant"


class UserMessage(_ParticipantMessage):
    role: Literal["user"] = "user"


class ToolMessage(BaseModel):
    id: str
    role: Literal["tool"] = "tool"
    content: str | None = None
    requestor: Requestor = "assistant"
    error: bool = False
    turn_idx: int | None = None
    timestamp: str | None = None


Message = Annotated[
    SystemMessage | AssistantMessage | UserMessage | ToolMessage, Field(discriminator="role")
]


def flatten_multi_tool(messages: Iterable[Any]) -> list[Any]:
    """τ²-bench's multi-tool messages (``role: tool`` with ``tool_messages``) as their parts.

    Our engine writes one ``role: tool`` message per call; τ²-bench may group parallel results.
    Reading them as consecutive tool messages keeps every result, in order.
    """
    flat: list[Any] = []
    for message in messages:
        if isinstance(message, dict) and "tool_messages" in message:
            flat.extend(message["tool_messages"])
        else:
            flat.append(message)
    return flat


def count_tool_errors(messages: Iterable[Any]) -> dict[str, int]:
    """Failed tool calls per requestor, counted from ``role: tool`` messages with ``error: true``.

    This is the truth for any results file: τ²-bench's own files carry no ``num_errors``.
    """
    counts: dict[str, int] = {}
    for result in messages:
        if isinstance(result, ToolMessage) and result.error:
            counts[result.requestor] = counts.get(result.requestor, 0) + 1
    return counts


class DBCheck(BaseModel):
    db_match: bool
    db_reward: float


class ActionCheck(BaseModel):
    action: dict[str, Any]
    action_match: bool
    action_reward: float


class EnvAssertionCheck(BaseModel):
    env_assertion: dict[str, Any]
    met: bool
    reward: float


class CommunicateCheck(BaseModel):
    info: str
    met: bool
    justification: str


class NLAssertionCheck(BaseModel):
    nl_assertion: str
    met: bool
    justification: str


class RewardInfo(BaseModel):
    reward: float
    db_check: DBCheck | None = None
    env_assertions: list[EnvAssertionCheck] | None = None
    action_checks: list[ActionCheck] | None = None
    nl_assertions: list[NLAssertionCheck] | None = None
    communicate_checks: list[CommunicateCheck] | None = None
    reward_basis: list[str] | None = None
    reward_breakdown: dict[str, float] | None = None
    info: dict[str, Any] | None = None
    # Ours: False when the task's basis holds NL_ASSERTION but no judge model scored it.
    nl_assertions_scored: bool | None = None


class SimulationRun(BaseModel):
    id: str
    task_id: str
    timestamp: str = Field(default_factory=now)
    start_time: str
    end_time: str
    duration: float
    # A plain string so τ²-bench files with newer reasons (e.g. "timeout") still load.
    termination_reason: str
    agent_cost: float | None = None
    user_cost: float | None = None
    reward_info: RewardInfo | None = None
    messages: list[Message]
    trial: int | None = None
    seed: int | None = None
    # Ours: the error budget's view of the episode.
    num_errors: int = 0
    errors_by_requestor: dict[str, int] = Field(default_factory=dict)
    malformed_tool_calls: dict[str, int] = Field(default_factory=dict)
    empty_turns: dict[str, int] = Field(default_factory=dict)
    steps: int = 0
    error_detail: str | None = None
    episode_id: str | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _flatten(cls, value: Any) -> Any:
        return flatten_multi_tool(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _errors_from_messages(self) -> SimulationRun:
        # A file that does not carry the counts (τ²-bench's) gets them from its messages; a 0
        # read from a missing field would make every real run look error-free.
        if "num_errors" not in self.model_fields_set or (
            "errors_by_requestor" not in self.model_fields_set
        ):
            counts = count_tool_errors(self.messages)
            self.errors_by_requestor = counts
            self.num_errors = sum(counts.values())
        return self


class UserInfo(BaseModel):
    implementation: str
    llm: str | None = None
    llm_args: dict[str, Any] | None = None
    global_simulation_guidelines: str | None = None


class AgentInfo(BaseModel):
    implementation: str
    llm: str | None = None
    llm_args: dict[str, Any] | None = None


class EnvironmentInfo(BaseModel):
    domain_name: str
    policy: str
    tool_defs: dict[str, Any] | None = None


class Info(BaseModel):
    git_commit: str = ""
    num_trials: int
    max_steps: int
    max_errors: int
    user_info: UserInfo
    agent_info: AgentInfo
    environment_info: EnvironmentInfo
    seed: int | None = None
    # Ours: whether NL assertions are scored (a judge model is configured), and by which model.
    nl_assertions_scored: bool | None = None
    judge_info: dict[str, Any] | None = None
    # Ours: named deviations from τ²-bench v1.0.1 and whether each was on (evals.tau2.domains).
    domain_options: dict[str, bool] | None = None


class Results(BaseModel):
    timestamp: str | None = Field(default_factory=now)
    info: Info
    tasks: list[dict[str, Any]]
    simulations: list[SimulationRun]


def _identity(info: Info) -> dict[str, Any]:
    """What a resumed run must share with the run that wrote the file, named for messages."""
    judge = info.judge_info or {}
    return {
        "domain": info.environment_info.domain_name,
        "trials": info.num_trials,
        "max errors (K)": info.max_errors,
        "max steps": info.max_steps,
        "seed": info.seed,
        "agent": info.agent_info.implementation,
        "agent model": info.agent_info.llm,
        "user": info.user_info.implementation,
        "user model": info.user_info.llm,
        "judge model": judge.get("llm"),
        "domain options": sorted(k for k, on in (info.domain_options or {}).items() if on),
    }


def resume_differences(previous: Info, current: Info) -> list[str]:
    """What differs between the run that wrote a results file and one that would resume into
    it, each as ``what: old -> new``; empty when resuming is safe."""
    before, now = _identity(previous), _identity(current)
    return [f"{key}: {before[key]!r} -> {now[key]!r}" for key in before if before[key] != now[key]]


def load_results(path: Path) -> Results:
    """Read a results file (ours or τ²-bench's)."""
    return Results.model_validate_json(path.read_bytes())


def _atomic_write(path: Path, text: str) -> None:
    """A crash leaves either the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp makes it owner-only; results are meant to be shared
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def save_results(path: Path, results: Results) -> None:
    """Write a whole results file atomically."""
    _atomic_write(path, results.model_dump_json())


class ResultsWriter:
    """Keeps a results file current as episodes finish, rewriting it atomically after each one.

    Each episode is serialised once; a rewrite only concatenates, so a long run's cost stays in
    the disk write rather than growing with re-serialising every earlier episode.
    """

    def __init__(self, path: Path, results: Results) -> None:
        self.path = path
        self.results = results
        self._head = {
            "timestamp": json.dumps(results.timestamp),
            "info": results.info.model_dump_json(),
            "tasks": json.dumps(results.tasks),
        }
        self._simulations = [s.model_dump_json() for s in results.simulations]

    def append(self, simulation: SimulationRun) -> None:
        self.results.simulations.append(simulation)
        self._simulations.append(simulation.model_dump_json())
        self.flush()

    def flush(self) -> None:
        head = ", ".join(f'"{key}": {value}' for key, value in self._head.items())
        _atomic_write(self.path, f'{{{head}, "simulations": [{", ".join(self._simulations)}]}}')
