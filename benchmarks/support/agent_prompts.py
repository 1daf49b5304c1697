"""The 50 fixed agent prompts (35 Retail, 15 Telecom) the embedded-model figures ask, built
deterministically from τ²-bench's data (``benchmarks.local_channels``, ``benchmarks.margin_probe``).
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_DATA_DIR", "Prompt", "build_prompts"]


DEFAULT_DATA_DIR = Path(os.environ.get("TAU2_DATA_DIR", "/work/shared/tau2-data"))


@dataclass(frozen=True, slots=True)
class Prompt:
    id: str
    domain: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    expected_tool: str | None


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def _retail(data_dir: Path) -> list[Prompt]:
    from evals.tau2.domains.retail.tools import agent_tool_schemas

    root = data_dir / "tau2" / "domains" / "retail"
    db = json.loads((root / "db.json").read_text())
    system = {"role": "system", "content": (root / "policy.md").read_text()}
    tools = agent_tool_schemas()
    with_orders = [db["users"][k] for k in sorted(db["users"]) if db["users"][k]["orders"]]
    users = with_orders[::20][:20]  # 20 spread-out users who have orders
    out: list[Prompt] = []

    def add(kind: str, i: int, turns: list[dict[str, Any]], expected: str | None) -> None:
        out.append(Prompt(f"retail-{kind}-{i}", "retail", [system, *turns], tools, expected))

    for i, user in enumerate(users[:8]):
        order = user["orders"][0]
        text = f"Hi! My email is {user['email']}. What's the status of my order {order}?"
        add("status-email", i, [{"role": "user", "content": text}], "find_user_id_by_email")
    for i, user in enumerate(users[8:14]):
        name, zip_code = user["name"], user["address"]["zip"]
        text = (
            f"I'm {name['first_name']} {name['last_name']}, zip code {zip_code}. I'd like to "
            "return something I bought."
        )
        add("return-name-zip", i, [{"role": "user", "content": text}], "find_user_id_by_name_zip")
    for i, user in enumerate(users[14:18]):
        text = (
            f"Please change the shipping address of my order {user['orders'][0]} to 12 Elm "
            f"Street, Springfield, IL 62704. My email is {user['email']}."
        )
        add("address-email", i, [{"role": "user", "content": text}], "find_user_id_by_email")
    for i, user in enumerate(users[:12]):  # second turn: the user is already authenticated
        order = user["orders"][-1]
        asks = [
            (f"Can you cancel order {order}? I ordered it by mistake.", "get_order_details"),
            (f"Where is my order {order}? Has it shipped?", "get_order_details"),
            ("Which payment methods do I have on file?", "get_user_details"),
        ]
        ask, expected = asks[i % 3]
        turns = [
            {"role": "user", "content": f"Hello, my email is {user['email']}. {ask}"},
            _call(f"call_{i}", "find_user_id_by_email", {"email": user["email"]}),
            {"role": "tool", "tool_call_id": f"call_{i}", "content": user["user_id"]},
        ]
        add("authenticated", i, turns, expected)
    extra = [
        ("I want to talk to a real person, transfer me now.", "transfer_to_human_agents"),
        ("What is 15% of 488.81 dollars? Use your calculator.", "calculate"),
        ("What's the status of order #W2611340?", None),  # not authenticated: ask who they are
        ("Do you sell office chairs? What options are there?", "list_all_product_types"),
        ("Can you track my package for order #W7678072? It's late.", None),
    ]
    for i, (text, expected) in enumerate(extra):
        add("misc", i, [{"role": "user", "content": text}], expected)
    return out


def _telecom(data_dir: Path) -> list[Prompt]:
    from evals.tau2.domains.telecom.agent_tools import TelecomTools

    root = data_dir / "tau2" / "domains" / "telecom"
    with (root / "db.toml").open("rb") as fh:
        db = tomllib.load(fh)
    system = {"role": "system", "content": (root / "main_policy.md").read_text()}
    tools = TelecomTools.openai_tools()
    out: list[Prompt] = []
    customers = db["customers"]
    lines = db["lines"]
    texts: list[tuple[str, str | None]] = []
    for customer in customers:
        phone = customer["phone_number"]
        texts.append(
            (f"Hi, my number is {phone}. My mobile data stopped working.", "get_customer_by_phone")
        )
        texts.append(
            (
                f"I'm {customer['full_name']}, born {customer['date_of_birth']}. "
                "I want to pay my bill.",
                "get_customer_by_name",
            )
        )
    for line in lines[:4]:
        texts.append(
            (
                "I'm travelling abroad next week, please turn on roaming for "
                f"{line['phone_number']}.",
                "get_customer_by_phone",
            )
        )
    texts.append(("Can I speak to a human agent please?", "transfer_to_human_agents"))
    texts.append(("How much data have I used this month?", None))
    texts.append(("My customer id is C1001. Show me my bills.", "get_customer_by_id"))
    for i, (text, expected) in enumerate(texts[:15]):
        out.append(
            Prompt(
                f"telecom-{i}",
                "telecom",
                [system, {"role": "user", "content": text}],
                tools,
                expected,
            )
        )
    return out


def build_prompts(data_dir: Path = DEFAULT_DATA_DIR) -> list[Prompt]:
    """35 Retail + 15 Telecom prompts, the same on every run."""
    prompts = _retail(data_dir) + _telecom(data_dir)
    if len(prompts) != 50:
        raise RuntimeError(f"expected 50 prompts, built {len(prompts)}")
    return prompts
