"""Build ``results.json`` content the way τ²-bench v1.0.1 writes it, for the analysis tests.

Field names and defaults follow ``src/tau2/data_model/{message,simulation}.py`` at tag v1.0.1 of
sierra-research/tau2-bench (``Results.model_dump``): no ``num_errors`` anywhere; several tool
results of one turn wrapped in a ``MultiToolMessage`` (``role: "tool"``, ``tool_messages``);
errors as ``role: "tool"`` messages with ``error: true`` and ``Error: <exception>`` content; the
voice-era fields present and null. Our engine's additions (the ``repairproxy`` record on assistant
messages) are opt-in per message.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Call",
    "Turn",
    "assistant",
    "episode",
    "multi_tool",
    "not_found",
    "results",
    "tool_message",
    "write",
]

_TIME = "2026-01-01T00:00:00.000000"
_ids = itertools.count()


def not_found(name: str) -> str:
    """τ²-bench's text for an undeclared tool (``ToolKitBase.use_tool`` via ``get_response``)."""
    return f"Error: Tool '{name}' not found."


def _participant(role: str, content: str | None, calls: list[dict[str, Any]] | None) -> dict:
    return {
        "role": role,
        "content": content,
        "tool_calls": calls,
        "is_audio": False,
        "turn_idx": None,
        "timestamp": _TIME,
        "cost": 0.0 if role == "assistant" else None,
        "usage": {"completion_tokens": 12, "prompt_tokens": 300} if role == "assistant" else None,
        "raw_data": None,
        "generation_time_seconds": None,
        "context_truncation": None,
        "audio_format": None,
        "audio_path": None,
        "audio_script_gold": None,
        "speech_effects": None,
        "source_effects": None,
        "channel_effects": None,
        "turn_taking_action": None,
        "utterance_ids": None,
        "chunk_id": None,
        "is_final_chunk": True,
        "source": None,
        "contains_speech": True,
    }


def assistant(
    content: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    proxy: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    message = _participant("assistant", content, calls)
    if proxy is not None:
        message["repairproxy"] = dict(proxy)
    return message


def user(content: str | None = None, calls: list[dict[str, Any]] | None = None) -> dict:
    return _participant("user", content, calls)


def tool_call(name: str, arguments: dict[str, Any], requestor: str = "assistant") -> dict:
    call_id = f"call_{next(_ids)}"
    return {"id": call_id, "name": name, "arguments": arguments, "requestor": requestor}


def tool_message(call: Mapping[str, Any], content: str, error: bool) -> dict[str, Any]:
    return {
        "id": call["id"],
        "role": "tool",
        "content": content,
        "requestor": call["requestor"],
        "error": error,
        "turn_idx": None,
        "timestamp": _TIME,
    }


def multi_tool(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "tool", "tool_messages": list(messages)}


@dataclass(frozen=True)
class Call:
    """One tool call and its result: ``error`` is the ``Error: ...`` text, or None for success."""

    name: str
    error: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """One participant turn that makes tool calls; ``proxy`` is the recorded x-repairproxy-*."""

    calls: tuple[Call, ...]
    requestor: str = "assistant"
    proxy: Mapping[str, Any] | None = None


def episode(
    task_id: str,
    trial: int,
    turns: Sequence[Turn],
    reward: float | None = 1.0,
    termination: str = "user_stop",
    reward_basis: Sequence[str] = ("DB", "COMMUNICATE"),
    nl_assertions: list[dict[str, Any]] | None = None,
    final_proxy: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``SimulationRun`` dump: greeting, the turns with their results, a closing exchange."""
    messages: list[dict[str, Any]] = [
        assistant("Hi! How can I help you today?"),
        user("I want to change my order."),
    ]
    for turn in turns:
        calls = [tool_call(c.name, c.arguments, turn.requestor) for c in turn.calls]
        if turn.requestor == "assistant":
            messages.append(assistant(None, calls, turn.proxy))
        else:
            messages.append(user(None, calls))
        results = [
            tool_message(call, c.error or '{"status": "ok"}', c.error is not None)
            for call, c in zip(calls, turn.calls, strict=True)
        ]
        messages.extend(results if len(results) == 1 else [multi_tool(results)])
    messages.append(assistant("Done. Anything else?", None, final_proxy))
    messages.append(user("###STOP###"))
    for index, message in enumerate(messages):
        if "tool_messages" in message:
            for inner in message["tool_messages"]:
                inner["turn_idx"] = index
        else:
            message["turn_idx"] = index
    reward_info = None
    if reward is not None:
        reward_info = {
            "reward": reward,
            "db_check": {"db_match": reward == 1.0, "db_reward": reward},
            "env_assertions": None,
            "action_checks": None,
            "nl_assertions": nl_assertions,
            "communicate_checks": [],
            "reward_basis": list(reward_basis),
            "reward_breakdown": {"DB": reward},
            "info": None,
        }
    return {
        "id": f"sim-{task_id}-{trial}-{next(_ids)}",
        "task_id": task_id,
        "timestamp": _TIME,
        "start_time": _TIME,
        "end_time": _TIME,
        "duration": 12.5,
        "termination_reason": termination,
        "agent_cost": 0.0,
        "user_cost": 0.0,
        "reward_info": reward_info,
        "messages": messages,
        "ticks": None,
        "trial": trial,
        "seed": 300 + trial,
        "mode": "half_duplex",
        "speech_environment": None,
        "review": None,
        "user_only_review": None,
        "info": None,
        "auth_classification": None,
        "hallucination_retries_used": 0,
        "hallucination_check": None,
        "provider_session_id": None,
        "policy": None,
        "effect_timeline": None,
    }


def results(
    simulations: Sequence[dict[str, Any]],
    agent_model: str = "openai/qwen2.5-1.5b",
    max_errors: int = 10,
    domain: str = "retail",
) -> dict[str, Any]:
    """A ``Results`` dump around the given simulations."""
    task_ids = sorted({s["task_id"] for s in simulations})
    return {
        "timestamp": _TIME,
        "info": {
            "git_commit": "0123abc",
            "num_trials": 1 + max(s["trial"] for s in simulations) if simulations else 1,
            "max_steps": 200,
            "max_errors": max_errors,
            "user_info": {
                "implementation": "user_simulator",
                "llm": "openai/user-model",
                "llm_args": {"temperature": 0.0},
                "global_simulation_guidelines": "guidelines",
                "voice_settings": None,
                "persona_config": None,
            },
            "agent_info": {
                "implementation": "llm_agent",
                "llm": agent_model,
                "llm_args": {"temperature": 0.0},
                "voice_settings": None,
            },
            "environment_info": {"domain_name": domain, "policy": "policy", "tool_defs": None},
            "seed": 300,
            "text_streaming_config": None,
            "speech_complexity": None,
            "audio_native_config": None,
            "retrieval_config": None,
            "retrieval_config_kwargs": None,
        },
        "tasks": [
            {
                "id": task_id,
                "description": None,
                "user_scenario": {"persona": None, "instructions": "change an order"},
                "initial_state": None,
                "evaluation_criteria": {"actions": [], "reward_basis": ["DB", "COMMUNICATE"]},
            }
            for task_id in task_ids
        ],
        "simulations": list(simulations),
        "simulation_index": None,
    }


def write(path: Path, content: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=1), encoding="utf-8")
    return path
