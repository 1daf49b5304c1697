"""Reading τ²-bench ``results.json`` files into typed episodes and arms: the study's input side.

The reader takes any file in τ²-bench v1.0.1's layout (``info``, ``tasks``, ``simulations``),
written by ``evals.tau2.run`` or by τ²-bench itself, as plain JSON: it depends on no writer's
models. Failed tool calls are always counted from the messages (``role: "tool"`` with ``error:
true``, inside ``MultiToolMessage``s too), never from a ``num_errors`` field, which τ²-bench does
not write. ``evals.analysis.summary`` turns these into the numbers.
"""

from __future__ import annotations

import gc
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TypeGuard

import orjson

__all__ = [
    "BUDGETS",
    "ENV_CHANNELS",
    "PROXY_CHANNELS",
    "REPAIR_MODES",
    "SUCCESS_TOLERANCE",
    "Arm",
    "Episode",
    "ToolCallRecord",
    "classify_error",
    "default_label",
    "load_arm",
    "read_episodes",
    "read_json",
    "success_at",
    "user_side_tools",
]

BUDGETS = tuple(range(1, 11))  # K' = 1..10
SUCCESS_TOLERANCE = 1e-6  # τ²-bench's is_successful
ENV_CHANNELS = ("hallucinated_name", "user_side_tool", "argument", "entity_not_found", "other")
PROXY_CHANNELS = (
    "unknown_tool",
    "invalid_json",
    "schema_violation",
    "tool_call_in_content",
    "empty_output",
)
REPAIR_MODES = ("off", "prompt", "promote", "reflexive", "constrained")

_TOOL_NOT_FOUND = re.compile(r"^Error: Tool '(?P<name>.*)' not found", re.DOTALL)
# Python's own TypeError texts (τ²-bench calls tools as functions), the engine's malformed-JSON
# text, and pydantic validation texts.
_ARGUMENT = re.compile(
    r"required positional argument|unexpected keyword argument|positional argument"
    r"|Invalid arguments|validation error|expected a JSON object|must be (a|an) "
    r"|Unknown ID format",
    re.IGNORECASE,
)
_ENTITY = re.compile(r"not found|does not exist|no such|unknown (user|order|item|product)", re.I)


def classify_error(
    content: str | None, user_tools: frozenset[str] = frozenset()
) -> tuple[str, str | None]:
    """(channel, invented tool name or None) for the text of one failed agent tool call. A name
    the user's side declares (``user_tools``) is not invented: the agent called the wrong side."""
    text = content or ""
    match = _TOOL_NOT_FOUND.match(text)
    if match:
        if match.group("name") in user_tools:
            return "user_side_tool", None
        return "hallucinated_name", match.group("name")
    if _ARGUMENT.search(text):
        return "argument", None
    if _ENTITY.search(text):
        return "entity_not_found", None
    return "other", None


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call and what came back. ``error`` is None when no result was recorded."""

    requestor: str
    name: str
    message_index: int  # which participant message made the call
    error: bool | None
    content: str | None
    channel: str | None  # ENV_CHANNELS value for a failed call


@dataclass(frozen=True)
class Episode:
    """One simulation, reduced to what the analysis needs."""

    task_id: str
    trial: int | None
    reward: float | None  # None: the run recorded no reward (e.g. an infrastructure error)
    termination_reason: str
    num_messages: int
    calls: tuple[ToolCallRecord, ...]
    failed_calls: int  # agent's and user's, counted from the messages
    nl_unjudged: bool  # natural-language assertions that no judge scored
    proxy_answers: tuple[Mapping[str, Any], ...]  # the recorded x-repairproxy-* per answer
    # per assistant message: (message index, proxy record or None)
    answer_proxy: tuple[tuple[int, Mapping[str, Any] | None], ...] = ()

    # The cached properties are read for every per-arm and per-pair number: once per episode.
    @cached_property
    def success(self) -> bool:
        return self.reward is not None and abs(self.reward - 1.0) <= SUCCESS_TOLERANCE

    @cached_property
    def agent_calls(self) -> tuple[ToolCallRecord, ...]:
        return tuple(c for c in self.calls if c.requestor == "assistant")

    @cached_property
    def repair_costs(self) -> tuple[float, float]:
        """(repair tokens, repair seconds) from the proxy's records (``effects.episode_costs``)."""
        from evals.analysis.effects import episode_costs  # numpy comes with it: only when asked

        return episode_costs(self.proxy_answers)

    @cached_property
    def agent_failures(self) -> Mapping[str, int]:
        """Failed agent calls by channel ("" for one without a channel), and "any": all."""
        failed = Counter(c.channel or "" for c in self.agent_calls if c.error)
        failed["any"] = sum(1 for c in self.agent_calls if c.error)
        return failed


