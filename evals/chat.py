"""Translation between our log messages and OpenAI chat-completions payloads.

Used by the LLM agent, the LLM user simulator (which sees the conversation with roles flipped) and
nothing else. Tool-call arguments that do not parse as a JSON object are kept verbatim in
``ToolCall.raw_arguments`` so the orchestrator can count and answer them, never drop them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from evals.logs import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage

__all__ = ["complete_turn", "parse_completion", "to_openai_messages"]


def _tool_call_payload(call: ToolCall) -> dict[str, Any]:
    arguments = call.raw_arguments if call.malformed else json.dumps(call.arguments)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def to_openai_messages(
    system_prompt: str, history: Sequence[Message], *, speaker: str = "assistant"
) -> list[dict[str, Any]]:
    """The chat payload as ``speaker`` ("assistant" or "user") sees the conversation.

    The speaker's own turns become ``assistant`` turns (with their tool calls); the other side's
    text turns become ``user`` turns; tool results are only those of the speaker's own calls.
    """
    payload: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}]
    for message in history:
        if isinstance(message, ToolMessage):
            payload.append(
                {"role": "tool", "tool_call_id": message.id, "content": message.content or ""}
            )
        elif isinstance(message, AssistantMessage | UserMessage):
            if message.role == speaker:
                turn: dict[str, Any] = {"role": "assistant", "content": message.content}
                if message.tool_calls:
                    turn["tool_calls"] = [_tool_call_payload(c) for c in message.tool_calls]
                payload.append(turn)
            elif message.has_text_content():
                payload.append({"role": "user", "content": message.content})
    return payload


def _parse_call(raw: Any) -> ToolCall:
    text = raw.function.arguments or ""
    try:
        arguments = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        return ToolCall(
            id=raw.id or "", name=raw.function.name or "", arguments={}, raw_arguments=text
        )
    return ToolCall(id=raw.id or "", name=raw.function.name or "", arguments=arguments)


def parse_completion(completion: Any) -> tuple[str | None, list[ToolCall] | None, dict[str, Any]]:
    """Content, tool calls and usage of an OpenAI chat completion's first choice."""
    message = completion.choices[0].message
    calls = [_parse_call(c) for c in message.tool_calls or []] or None
    usage = completion.usage.model_dump() if getattr(completion, "usage", None) else {}
    return message.content, calls, usage


async def complete_turn(
    client: Any,
    *,
    model: str,
    messages: list[dict[str, Any]],
    headers: dict[str, str],
    tools: Sequence[dict[str, Any]] | None,
    sampling: dict[str, Any],
) -> tuple[str | None, list[ToolCall] | None, dict[str, Any]]:
    """One chat completion for a participant (agent or user): ask, then parse the answer."""
    request: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "extra_headers": headers,
        **sampling,
    }
    if tools:
        request["tools"] = list(tools)
    completion = await client.chat.completions.create(**request)
    return parse_completion(completion)
