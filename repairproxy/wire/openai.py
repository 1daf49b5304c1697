"""The OpenAI wire shapes the proxy reads, typed once (zero-cost TypedDicts), and the two helpers
every module needs: the first message of a completion, and the text of a message.

Only the fields the proxy looks at are declared; everything else passes through untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

__all__ = [
    "ChatCompletion",
    "ChatMessage",
    "ChatRequestBody",
    "Choice",
    "FunctionCall",
    "ToolCall",
    "content_text",
    "first_message",
    "message_text",
]


class FunctionCall(TypedDict, total=False):
    name: str
    arguments: str


class ToolCall(TypedDict, total=False):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(TypedDict, total=False):
    role: str
    content: str | list[dict[str, Any]] | None
    tool_calls: list[ToolCall]
    function_call: FunctionCall
    tool_call_id: str
    name: str
    refusal: str | None


class Choice(TypedDict, total=False):
    index: int
    message: ChatMessage
    finish_reason: str | None
    logprobs: NotRequired[dict[str, Any] | None]


class ChatCompletion(TypedDict, total=False):
    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]
    usage: dict[str, Any] | None


class ChatRequestBody(TypedDict, total=False):
    model: str
    messages: list[ChatMessage]
    tools: list[dict[str, Any]]
    functions: list[dict[str, Any]]
    tool_choice: Any
    stream: bool
    stream_options: dict[str, Any]
    n: int


def first_message(completion: Mapping[str, Any]) -> dict[str, Any] | None:
    """``choices[0].message`` when the completion has one (the one agents act on), else None."""
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a message: a string content, or its text parts joined."""
    return content_text(message.get("content"))


def content_text(content: Any) -> str:
    """The text of a chat ``content``: the string, or its text parts joined; "" otherwise."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""