def success_at(episode: Episode, budget: int) -> bool:
    """Success had the run's error budget been ``budget``: τ²-bench stops at ``budget`` errors."""
    return episode.success and episode.failed_calls < budget


def _flatten(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """The messages with τ²-bench's MultiToolMessages as their parts; the list itself when it
    holds none (our engine writes none: one ``role: tool`` message per call)."""
    for message in messages:
        if "tool_messages" in message:
            break
    else:
        return messages
    flat: list[Mapping[str, Any]] = []
    for message in messages:
        if message.get("role") == "tool" and isinstance(message.get("tool_messages"), list):
            flat.extend(message["tool_messages"])  # τ²-bench's MultiToolMessage
        else:
            flat.append(message)
    return flat


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    return type(value) is dict or isinstance(value, Mapping)  # parsed JSON: dict, fast


def _nl_unjudged(reward_info: Mapping[str, Any] | None, task: Mapping[str, Any] | None) -> bool:
    """True when the task's reward rests on NL assertions that no judge scored.

    Our writer says so (``nl_assertions_scored``); for a τ²-bench file, the basis names
    NL_ASSERTION, the task has assertions, and the reward carries no verdict on them.
    """
    if not reward_info:
        return False
    flag = reward_info.get("nl_assertions_scored")
    if flag is not None:
        return not flag
    criteria = (task or {}).get("evaluation_criteria") or {}
    basis = reward_info.get("reward_basis") or criteria.get("reward_basis") or []
    if "NL_ASSERTION" not in basis:
        return False
    if task is not None and not criteria.get("nl_assertions"):
        return False  # nothing to judge
    return not reward_info.get("nl_assertions")


def _episode(
    simulation: Mapping[str, Any],
    tasks: Mapping[str, Mapping[str, Any]],
    user_tools: frozenset[str] = frozenset(),
    messages: Sequence[Mapping[str, Any]] | None = None,  # the simulation's, flattened
) -> Episode:
    if messages is None:
        messages = _flatten(simulation.get("messages") or [])
    # A call's record: [id, requestor, name, message index, error, content] until its result.
    pending: list[list[Any]] = []
    records: list[list[Any]] = []
    answer_proxy: list[tuple[int, Mapping[str, Any] | None]] = []
    failed = 0
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant" or role == "user":
            if role == "assistant":
                proxy = message.get("repairproxy")
                answer_proxy.append((index, proxy if _is_mapping(proxy) else None))
            for call in message.get("tool_calls") or ():
                record = [
                    call.get("id") or "",
                    call.get("requestor") or role,
                    str(call.get("name", "")),
                    index,
                    None,
                    None,
                ]
                records.append(record)
                pending.append(record)
        elif role == "tool":
            error = bool(message.get("error", False))
            failed += error
            requestor = message.get("requestor") or "assistant"
            call_id = message.get("id") or ""
            match = None
            if call_id:
                match = next((r for r in pending if r[0] == call_id), None)
            if match is None:
                match = next((r for r in pending if r[1] == requestor), None)
            if match is None:  # a result without its call: keep it, it still failed or not
                match = ["", requestor, "", index, None, None]
                records.append(match)
            else:
                pending.remove(match)
            match[4] = error
            match[5] = message.get("content")
    calls = tuple(
        ToolCallRecord(
            requestor=requestor,
            name=name,
            message_index=message_index,
            error=error,
            content=content,
            channel=classify_error(content, user_tools)[0] if error else None,
        )
        for _, requestor, name, message_index, error, content in records
    )
    reward_info = simulation.get("reward_info")
    task_id = str(simulation.get("task_id"))
    reward = reward_info.get("reward") if _is_mapping(reward_info) else None
    trial = simulation.get("trial")
    return Episode(
        task_id=task_id,
        trial=int(trial) if trial is not None else None,
        reward=float(reward) if reward is not None else None,
        termination_reason=str(simulation.get("termination_reason", "unknown")),
        num_messages=len(simulation.get("messages") or []),
        calls=calls,
        failed_calls=failed,
        nl_unjudged=_nl_unjudged(reward_info, tasks.get(task_id)),
        proxy_answers=tuple(p for _, p in answer_proxy if p is not None),
        answer_proxy=tuple(answer_proxy),
    )


def read_episodes(data: Mapping[str, Any], folder: Path | None = None) -> list[Episode]:
    """Episodes of one parsed results file; τ²-bench's "dir" format reads ``simulations/*.json``."""
    simulations = list(data.get("simulations") or [])
    if not simulations and folder is not None and (folder / "simulations").is_dir():
        for path in sorted((folder / "simulations").glob("*.json")):
            simulations.append(read_json(path))
    tasks = {str(t.get("id")): t for t in data.get("tasks") or [] if isinstance(t, Mapping)}
    flat = [_flatten(s.get("messages") or []) for s in simulations]
    user_tools = _declared_user_tools(_domain(data)) | _user_called(flat)
    return [_episode(s, tasks, user_tools, m) for s, m in zip(simulations, flat, strict=True)]


def _declared_user_tools(domain: str | None) -> frozenset[str]:
    """The tools a domain gives the user's side (τ²-bench telecom's phone), by domain name."""
    if domain != "telecom":
        return frozenset()
    from evals.tau2.domains.telecom.user_tools import TelecomUserTools

    # The names only: building the tools' JSON schemas (pydantic) cost ~50 ms per call.
    return frozenset(TelecomUserTools.tool_names())


def user_side_tools(
    data: Mapping[str, Any], simulations: Sequence[Mapping[str, Any]] = ()
) -> frozenset[str]:
    """Names of the user's side: those its domain declares, and those the user called."""
    flat = [_flatten(s.get("messages") or []) for s in simulations]
    return _declared_user_tools(_domain(data)) | _user_called(flat)


def _domain(data: Mapping[str, Any]) -> str | None:
    info = data.get("info") or {}
    environment = info.get("environment_info") if isinstance(info, Mapping) else None
    domain = environment.get("domain_name") if isinstance(environment, Mapping) else None
    return str(domain) if domain else None


def _user_called(flat: Iterable[Sequence[Mapping[str, Any]]]) -> frozenset[str]:
    """The tool names the user's side called in these (flattened) simulations."""
    called = {
        str(call.get("name", ""))
        for messages in flat
        for message in messages
        if message.get("role") == "user"
        for call in message.get("tool_calls") or []
    }
    return frozenset(called - {""})


@dataclass(frozen=True)
class Arm:
    """One results file: one model/precision/mode under one run configuration."""

    label: str
    path: Path
    info: Mapping[str, Any]
    episodes: tuple[Episode, ...]
    provenance: Mapping[str, Any] | None = None

    @property
    def max_errors(self) -> int | None:
        value = self.info.get("max_errors")
        return int(value) if value is not None else None

    @property
    def agent_model(self) -> str | None:
        agent = self.info.get("agent_info") or {}
        llm = agent.get("llm") if isinstance(agent, Mapping) else None
        return str(llm) if llm else None

    @property
    def user_tools(self) -> frozenset[str]:
        """Names of the user's side (see ``user_side_tools``)."""
        environment = self.info.get("environment_info") or {}
        domain = environment.get("domain_name") if isinstance(environment, Mapping) else None
        called = {c.name for e in self.episodes for c in e.calls if c.requestor == "user"}
        return _declared_user_tools(str(domain) if domain else None) | frozenset(called - {""})

    @property
    def cell_and_mode(self) -> tuple[str, str] | None:
        """(cell, mode) when the file sits at ``<cell>/<mode>/results.json`` of a grid run."""
        mode = self.path.parent.name
        if mode in REPAIR_MODES and self.path.parent.parent.name:
            return self.path.parent.parent.name, mode
        return None


def default_label(path: Path, info: Mapping[str, Any]) -> str:
    """``cell/mode`` from the two folders above the file as its path was given (a symlinked
    folder keeps the name it was given by, so two links to one run stay two labels); else the
    agent model; else the stem."""
    parents = [p.name for p in path.absolute().parents[:2] if p.name]
    if len(parents) == 2:
        return f"{parents[1]}/{parents[0]}"
    agent = info.get("agent_info") or {}
    llm = agent.get("llm") if isinstance(agent, Mapping) else None
    return str(llm) if llm else path.stem


def read_json(path: Path) -> Any:
    """One JSON file, parsed by orjson (about twice as fast as ``json`` on a results file); a
    file orjson refuses (NaN, an integer past 64 bits) is read by ``json``, which takes both."""
    raw = path.read_bytes()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw.decode("utf-8"))


def load_arm(path: Path, label: str | None = None) -> Arm:
    """Read one results file and the ``provenance.json`` beside it, if there is one."""
    # A paper-grid file is ~1,000 episodes of small dicts, all alive until the episodes are
    # built: the cyclic collector's passes over them (none can be freed) took half the time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        data = read_json(path)
        info = data.get("info") or {}
        provenance_path = path.parent / "provenance.json"
        provenance = read_json(provenance_path) if provenance_path.is_file() else None
        episodes = tuple(read_episodes(data, path.parent))
    finally:
        if collecting:
            gc.enable()
    return Arm(
        label=label or default_label(path, info),
        path=path,
        info=info,
        episodes=episodes,
        provenance=provenance,
    )
