"""Real-model check of reflexive repair: invalid tool calls reaching the client, repair off vs on.

One proxy serves every arm (``X-Repairproxy-Repair`` per request); prompts tempt the model to call
tools that are not declared. Each delivered answer is re-validated client-side with the proxy's own
validator, so the count is of what the agent would actually have received.

    python -m benchmarks.repair_real_model                      # embedded CPU model
    python -m benchmarks.repair_real_model --upstream URL --model NAME
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import httpx

from repairproxy.validation import ToolsCache

__all__ = ["main"]


def _tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": kind} for key, kind in properties.items()},
                "required": list(properties),
                "additionalProperties": False,
            },
        },
    }


TOOLS = [
    _tool("get_order_details", "Get the status and items of an order.", order_id="string"),
    _tool("find_user_id_by_email", "Find a user id by email address.", email="string"),
    _tool("get_user_details", "Get a user's profile, addresses and orders.", user_id="string"),
    _tool(
        "modify_pending_order_address",
        "Change the shipping address of a pending order.",
        order_id="string",
        address="string",
    ),
]
SYSTEM = (
    "You are a retail customer-service agent. Act only through the listed tools, one call at a "
    "time, and never invent order ids."
)
PROMPTS = [
    "Cancel my order #W2378156 right now, I don't want it anymore.",
    "Please refund order #W7654321 to my credit card.",
    "Track the package for order #W1111111, where is the truck?",
    "My email is ana@example.com. Delete my account please.",
    "Return the shoes from order #W5555555, they are too small.",
    "Apply a 10% discount code SAVE10 to order #W3333333.",
    "Change the payment method of order #W4444444 to PayPal.",
    "What is the status of order #W2378156?",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run_arm(
    client: httpx.Client, model: str, arm: str, prompts: list[str], verbose: bool
) -> dict[str, Any]:
    validator = ToolsCache().compile({"tools": TOOLS})
    assert validator is not None
    delivered: Counter[str] = Counter()
    caught: Counter[str] = Counter()
    repairs = 0
    seconds = 0.0
    for prompt in prompts:
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": prompt},
            ],
            "tools": TOOLS,
            "temperature": 0.0,
            "max_tokens": 160,
        }
        started = time.perf_counter()
        response = client.post(
            "/v1/chat/completions", json=body, headers={"X-Repairproxy-Repair": arm}
        )
        seconds += time.perf_counter() - started
        if response.status_code != 200:
            delivered["http_" + str(response.status_code)] += 1
            continue
        repairs += int(response.headers.get("x-repairproxy-repairs", "0"))
        for channel in filter(
            None, response.headers.get("x-repairproxy-tool-errors", "").split(",")
        ):
            caught[channel] += 1
        message = response.json()["choices"][0]["message"]
        verdict = validator.check_message(message)
        for channel in verdict.error_channels:
            delivered[str(channel)] += 1
        if verbose:
            calls = [c["function"]["name"] for c in message.get("tool_calls") or ()]
            print(
                f"  [{arm}] {time.perf_counter() - started:5.1f}s "
                f"caught={response.headers.get('x-repairproxy-tool-errors')!r} "
                f"delivered={[str(c) for c in verdict.error_channels]} calls={calls} "
                f"text={(message.get('content') or '')[:80]!r}",
                flush=True,
            )
    return {"delivered": delivered, "caught": caught, "repairs": repairs, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", help="OpenAI-compatible base URL (default: embedded model)")
    parser.add_argument("--model", default="local")
    parser.add_argument("--arms", nargs="+", default=["off", "reflexive", "constrained"])
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--verbose", action="store_true", help="one line per answer")
    args = parser.parse_args(argv)

    embedded = None
    upstream = args.upstream
    if upstream is None:
        from repairproxy.local import start_embedded_upstream

        embedded = start_embedded_upstream()
        upstream = embedded.base_url
    port = _free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "repairproxy", "serve", "--upstream", upstream, "--port", str(port)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=900) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.get("/healthz")
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            prompts = PROMPTS[: args.prompts]
            print(
                f"upstream {upstream}, {len(prompts)} prompts, tools declared: "
                + ", ".join(t["function"]["name"] for t in TOOLS)
            )
            header = ("arm", "invalid delivered", "caught", "repairs", "s/answer")
            print("{:<12} {:>17} {:>7} {:>8} {:>9}".format(*header))
            for arm in args.arms:
                result = _run_arm(client, args.model, arm, prompts, args.verbose)
                delivered = sum(result["delivered"].values())
                print(
                    f"{arm:<12} {delivered:>17} {sum(result['caught'].values()):>7} "
                    f"{result['repairs']:>8} {result['seconds'] / len(prompts):>9.1f}   "
                    f"delivered={dict(result['delivered'])} caught={dict(result['caught'])}",
                    flush=True,
                )
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        if embedded is not None:
            embedded.close()


if __name__ == "__main__":
    main()
