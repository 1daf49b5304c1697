"""The tool declarations the proxy tests share: τ²-bench retail's order tools, declared once.

Each test file used to carry its own copy of ``get_order_details``; they differ only in whether
the declaration has a description or forbids extra arguments, which ``tool`` says by its keywords.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CANCEL_ORDER",
    "EMAIL_TOOL",
    "EXCHANGE_TOOL",
    "FIND_USER_BY_EMAIL",
    "GET_ORDER",
    "MESSAGES",
    "ORDER_ID",
    "ORDER_TOOL",
    "TOOLS",
    "tool",
]


def tool(
    name: str, parameters: dict[str, Any] | None = None, *, description: str | None = None
) -> dict[str, Any]:
    """A chat-completions tool declaration (``parameters`` left out when None)."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


ORDER_ID: dict[str, Any] = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}},
    "required": ["order_id"],
}
GET_ORDER = tool("get_order_details", ORDER_ID)
CANCEL_ORDER = tool(
    "cancel_pending_order",
    {
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]},
        },
        "required": ["order_id", "reason"],
    },
)
FIND_USER_BY_EMAIL = tool(
    "find_user_id_by_email",
    {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]},
)

# The proxy route tests' default set: a strict order lookup, an exchange with an enum, an email.
ORDER_TOOL = tool(
    "get_order_details",
    {**ORDER_ID, "additionalProperties": False},
    description="Get the status and details of an order.",
)
EXCHANGE_TOOL = tool(
    "exchange_items",
    {
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "item_ids": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "reason": {"type": "string", "enum": ["size", "color", "defect"]},
        },
        "required": ["order_id", "item_ids"],
    },
    description="Exchange items of a delivered order.",
)
EMAIL_TOOL = FIND_USER_BY_EMAIL
TOOLS = [ORDER_TOOL, EXCHANGE_TOOL, EMAIL_TOOL]
MESSAGES = [
    {"role": "system", "content": "You are a retail support agent."},
    {"role": "user", "content": "Where is my order #W1?"},
]
