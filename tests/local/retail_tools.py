"""A few τ²-bench Retail tools, written out for the model tests (short, so prefill stays cheap)."""

from __future__ import annotations

from typing import Any

__all__ = ["RETAIL_SYSTEM", "RETAIL_TOOLS", "tool"]

RETAIL_SYSTEM = (
    "You are a customer service agent for an online retail store. Authenticate the user by email, "
    "or by name and zip code, before acting. Use the tools to look up users and orders; only "
    "cancel or modify pending orders. Make one tool call at a time."
)


def tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    k: {"type": "string", "description": v} for k, v in properties.items()
                },
                "required": list(properties),
            },
        },
    }


RETAIL_TOOLS = [
    tool(
        "find_user_id_by_email",
        "Find user id by email.",
        email="The email of the user, such as 'something@example.com'.",
    ),
    tool(
        "find_user_id_by_name_zip",
        "Find user id by first name, last name, and zip code.",
        first_name="The first name of the customer, such as 'John'.",
        last_name="The last name of the customer, such as 'Doe'.",
        zip="The zip code of the customer, such as '12345'.",
    ),
    tool(
        "get_user_details",
        "Get the details of a user, including their orders.",
        user_id="The user id.",
    ),
    tool(
        "get_order_details",
        "Get the status and details of an order.",
        order_id="The order id, such as '#W0000000'. Be careful there is a '#' symbol.",
    ),
    tool(
        "cancel_pending_order",
        "Cancel a pending order. The reason is 'no longer needed' or 'ordered by mistake'.",
        order_id="The order id, such as '#W0000000'.",
        reason="The reason for cancellation.",
    ),
]
