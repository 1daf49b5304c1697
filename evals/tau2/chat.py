"""Translation between our log messages and OpenAI chat-completions payloads.

Used by the LLM agent, the LLM user simulator (which sees the conversation with roles flipped) and
nothing else. Tool-call arguments that do not parse as a JSON object are kept verbatim in
``ToolCall.raw_arguments`` so the orchestrator can count and answer them, never drop them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from evals.tau2.logs import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage

__all__ = [
    "PROXY_HEADER_PREFIX",
    "complete_turn",
    "parse_completion",
    "proxy_report",
    "to_openai_messages",
]

PROXY_HEADER_PREFIX = "x-repairproxy-"
_LIST_FIELDS = frozenset(
    {"tool_errors", "first_tool_errors", "delivered_tool_errors", "unknown_tools"}
)
_INT = re.compile(r"-?\d+")
_FLOAT = re.compile(r"-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?")


def _tool_call_payload(call: ToolCall) -> dict[str, Any]:
    # τ²-bench's shape on the wire (litellm passes its extra top-level ``name`` through).
    arguments = call.raw_arguments if call.malformed else json.dumps(call.arguments)
    return {
        "id": call.id,
        "name": call.name,
        "function": {"name": call.name, "arguments": arguments},
        "type": "function",
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
                {"role": "tool", "content": message.content or "", "tool_call_id": message.id}
            )
        elif isinstance(message, AssistantMessage | UserMessage):
            if message.role == speaker:
                # As τ²-bench's requests reach the wire: a null content is left out.
                turn: dict[str, Any] = {"role": "assistant"}
                if message.content is not None:
                    turn["content"] = message.content
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


def _header_value(key: str, value: str) -> Any:
    if key in _LIST_FIELDS:
        return [item.strip() for item in value.split(",") if item.strip()]
    text = value.strip()
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return value


def proxy_report(headers: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """The proxy's ``x-repairproxy-*`` response headers as the ``repairproxy`` message field.

    Key: the header name without the prefix, ``-`` as ``_``. Numbers are parsed; ``tool_errors``
    and ``unknown_tools`` are lists of strings (empty when the header is); the rest stay strings.
    """
    report: dict[str, Any] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered.startswith(PROXY_HEADER_PREFIX):
            key = lowered[len(PROXY_HEADER_PREFIX) :].replace("-", "_")
            report[key] = _header_value(key, value)
    return report


async def complete_turn(
    client: Any,
    *,
    model: str,
    messages: list[dict[str, Any]],
    headers: dict[str, str],
    tools: Sequence[dict[str, Any]] | None,
    sampling: dict[str, Any],
) -> tuple[str | None, list[ToolCall] | None, dict[str, Any], dict[str, Any]]:
    """One chat completion for a participant (agent or user): ask, then parse the answer.

    The request is what τ²-bench's ``generate`` sends (``tool_choice: "auto"`` whenever tools are
    declared). Returns content, tool calls, usage and the proxy's report (empty without a proxy).
    """
    request: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "extra_headers": headers,
        **sampling,
    }
    if tools:
        request["tools"] = list(tools)
        request["tool_choice"] = "auto"
    raw = await client.chat.completions.with_raw_response.create(**request)
    content, calls, usage = parse_completion(raw.parse())
    return content, calls, usage, proxy_report(raw.headers.items())
